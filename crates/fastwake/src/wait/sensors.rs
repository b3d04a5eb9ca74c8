//! What a library waiter senses about its CPU for the adaptive governor:
//! whether other threads want the CPU (the pressure sampler) and whether a
//! dispatcher serves it. Refreshed every few waits
//! ([`Governor::refresh_due`](super::Governor::refresh_due)): the
//! dispatcher lookup takes a lock and registering with the sampler may
//! start its thread, neither of which belongs on the per-wait path. The
//! preload shim does not use this: it must not start threads in its host
//! program beyond those of the mode asked for.

use crate::adaptive::pressure;
use std::sync::Arc;

#[derive(Debug, Default)]
pub(super) struct Sensors {
    pub(super) pressure: Option<Arc<pressure::Shared>>,
    thread: Option<std::thread::ThreadId>,
    /// Waiters of the live dispatcher on this CPU, if one serves it.
    pub(super) dispatch_waiters: Option<u32>,
}

impl Clone for Sensors {
    /// A clone registers its own thread with the sampler.
    fn clone(&self) -> Self {
        Sensors::default()
    }
}

impl Sensors {
    /// Does the sampler say other threads want this thread's CPU?
    #[inline]
    pub(super) fn contended(&self) -> bool {
        self.pressure.as_ref().is_some_and(|p| p.contended())
    }

    /// A sleep on a contended CPU under the slice trial, by a waiter
    /// whose µs of latency are `worth` µs of CPU: counted for the sampler;
    /// whether it takes the short slice now.
    #[inline]
    pub(super) fn trial_slice_on(&self, worth: u16) -> bool {
        self.pressure.as_ref().is_some_and(|p| {
            p.trials().note_slice_sleep(worth);
            p.trials().slice_on()
        })
    }

    /// A wait on a contended CPU whose learned plan spins, under the
    /// lean-spin trial ([`crate::wait::Governor::lean_trial_worth`]), by a
    /// waiter of `worth`: counted for the sampler; whether the trial bars
    /// lean spins now.
    #[inline]
    pub(super) fn lean_barred(&self, worth: u16) -> bool {
        self.pressure.as_ref().is_some_and(|p| {
            p.trials().note_contended_wait(worth);
            !p.trials().lean_on()
        })
    }

    /// Look again at `cpu`'s dispatcher, and register this thread with the
    /// pressure sampler on the first wait and whenever the waiter moved to
    /// another thread.
    #[cold]
    pub(super) fn refresh(&mut self, cpu: Option<u32>) {
        let shared = self
            .pressure
            .get_or_insert_with(|| Arc::new(pressure::Shared::default()));
        if let Some(c) = cpu {
            shared.set_cpu(c);
        }
        self.dispatch_waiters = cpu.and_then(|c| {
            crate::dispatch::threads::lookup(c).map(|d| (d.stats().registered as u32).max(1))
        });
        let id = std::thread::current().id();
        if self.thread != Some(id) {
            self.thread = Some(id);
            pressure::register(shared);
        }
    }
}
