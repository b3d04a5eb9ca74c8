//! The relay's side of the hub: a waiting thread doing the dispatcher's
//! job for the other waiters of its core before it sleeps (see the
//! `dispatch::waiter` module for why).

use super::hub::{Hub, MODE_POLLING};
use super::read;
use crate::dispatch::sched::yield_now;
use crate::dispatch::slot::{HANDED, WAITING};
use crate::sync::Ordering;
use std::time::Duration;

impl Hub {
    /// The relay budget, when relaying makes sense now: the dispatcher is
    /// polling (asleep, its waiters are paused in interrupt mode anyway).
    pub(crate) fn relay_budget(&self) -> Option<Duration> {
        self.cfg
            .relay
            .filter(|_| self.mode.load(Ordering::Relaxed) == MODE_POLLING)
    }

    /// Is one thread registered with this core's dispatcher, the caller,
    /// and may it spin in place ([`super::Config::lone_spin`])? Not under
    /// a learned idle policy: that dispatcher decides when its core is
    /// polled (its pre-wakes), and a waiter spinning on its own after each
    /// resume would take the decision from it.
    pub(crate) fn lone(&self) -> bool {
        self.cfg.lone_spin
            && self.cfg.learn_idle.is_none()
            && self.registered.load(Ordering::Relaxed) == 1
    }

    /// One relay pass by the waiting thread that owns slot `me`: hand off
    /// to the first other waiting thread whose source is ready. True when
    /// it handed one.
    ///
    /// The handles are read under the read lock, and the hand-off (a futex
    /// wake, after which the woken thread may preempt us at once) happens
    /// after it is released: a relayer preempted inside the lock would
    /// otherwise stall the next relayer (measured: that turned most relays
    /// into two extra switches).
    ///
    /// Notices first: a popped notice is this relay's to serve (the
    /// dispatcher will not see it), and sources served by notices are left
    /// out of the scan. Then the sources on the dispatcher's kernel ready
    /// list (sockets), all of them with one `epoll_wait` on its set
    /// (`dispatch::kernel_list`, "Relays"), also left out of the scan,
    /// which peeks the rest one by one.
    pub(crate) fn relay_pass(&self, me: usize) -> bool {
        let (found, noticed) = {
            let handles = read(&self.handles);
            let waiting = |i: usize| i != me && self.slots[i].state() == WAITING;
            let peek = |i: usize| handles[i].as_ref().is_some_and(|p| p.ready());
            let ready = |i: usize| waiting(i) && peek(i);
            let mut peeks = 0;
            let mut found = None;
            let mut noticed = false;
            if let Some(r) = &self.notices {
                while let Some(i) = r.pop() {
                    if ready(i) {
                        found = Some(i);
                        noticed = true;
                        break;
                    }
                }
            }
            if found.is_none() {
                found = self.kernel.relay_find(waiting);
            }
            'scan: for w in 0..self.waitset.words() {
                if found.is_some() {
                    break;
                }
                let mut bits = self.waitset.word(w)
                    & !self.noticed.get(w).load(Ordering::Relaxed)
                    & !self.kernel.listed_word(w);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if !waiting(i) {
                        continue;
                    }
                    peeks += 1;
                    if peek(i) {
                        found = Some(i);
                        break 'scan;
                    }
                }
            }
            self.kernel.count_relay_peeks(peeks);
            (found, noticed)
        };
        // Slots live as long as the core, so no lock is needed to hand.
        match found {
            Some(i) if self.slots[i].hand(HANDED) => {
                self.relayed.fetch_add(1, Ordering::Relaxed);
                if noticed {
                    self.notice_handoffs.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            _ => false,
        }
    }

    /// The fair turn of the thread that owns slot `me`, which has been
    /// finding its own source ready at every wait (so it never sleeps):
    /// hand off every other waiting thread of the core whose source is
    /// ready, and if any thread of the core was handed its completion and
    /// has not run yet (just now, or earlier by the dispatcher), give it
    /// the core. Returns the hand-offs made.
    ///
    /// Why: such a thread keeps its core for a whole scheduler slice. The
    /// `SCHED_IDLE` dispatcher does not run meanwhile, so no one else's
    /// ready source is handed off, and a woken thread does not preempt a
    /// running one of equal weight before the slice ends (EEVDF runs the
    /// current task to parity): under a throughput load the other
    /// connections of the core waited 1-3 ms, a slice, while one thread
    /// served its own at 0.4 µs (measured with 16 connections on a core).
    pub(crate) fn fair_turn(&self, me: usize) -> u64 {
        let mut handed = 0;
        // At most one pass's worth: the set cannot hold more waiters.
        while handed < self.slots.len() as u64 && self.relay_pass(me) {
            handed += 1;
        }
        self.beat(std::time::Instant::now());
        // Only when someone of the core is known to wait for it: a yield
        // with others runnable is a switch, and a thread preempted between
        // two waits of its own (in no slot state) gets its turn from the
        // scheduler as in any other mode.
        let woken = handed > 0
            || self
                .waitset
                .marked()
                .any(|i| i != me && self.slots[i].state() == HANDED);
        if woken {
            self.fair_yields.fetch_add(1, Ordering::Relaxed);
            yield_now();
        }
        handed
    }
}
