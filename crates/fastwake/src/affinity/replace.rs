//! Lazy re-placement at wait time.

use super::Placement;
use crate::{Fail, Result};
use std::str::FromStr;

/// What to do when a waiter runs on another CPU than its CQ's signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplacePolicy {
    /// Only record the mismatch.
    #[default]
    Report,
    /// Pin the waiting thread to the signal's CPU.
    Thread,
    /// Move the vector's IRQ to the waiter's CPU (`/proc/irq/N/smp_affinity_list`;
    /// root only; moves every CQ on that vector). Must be chosen explicitly;
    /// if the kernel refuses, the refusal is reported and nothing moves.
    Irq,
}

impl FromStr for ReplacePolicy {
    type Err = Fail;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "report" | "off" | "none" => Ok(ReplacePolicy::Report),
            "thread" => Ok(ReplacePolicy::Thread),
            "irq" => Ok(ReplacePolicy::Irq),
            o => Err(Fail::invalid(format!(
                "unknown re-placement policy '{o}': expected report, thread or irq"
            ))),
        }
    }
}

/// One re-placement (or a refused/recorded one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// Where the waiter was found.
    pub waiter_cpu: u32,
    /// Where the signal was expected.
    pub signal_cpu: u32,
    /// What was done: `"recorded"`, `"thread-moved"`, `"irq-moved"`, or
    /// `"refused: <why>"`.
    pub action: String,
}

impl std::fmt::Display for Replacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "waiter on cpu {} but signal on cpu {}: {}",
            self.waiter_cpu, self.signal_cpu, self.action
        )
    }
}

/// Per-CQ re-placement state. [`Replacer::check`] costs one `sched_getcpu`
/// (rseq, no syscall) when nothing changed.
#[derive(Debug, Clone)]
pub struct Replacer {
    policy: ReplacePolicy,
    placement: Placement,
    last_seen: Option<u32>,
    log: Vec<Replacement>,
    /// Events beyond this many are counted but not kept.
    max_log: usize,
    dropped: u64,
}

impl Replacer {
    /// Start from a CQ's creation-time placement.
    pub fn new(placement: Placement, policy: ReplacePolicy) -> Self {
        Replacer {
            policy,
            placement,
            last_seen: None,
            log: Vec::new(),
            max_log: 64,
            dropped: 0,
        }
    }

    /// The current placement.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Re-placements so far (the first 64) and how many more were dropped.
    pub fn log(&self) -> (&[Replacement], u64) {
        (&self.log, self.dropped)
    }

    /// Called on the way to sleep. Returns the re-placement it made, if any.
    pub fn check(&mut self) -> Option<&Replacement> {
        let now = crate::cpu::current()?;
        if self.last_seen == Some(now) {
            return None;
        }
        self.last_seen = Some(now);
        let signal = self.placement.cpu?;
        if signal == now {
            return None;
        }
        let action = match self.policy {
            ReplacePolicy::Report => "recorded".to_string(),
            ReplacePolicy::Thread => match crate::cpu::pin(signal) {
                Ok(()) => {
                    self.last_seen = Some(signal);
                    "thread-moved".into()
                }
                Err(e) => format!("refused: {e}"),
            },
            ReplacePolicy::Irq => match self.placement.irq {
                None => "refused: the vector has no IRQ to move".into(),
                Some(irq) => match move_irq(irq, now) {
                    Ok(()) => {
                        self.placement.cpu = Some(now);
                        "irq-moved".into()
                    }
                    Err(e) => format!("refused: {e}"),
                },
            },
        };
        let r = Replacement {
            waiter_cpu: now,
            signal_cpu: signal,
            action,
        };
        if self.log.len() < self.max_log {
            self.log.push(r);
            self.log.last()
        } else {
            self.dropped += 1;
            None
        }
    }
}

/// Point IRQ `irq` at `cpu`. Needs root (CAP_SYS_ADMIN) and an IRQ the
/// kernel lets user space steer (managed IRQs refuse with EIO).
pub fn move_irq(irq: u32, cpu: u32) -> Result<()> {
    let path = format!("/proc/irq/{irq}/smp_affinity_list");
    std::fs::write(&path, format!("{cpu}\n")).map_err(|e| {
        Fail::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("write {path}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::How;

    fn placement(cpu: u32, irq: Option<u32>) -> Placement {
        Placement {
            vector: 0,
            irq,
            cpu: Some(cpu),
            wanted_cpu: Some(cpu),
            how: How::IrqAffinity,
        }
    }

    fn two_cpus() -> bool {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if n < 2 {
            eprintln!("SKIPPED re-placement test: needs 2 CPUs");
        }
        n >= 2
    }

    #[test]
    fn thread_policy_moves_the_waiter_to_the_signal_cpu() {
        if !two_cpus() {
            return;
        }
        std::thread::spawn(|| {
            crate::cpu::pin(0).unwrap();
            let mut r = Replacer::new(placement(1, Some(90)), ReplacePolicy::Thread);
            let rep = r.check().cloned().expect("a re-placement");
            assert_eq!((rep.waiter_cpu, rep.signal_cpu), (0, 1));
            assert_eq!(rep.action, "thread-moved");
            // Where the thread runs now (the kernel migrates it at once).
            assert_eq!(crate::cpu::current(), Some(1));
            assert!(r.check().is_none(), "nothing to do the second time");
            assert_eq!(r.log().0.len(), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn report_policy_only_records_and_irq_policy_reports_refusals() {
        if !two_cpus() {
            return;
        }
        std::thread::spawn(|| {
            crate::cpu::pin(0).unwrap();
            let mut r = Replacer::new(placement(1, Some(90)), ReplacePolicy::Report);
            assert_eq!(r.check().unwrap().action, "recorded");
            assert_eq!(crate::cpu::current(), Some(0));
            // An IRQ that does not exist: the kernel refuses, nothing moves,
            // the refusal is reported in one line.
            let mut r = Replacer::new(placement(1, Some(999_999)), ReplacePolicy::Irq);
            let a = r.check().unwrap().action.clone();
            assert!(a.starts_with("refused: "), "{a}");
            assert!(!a.contains('\n'));
            assert_eq!(r.placement().cpu, Some(1));
            // No IRQ behind the vector (rxe): nothing to move.
            let mut r = Replacer::new(placement(1, None), ReplacePolicy::Irq);
            assert!(r.check().unwrap().action.contains("no IRQ"));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn policy_names() {
        assert_eq!(
            "thread".parse::<ReplacePolicy>().unwrap(),
            ReplacePolicy::Thread
        );
        assert_eq!("irq".parse::<ReplacePolicy>().unwrap(), ReplacePolicy::Irq);
        assert_eq!(
            "report".parse::<ReplacePolicy>().unwrap(),
            ReplacePolicy::Report
        );
        assert!("move".parse::<ReplacePolicy>().is_err());
    }
}
