//! Scheduling policies for the dispatcher thread.

use crate::{Fail, Result};

/// How the dispatcher thread is scheduled, which decides how a woken
/// application thread gets the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedPolicy {
    /// `SCHED_IDLE`: runs only when nothing else wants the core, and any
    /// woken normal thread preempts it at once. The default.
    #[default]
    Idle,
    /// `SCHED_FIFO` priority 1: preempts normal threads; after each
    /// hand-off it blocks until the woken thread waits again (or 100 µs),
    /// like the paper's `switch_to`. Needs `CAP_SYS_NICE`.
    Fifo,
    /// `SCHED_OTHER`, calling `sched_yield` after each hand-off.
    Yield,
    /// `SCHED_OTHER`, no yield (the woken thread waits for the scheduler).
    Normal,
}

impl SchedPolicy {
    /// The name the CLI uses.
    pub fn name(&self) -> &'static str {
        match self {
            SchedPolicy::Idle => "idle",
            SchedPolicy::Fifo => "fifo",
            SchedPolicy::Yield => "yield",
            SchedPolicy::Normal => "normal",
        }
    }

    /// Parse `idle`, `fifo`, `yield` or `normal`.
    pub fn parse(s: &str) -> Result<SchedPolicy> {
        match s {
            "idle" => Ok(SchedPolicy::Idle),
            "fifo" => Ok(SchedPolicy::Fifo),
            "yield" => Ok(SchedPolicy::Yield),
            "normal" => Ok(SchedPolicy::Normal),
            _ => Err(Fail::invalid(format!(
                "unknown dispatcher policy '{s}': expected idle, fifo, yield or normal"
            ))),
        }
    }

    /// Apply to the calling thread.
    pub(crate) fn apply(&self) -> Result<()> {
        let (pol, prio) = match self {
            SchedPolicy::Idle => (libc::SCHED_IDLE, 0),
            SchedPolicy::Fifo => (libc::SCHED_FIFO, 1),
            SchedPolicy::Yield | SchedPolicy::Normal => return Ok(()),
        };
        let param = libc::sched_param {
            sched_priority: prio,
        };
        // SAFETY: pid 0 is the calling thread; param is a valid pointer for
        // the duration of the call.
        let r = unsafe { libc::sched_setscheduler(0, pol, &param) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Fail::new(
                e.raw_os_error().unwrap_or(libc::EPERM),
                format!("set dispatcher policy {}: {e}", self.name()),
            ));
        }
        Ok(())
    }
}

/// Give the core away (to a thread just woken on it).
pub(crate) fn yield_now() {
    // SAFETY: no preconditions.
    unsafe {
        libc::sched_yield();
    }
}
