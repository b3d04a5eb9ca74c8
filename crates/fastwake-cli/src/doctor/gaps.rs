//! The third measurement: how often, and for how long, a CPU is taken
//! away from a thread that wants it without pause. A thread pinned to the
//! CPU reads the clock in a tight loop; a gap between two reads is time
//! the thread did not run: an interrupt, a kernel thread, or (in a guest)
//! the host running something else on the vCPU's core. Nothing in user
//! space can shorten such a gap, and it delays every request in flight on
//! that CPU at once, so it is what sets a four-nines tail once the
//! program's own tail is shorter (`fastwake bench lanes` reads 16 requests
//! in flight on one CPU: one 500 µs gap is 16 reads 500 µs late).
//!
//! Each CPU is watched alone (the others idle), then all of them at once:
//! a guest's vCPUs may lose their cores far more often when every one of
//! them is busy, as a benchmark that loads all CPUs keeps them.
//!
//! While all of them are watched, every other thread that runs takes a
//! watcher's CPU, so the run time the other threads gained meanwhile
//! (`/proc/PID/task/TID/schedstat`, ns) names what made the gaps, beside
//! the steal the hypervisor reports (/proc/stat). On this project's VMs
//! the gaps were mostly the machine's own threads (`kdamond.0`, DAMON's
//! monitor; the VM's management agent; kernel workers), with little or no
//! steal: "the host takes the vCPU" alone was the wrong answer.

use super::finding::*;
use crate::others::{RunTimes, ran, run_times};
use serde::Serialize;
use std::time::{Duration, Instant};

/// CPUs watched at most (the first online ones), one after the other.
const MAX_CPUS: usize = 4;
/// Gaps shorter than this are the loop's own noise (a clock read, a tick).
const GAP: Duration = Duration::from_micros(50);
/// A gap this long or longer is one a four-nines tail feels.
const LONG: Duration = Duration::from_micros(200);

/// One CPU watched.
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct CpuGaps {
    pub cpu: u32,
    /// Time watched (ms).
    pub watched_ms: f64,
    /// Gaps of at least 50 µs, 200 µs and 1 ms.
    pub over_50us: u64,
    pub over_200us: u64,
    pub over_1ms: u64,
    /// The longest gap (µs).
    pub max_us: f64,
    /// Time lost in gaps of at least 50 µs, per second watched (µs).
    pub lost_us_per_s: f64,
}

/// A thread of another process (or of the kernel) that ran while every
/// CPU was watched.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Runner {
    pub comm: String,
    pub pid: i32,
    pub tid: i32,
    /// Its run time while watched (ms).
    pub ms: f64,
}

/// What took the CPUs while every one of them was watched at once.
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct Taken {
    /// Run time of every other thread, together (ms).
    pub others_ms: f64,
    /// The ones that ran longest (at most [`TOP`]), longest first.
    pub top: Vec<Runner>,
    /// Steal the hypervisor reported for the watched CPUs (ms, in
    /// /proc/stat's 10 ms ticks; `null` where unreadable).
    pub steal_ms: Option<f64>,
}

/// Other threads named at most.
pub const TOP: usize = 5;

/// The gaps measurement.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Gaps {
    /// Each CPU watched alone.
    pub cpus: Vec<CpuGaps>,
    /// The same CPUs watched all at once (empty with one CPU).
    pub together: Vec<CpuGaps>,
    /// What ran instead while they were watched together (`null` unless
    /// every online CPU was watched and /proc could be read).
    pub taken: Option<Taken>,
    /// Why there are no figures (`null` when there are).
    pub error: Option<String>,
}

/// Steal of `cpus` so far (ns).
fn steal_ns(cpus: &[u32]) -> Option<u64> {
    let t = fastwake::adaptive::pressure::cpu_times()?;
    Some(
        cpus.iter()
            .filter_map(|&c| t.get(c as usize))
            .map(|t| t.steal_ns)
            .sum(),
    )
}

/// [`Taken`] from the snapshots around a watch of `cpus`.
fn taken(before: &RunTimes, after: &RunTimes, steal: (Option<u64>, Option<u64>)) -> Taken {
    let (v, total) = ran(before, after);
    let ms = |ns: u64| ns as f64 / 1e6;
    Taken {
        others_ms: ms(total),
        top: v
            .into_iter()
            .take(TOP)
            .map(|((pid, tid), ns)| Runner {
                comm: std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into()),
                pid,
                tid,
                ms: ms(ns),
            })
            .collect(),
        steal_ms: match steal {
            (Some(a), Some(b)) => Some(ms(b.saturating_sub(a))),
            _ => None,
        },
    }
}

