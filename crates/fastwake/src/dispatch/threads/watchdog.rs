//! The watchdog: does the dispatcher's job while the dispatcher is
//! polling but not getting the CPU, and stays asleep while no thread
//! waits.

use super::hub::{Hub, MODE_DEAD, MODE_SLEEPING};
use super::{lock, read, thread_clock};
use crate::dispatch::SchedPolicy;
use crate::dispatch::slot::{HANDED, WAITING};
use crate::sync::{Ordering, fence};
use std::time::Duration;

/// How often the watchdog looks at a polling dispatcher.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(1);

/// Looks in a row that found no thread waiting before the watchdog parks.
/// Not 1: in a fast request stream the slot is often empty for an instant,
/// and each park costs the next wait a futex wake (`Hub::kick`); three
/// empty looks (>= 2 ms) bound that to one wake per few ms.
const PARK_AFTER: u32 = 3;

/// A thread waits while the dispatcher sleeps only between its announce
/// and its kick (loom-checked: `sleep_idle` hands every announced wait
/// back). Should one stay so longer than this, the watchdog kicks the
/// dispatcher itself: the safety net the dispatcher's own sleep used to
/// carry as a 1 s timer, which woke it every second while the program
/// computed.
const SAFETY_NET: Duration = Duration::from_secs(1);

/// The watchdog: a normal-priority thread, allowed on every CPU, that does
/// the dispatcher's job when the dispatcher is polling but has not run for
/// a period (a `SCHED_IDLE` thread gets next to no CPU on a busy core). It
/// bounds how long a thread that went to sleep trusting the dispatcher can
/// be left waiting, without a timer on every sleep. It costs one wake-up per
/// period while the dispatcher polls *and a thread waits*; nothing while
/// the dispatcher sleeps (it sleeps too), while no thread waits (it parks
/// until a wait starts: a program that computes must not be disturbed by
/// it) or once the dispatcher is dead (it exits).
pub(super) fn watchdog(hub: &Hub) {
    // Not pinned with whoever started the dispatcher: it must be able to
    // run where the dispatcher cannot.
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut set = rustix::thread::CpuSet::new();
    for c in 0..n.min(rustix::thread::CpuSet::MAX_CPU) {
        set.set(c);
    }
    let _ = rustix::thread::sched_setaffinity(None, &set);
    *lock(&hub.wclock) = thread_clock();
    let mut empty: u32 = 0;
    loop {
        match hub.look(&mut empty) {
            Look::Dead => return,
            Look::Parked => {}
            Look::Sleeping(seq) => {
                // A FIFO dispatcher's short step-asides are SLEEPING
                // without a bump: bounded for that policy. Otherwise a
                // wait announced while the dispatcher sleeps is about to
                // kick it.
                if hub.cfg.policy == SchedPolicy::Fifo {
                    hub.awake
                        .wait_private(seq, Some(Duration::from_millis(100)));
                } else if !hub.awake.wait_private(seq, Some(SAFETY_NET))
                    && hub.awake.load() == seq
                    && hub.mode.load(Ordering::SeqCst) == MODE_SLEEPING
                    && hub.anyone_waiting()
                {
                    hub.kick();
                }
            }
            Look::Polling => {
                std::thread::sleep(WATCHDOG_PERIOD);
                if hub.heartbeat_age() > WATCHDOG_PERIOD {
                    hub.rescue();
                }
            }
        }
    }
}

/// What one look of the watchdog found (`Hub::look`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::dispatch) enum Look {
    /// The dispatcher is dead: exit.
    Dead,
    /// Nobody waited; the watchdog parked and was woken: look again.
    Parked,
    /// A thread waits while the dispatcher sleeps (`awake` read before).
    Sleeping(u32),
    /// A thread waits (or did a moment ago) while the dispatcher polls:
    /// check on the dispatcher after a period.
    Polling,
}

impl Hub {
    /// One look of the watchdog, without the clock (the loom model
    /// `parked_watchdog_meets_a_new_wait` runs it): parks when no thread
    /// has waited for `PARK_AFTER` looks in a row (`empty` counts them), or
    /// at once when the dispatcher sleeps and nobody waits.
    pub(in crate::dispatch) fn look(&self, empty: &mut u32) -> Look {
        let seq = self.awake.load();
        let mode = self.mode.load(Ordering::SeqCst);
        if mode == MODE_DEAD {
            return Look::Dead;
        }
        if self.anyone_waiting() {
            *empty = 0;
        } else {
            *empty += 1;
            if mode == MODE_SLEEPING || *empty >= PARK_AFTER {
                self.park(seq);
                *empty = 0;
                return Look::Parked;
            }
        }
        if mode == MODE_SLEEPING {
            Look::Sleeping(seq)
        } else {
            Look::Polling
        }
    }

    /// Is a thread asleep on its slot trusting the dispatcher (`WAITING`)?
    /// A cold scan of the waiting set (bits of slots no longer waiting are
    /// dropped lazily, so each is checked).
    pub(in crate::dispatch) fn anyone_waiting(&self) -> bool {
        self.waitset
            .marked()
            .any(|i| self.slots[i].state() == WAITING)
    }

    /// The watchdog parks: no thread waits, so there is nobody to rescue.
    /// It sleeps on `awake` until the dispatcher leaves its idle sleep or
    /// dies, or a wait starts: Dekker with the waiter's announce (its
    /// `WAITING` and waiting-set bit, a `SeqCst` fence, then `kick` reads
    /// `wd_parked`): either the re-check here sees the wait, or the kick
    /// sees the flag and bumps `awake` after `seq` was read. `seq`: `awake`
    /// read before the caller looked. Checked by the loom model
    /// `parked_watchdog_meets_a_new_wait`.
    pub(in crate::dispatch) fn park(&self, seq: u32) {
        self.wd_parked.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.anyone_waiting() && self.mode.load(Ordering::SeqCst) != MODE_DEAD {
            self.awake.wait_private(seq, None);
        }
        self.wd_parked.store(0, Ordering::SeqCst);
    }

    /// µs since the dispatcher last read its clock (it does every few
    /// hundred empty passes and after each hand-off).
    fn heartbeat_age(&self) -> Duration {
        let now = self.epoch.elapsed().as_micros() as u64;
        Duration::from_micros(now.saturating_sub(self.heartbeat.load(Ordering::Relaxed)))
    }

    /// The watchdog's pass, for a dispatcher that is not getting the CPU:
    /// hand off every waiting thread whose source is ready.
    pub(in crate::dispatch) fn rescue(&self) {
        let handles = read(&self.handles);
        let n = self
            .waitset
            .marked()
            .filter(|&i| {
                self.slots[i].state() == WAITING
                    && handles[i].as_ref().is_some_and(|p| p.ready())
                    && self.slots[i].hand(HANDED)
            })
            .count();
        self.rescued.fetch_add(n as u64, Ordering::Relaxed);
    }
}
