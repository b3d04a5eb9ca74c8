//! Scheduling policies for the dispatcher thread.

use crate::{Fail, Result};

/// How the dispatcher thread is scheduled, which decides how a woken
/// application thread gets the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
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

impl Policy {
    /// The name the CLI uses.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Idle => "idle",
            Policy::Fifo => "fifo",
            Policy::Yield => "yield",
            Policy::Normal => "normal",
        }
    }

    /// Parse `idle`, `fifo`, `yield` or `normal`.
    pub fn parse(s: &str) -> Result<Policy> {
        match s {
            "idle" => Ok(Policy::Idle),
            "fifo" => Ok(Policy::Fifo),
            "yield" => Ok(Policy::Yield),
            "normal" => Ok(Policy::Normal),
            _ => Err(Fail::invalid(format!(
                "unknown dispatcher policy '{s}': expected idle, fifo, yield or normal"
            ))),
        }
    }

    /// Apply to the calling thread.
    pub(crate) fn apply(&self) -> Result<()> {
        let (pol, prio) = match self {
            Policy::Idle => (libc::SCHED_IDLE, 0),
            Policy::Fifo => (libc::SCHED_FIFO, 1),
            Policy::Yield | Policy::Normal => return Ok(()),
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