/// Watch `cpu` alone for `watch`.
fn watch(cpu: u32, watch: Duration) -> Result<CpuGaps, String> {
    std::thread::spawn(move || watch_here(cpu, watch, None))
        .join()
        .map_err(|_| "watching thread panicked".to_string())?
}

/// Watch `cpus` at once, one thread each, started together.
fn watch_together(cpus: &[u32], watch: Duration) -> Result<Vec<CpuGaps>, String> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(cpus.len()));
    let threads: Vec<_> = cpus
        .iter()
        .map(|&c| {
            let start = start.clone();
            std::thread::spawn(move || watch_here(c, watch, Some(&start)))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| "watching thread panicked".to_string())?
        })
        .collect()
}

/// The calling thread pins itself to `cpu` and, once every watcher is
/// pinned (`start`), counts the gaps between its consecutive clock reads
/// for `watch`.
fn watch_here(
    cpu: u32,
    watch: Duration,
    start: Option<&std::sync::Barrier>,
) -> Result<CpuGaps, String> {
    let pinned = fastwake::cpu::pin(cpu).map_err(|e| format!("pin to CPU {cpu}: {e}"));
    if let Some(b) = start {
        // Every watcher reaches the barrier, pinned or not.
        b.wait();
    }
    pinned?;
    let mut g = CpuGaps {
        cpu,
        ..CpuGaps::default()
    };
    let start = Instant::now();
    let mut last = start;
    let mut lost = Duration::ZERO;
    loop {
        let now = Instant::now();
        let gap = now - last;
        last = now;
        if gap >= GAP {
            g.over_50us += 1;
            g.over_200us += u64::from(gap >= LONG);
            g.over_1ms += u64::from(gap >= Duration::from_millis(1));
            lost += gap;
            g.max_us = g.max_us.max(gap.as_secs_f64() * 1e6);
        }
        if now - start >= watch {
            break;
        }
    }
    let secs = (last - start).as_secs_f64();
    g.watched_ms = secs * 1e3;
    g.lost_us_per_s = lost.as_secs_f64() * 1e6 / secs.max(1e-9);
    Ok(g)
}

