//! Fault injection, for tests that check that waiters survive a dispatcher
//! that panics or does not get the CPU.
//!
//! Only with the `fault-injection` cargo feature (off by default): without
//! it the hooks in the run loop are empty and `Dispatcher` has no
//! `inject_*` calls, so a release library or shim cannot be made to crash
//! its dispatcher and carries none of this code.

#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The faults requested of one dispatcher (nothing without the feature).
#[derive(Default)]
pub(super) struct Faults {
    #[cfg(feature = "fault-injection")]
    crash: AtomicBool,
    /// ms the dispatcher stays off the CPU after it is woken from its idle
    /// sleep (what a busy core does to a SCHED_IDLE thread, made
    /// deterministic).
    #[cfg(feature = "fault-injection")]
    stall_ms: AtomicU64,
}

impl Faults {
    /// The run loop's crash point: panics if a crash was injected.
    #[inline(always)]
    pub(super) fn crash_point(&self) {
        #[cfg(feature = "fault-injection")]
        if self.crash.load(Ordering::Relaxed) {
            panic!("fastwake dispatcher: injected crash");
        }
    }

    /// Called as the dispatcher leaves its idle sleep.
    #[inline(always)]
    pub(super) fn wake_stall(&self) {
        #[cfg(feature = "fault-injection")]
        {
            let stall = self.stall_ms.load(Ordering::Relaxed);
            if stall > 0 {
                std::thread::sleep(std::time::Duration::from_millis(stall));
            }
        }
    }
}

#[cfg(feature = "fault-injection")]
impl super::Dispatcher {
    /// Make the dispatcher thread panic, to test that its waiters survive.
    #[doc(hidden)]
    pub fn inject_crash(&self) {
        self.hub.faults.crash.store(true, Ordering::SeqCst);
        self.hub.kick();
    }

    /// Keep the dispatcher off the CPU for `ms` each time it is woken from
    /// its idle sleep, to test that its waiters are served meanwhile.
    #[doc(hidden)]
    pub fn inject_wake_stall(&self, ms: u64) {
        self.hub.faults.stall_ms.store(ms, Ordering::SeqCst);
    }

    /// Wait until the dispatcher thread has exited (after a crash).
    #[doc(hidden)]
    pub fn join(&mut self) {
        self.join_threads();
    }
}
