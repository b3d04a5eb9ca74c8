//! The relay's side of the hub: a waiting thread doing the dispatcher's
//! job for the other waiters of its core before it sleeps (see the
//! `dispatch::waiter` module for why).

use super::hub::{Hub, MODE_POLLING};
use super::read;
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
    /// out of the scan.
    pub(crate) fn relay_pass(&self, me: usize) -> bool {
        let (found, noticed) = {
            let handles = read(&self.handles);
            let ready = |i: usize| {
                i != me
                    && self.slots[i].state() == WAITING
                    && handles[i].as_ref().is_some_and(|p| p.ready())
            };
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
            'scan: for w in 0..self.waitset.words() {
                if found.is_some() {
                    break;
                }
                let mut bits = self.waitset.word(w) & !self.noticed.get(w).load(Ordering::Relaxed);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if ready(i) {
                        found = Some(i);
                        break 'scan;
                    }
                }
            }
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
}
