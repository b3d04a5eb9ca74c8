//! Fault injection, for tests that check that waiters survive a dispatcher
//! that panics or does not get the CPU.
//!
//! The hooks are in the dispatcher's run loop; the calls that set them off
//! are [`Dispatcher::inject_crash`] and [`Dispatcher::inject_wake_stall`].

use super::Dispatcher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The faults requested of one dispatcher.
#[derive(Default)]
pub(super) struct Faults {
    crash: AtomicBool,
    /// ms the dispatcher stays off the CPU after it is woken from its idle
    /// sleep (what a busy core does to a SCHED_IDLE thread, made
    /// deterministic).
    stall_ms: AtomicU64,
}

impl Faults {
    /// The run loop's crash point: panics if a crash was injected.
    #[inline]
    pub(super) fn crash_point(&self) {
        if self.crash.load(Ordering::Relaxed) {
            panic!("fastwake dispatcher: injected crash");
        }
    }

    /// Called as the dispatcher leaves its idle sleep.
    pub(super) fn wake_stall(&self) {
        let stall = self.stall_ms.load(Ordering::Relaxed);
        if stall > 0 {
            std::thread::sleep(Duration::from_millis(stall));
        }
    }
}

impl Dispatcher {
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
}