fn describe(cpus: &[CpuGaps]) -> String {
    cpus.iter()
        .map(|c| {
            format!(
                "CPU {}: {} gaps of 50 µs or more, {} of 200 µs or more, longest {:.0} µs",
                c.cpu, c.over_50us, c.over_200us, c.max_us
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What ran while every CPU was watched, as the finding says it.
fn describe_taken(t: &Taken) -> String {
    let top = t
        .top
        .iter()
        .map(|r| format!("{} {:.1} ms", r.comm, r.ms))
        .collect::<Vec<_>>()
        .join(", ");
    let steal = t.steal_ms.map_or("no steal figure".to_string(), |s| {
        format!("the hypervisor reported {s:.0} ms of steal")
    });
    if t.top.is_empty() {
        format!("meanwhile no other thread ran; {steal}")
    } else {
        format!(
            "meanwhile other threads ran {:.1} ms ({top}); {steal}",
            t.others_ms
        )
    }
}

/// The finding for what was watched, alone and together.
pub(super) fn judge_gaps(
    alone: &[CpuGaps],
    together: &[CpuGaps],
    taken: Option<&Taken>,
) -> Finding {
    let long: u64 = alone.iter().chain(together).map(|c| c.over_200us).sum();
    let ms = alone.first().map_or(0.0, |c| c.watched_ms);
    let mut detail = format!(
        "a thread that never blocks lost its CPU, each watched {ms:.0} ms alone: {}",
        describe(alone)
    );
    if !together.is_empty() {
        detail.push_str(&format!(
            "; all at once (every one busy): {}",
            describe(together)
        ));
    }
    if let Some(t) = taken {
        detail.push_str(&format!(" ({})", describe_taken(t)));
    }
    detail.push_str(
        "; every request in flight on a CPU waits out such a gap, so a tail beyond them (a four-nines latency) is set by what takes the CPU, not by the program",
    );
    if long > 0 {
        check::CPU_GAPS.found(Level::Warn, detail).advice(
            "gaps of 200 µs or more come from other threads on the CPU (named above when every CPU was watched: a kernel thread, another program), from interrupts, or in a guest from the host (the steal figure); move the others off the program's CPUs (cpusets, isolated CPUs), compare four-nines tails within one run and over several, and on a guest ask for dedicated cores",
        )
    } else {
        check::CPU_GAPS.found(Level::Ok, detail)
    }
}

/// Watch each CPU alone for `watch`, then all of them at once as long.
pub(super) fn cpu_gaps(watch_for: Duration) -> (Gaps, Finding) {
    let mut g = Gaps::default();
    let mut last_error = None;
    // CPUs outside this process's affinity mask cannot be watched: skip.
    for c in super::host::online_cpus() {
        if g.cpus.len() == MAX_CPUS {
            break;
        }
        match watch(c, watch_for) {
            Ok(w) => g.cpus.push(w),
            Err(e) => last_error = Some(e),
        }
    }
    if g.cpus.is_empty() {
        let e = last_error.unwrap_or_else(|| "no online CPU".to_string());
        g.error = Some(e.clone());
        let f = check::CPU_GAPS.found(Level::Info, format!("not measured: {e}"));
        return (g, f);
    }
    if g.cpus.len() > 1 {
        let cpus: Vec<u32> = g.cpus.iter().map(|c| c.cpu).collect();
        // Others' run time names what took the CPUs only when none was
        // left unwatched for them to run on.
        let all = cpus.len() == super::host::online_cpus().len();
        let before = all.then(|| (run_times(), steal_ns(&cpus)));
        match watch_together(&cpus, watch_for) {
            Ok(t) => {
                g.together = t;
                if let Some((b, s0)) = before {
                    let after = run_times();
                    g.taken = Some(taken(&b, &after, (s0, steal_ns(&cpus))));
                }
            }
            Err(e) => g.error = Some(e),
        }
    }
    let f = judge_gaps(&g.cpus, &g.together, g.taken.as_ref());
    (g, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(over_200us: u64) -> CpuGaps {
        CpuGaps {
            cpu: 0,
            watched_ms: 500.0,
            over_50us: 3 + over_200us,
            over_200us,
            over_1ms: 0,
            max_us: if over_200us > 0 { 450.0 } else { 80.0 },
            lost_us_per_s: 500.0,
        }
    }

    #[test]
    fn a_gap_of_200us_is_a_warning_and_none_is_ok() {
        let w = judge_gaps(&[cpu(0), cpu(2)], &[], None);
        assert_eq!(w.level, Level::Warn);
        assert!(
            w.detail.contains("2 of 200 µs or more, longest 450 µs"),
            "{}",
            w.detail
        );
        assert!(w.advice.is_some());
        assert_eq!(judge_gaps(&[cpu(0)], &[cpu(0)], None).level, Level::Ok);
        // Gaps only while every CPU is busy still warn, and say so.
        let t = judge_gaps(&[cpu(0)], &[cpu(3)], None);
        assert_eq!(t.level, Level::Warn);
        assert!(
            t.detail
                .contains("all at once (every one busy): CPU 0: 6 gaps"),
            "{}",
            t.detail
        );
    }

    #[test]
    fn what_ran_while_every_cpu_was_watched_is_named_longest_first() {
        let before: RunTimes = [((10, 10), 5_000_000), ((20, 21), 1_000), ((30, 30), 7)].into();
        let after: RunTimes = [
            ((10, 10), 22_550_000),
            ((20, 21), 1_000),
            ((30, 30), 7),
            ((40, 41), 3_000_000),
        ]
        .into();
        let (v, total) = ran(&before, &after);
        // Idle threads are left out; one that started meanwhile counts.
        assert_eq!(v, [((10, 10), 17_550_000), ((40, 41), 3_000_000)]);
        assert_eq!(total, 20_550_000);
        let t = Taken {
            others_ms: 20.55,
            top: vec![Runner {
                comm: "kdamond.0".into(),
                pid: 77,
                tid: 77,
                ms: 17.55,
            }],
            steal_ms: Some(30.0),
        };
        let f = judge_gaps(&[cpu(0)], &[cpu(3)], Some(&t));
        assert!(
            f.detail.contains(
                "(meanwhile other threads ran 20.6 ms (kdamond.0 17.6 ms); the hypervisor reported 30 ms of steal)"
            ),
            "{}",
            f.detail
        );
        let none = Taken {
            steal_ms: None,
            ..Taken::default()
        };
        assert!(describe_taken(&none).contains("no other thread ran; no steal figure"));
    }

    #[test]
    fn watching_cpus_together_counts_each() {
        let cpu = fastwake::cpu::current().unwrap_or(0);
        let g = watch_together(&[cpu], Duration::from_millis(20)).unwrap();
        assert_eq!(g.len(), 1);
        assert!(g[0].watched_ms >= 20.0, "{g:?}");
    }

    #[test]
    fn watching_a_cpu_counts_its_time() {
        let cpu = fastwake::cpu::current().unwrap_or(0);
        let g = watch(cpu, Duration::from_millis(20)).unwrap();
        assert!(g.watched_ms >= 20.0 && g.watched_ms < 1000.0, "{g:?}");
        assert!(
            g.over_50us >= g.over_200us && g.over_200us >= g.over_1ms,
            "{g:?}"
        );
        assert!(g.lost_us_per_s <= 1e6, "{g:?}");
    }
}
