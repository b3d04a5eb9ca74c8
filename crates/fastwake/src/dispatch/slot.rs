//! The hand-off slot: how a kernel thread waiting in dispatch mode and its
//! core's dispatcher agree, without locks, on who wakes whom.
//!
//! Each registered waiter owns one [`Slot`]; the dispatcher owns a
//! [`WaitSet`] bitmap with one bit per slot, so a pass reads one word per
//! 64 slots instead of every slot.
//!
//! States of a slot (`state`):
//! - [`RUNNING`]: the owner is not waiting (the dispatcher ignores it).
//! - [`WAITING`]: the owner announced a wait and may be asleep on `bell`.
//! - [`HANDED`]: the dispatcher saw the source ready and woke the owner.
//! - [`PAUSED`]: the dispatcher went idle; the owner must wait in interrupt
//!   mode for this one completion.
//! - [`DEAD`]: the dispatcher is gone; the owner falls back for good.
//!
//! Only the owner moves a slot *out of* the dispatcher-set states and only
//! the dispatcher moves it *out of* `WAITING` to them; both use a CAS on
//! `WAITING`, so exactly one side wins a race between "the owner gives up
//! waiting" and "the dispatcher hands off".
//!
//! The `WaitSet` bit is a hint that may be stale in one direction only: a
//! `WAITING` slot always has its bit set (the owner sets it after the state;
//! the dispatcher, after clearing a bit, re-reads the state and sets it back
//! if it raced with a new announcement). The loom models in
//! `dispatch/loom_tests.rs` run this code and check that no hand-off or
//! wake-up is lost.

use crate::sync::{AtomicU32, AtomicU64, FutexWord, LineWords, Ordering, fence};
use std::time::{Duration, Instant};

/// The owner is not waiting.
pub const RUNNING: u32 = 0;
/// The owner waits; the dispatcher should peek its source.
pub const WAITING: u32 = 1;
/// The dispatcher found the source ready and rang the owner's bell.
pub const HANDED: u32 = 2;
/// The dispatcher is asleep (idle policy): wait in interrupt mode once.
pub const PAUSED: u32 = 3;
/// The dispatcher is gone: wait in interrupt mode from now on.
pub const DEAD: u32 = 4;

/// One waiter's hand-off slot.
#[repr(align(64))]
pub struct Slot {
    state: AtomicU32,
    bell: FutexWord,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: AtomicU32::new(RUNNING),
            bell: FutexWord::new(0),
        }
    }
}

impl Slot {
    /// Current state.
    pub fn state(&self) -> u32 {
        self.state.load(Ordering::SeqCst)
    }

    /// Owner: announce a wait. After this the dispatcher may hand off at
    /// any moment; the caller must re-check its source and then either
    /// [`Slot::cancel`] or [`Slot::sleep`]. False when the dispatcher is
    /// dead (the slot is `DEAD`): wait in interrupt mode instead.
    pub fn announce(&self, set: &WaitSet, index: usize) -> bool {
        if self
            .state
            .compare_exchange(RUNNING, WAITING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        set.mark(index);
        true
    }

    /// Owner: stop waiting. Returns `RUNNING` when the wait was withdrawn
    /// before any hand-off, otherwise the state the dispatcher set, which
    /// the owner must then [`Slot::reclaim`].
    pub fn cancel(&self) -> u32 {
        match self
            .state
            .compare_exchange(WAITING, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => RUNNING,
            Err(s) => s,
        }
    }

    /// Owner: sleep until the state leaves `WAITING` or `timeout` passes.
    /// Returns the state seen last, and whether a signal cut the sleep
    /// short.
    pub fn sleep_signalled(&self, timeout: Option<Duration>) -> (u32, bool) {
        // The bell is read before the state: a hand-off after the state
        // check changes the bell, so the futex wait cannot miss it.
        let seq = self.bell.load();
        let s = self.state();
        if s != WAITING {
            return (s, false);
        }
        let signalled = self.bell.wait_private(seq, timeout);
        (self.state(), signalled)
    }

    /// Owner: after a hand-off, take the slot back. Returns the state the
    /// dispatcher left (`HANDED`, `PAUSED` or `DEAD`); `DEAD` stays.
    pub fn reclaim(&self) -> u32 {
        let s = self.state();
        if s != HANDED && s != PAUSED {
            return s;
        }
        // A dying dispatcher may write DEAD meanwhile; then DEAD stays.
        match self
            .state
            .compare_exchange(s, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => s,
            Err(now) => now,
        }
    }

    /// Owner: one announced wait, the whole protocol: announce, make the
    /// announcement visible before the re-check, `kick` the dispatcher,
    /// re-check with `ready`, then withdraw (ready) or sleep until the
    /// dispatcher settles the wait, and reclaim the slot. `None` when the
    /// dispatcher is dead (wait in interrupt mode instead).
    ///
    /// Without a `deadline` the sleep has no timeout: arming a timer per
    /// sleep costs more than a microsecond in a VM (docs/design/dispatcher.md), a
    /// dispatcher that dies rings every slot, and one starved of CPU is
    /// only late (the watchdog covers it; new waits avoid it). With `interruptible`, a
    /// signal withdraws the wait unless a hand-off got there first.
    pub(crate) fn wait_hand_off(
        &self,
        set: &WaitSet,
        index: usize,
        kick: impl FnOnce(),
        ready: impl FnOnce() -> bool,
        deadline: Option<Instant>,
        interruptible: bool,
    ) -> Option<WaitEnd> {
        if !self.announce(set, index) {
            return None;
        }
        // Dekker with the producer (and its summary flag): our WAITING
        // must be visible before we look at the source, or the dispatcher
        // could miss our state while we miss the completion.
        fence(Ordering::SeqCst);
        kick();
        let mut end = WaitEnd {
            state: RUNNING,
            sleeps: 0,
            signalled: false,
        };
        let st = if ready() {
            self.cancel()
        } else {
            loop {
                let mut t = None;
                if let Some(d) = deadline {
                    let now = Instant::now();
                    if now >= d {
                        break self.cancel();
                    }
                    t = Some(d - now);
                }
                end.sleeps += 1;
                let (s, sig) = self.sleep_signalled(t);
                if s != WAITING {
                    break s;
                }
                if sig && interruptible {
                    let s = self.cancel();
                    end.signalled = s == RUNNING;
                    break s;
                }
            }
        };
        end.state = if st == RUNNING {
            RUNNING
        } else {
            self.reclaim()
        };
        Some(end)
    }

    /// Dispatcher: move a `WAITING` slot to `to` and ring the owner. False
    /// when the owner withdrew first.
    pub fn hand(&self, to: u32) -> bool {
        if self
            .state
            .compare_exchange(WAITING, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        self.bell.bump_and_wake_private();
        true
    }

    /// Dispatcher: back to `RUNNING` for reuse by a new registration.
    pub(crate) fn reset(&self) {
        // Only the dispatcher resets, and only slots whose owner is gone.
        let _ = self.cancel();
        let _ = self.reclaim();
    }

    /// Dispatcher at exit: mark the slot dead whatever it does, ringing it
    /// if it was waiting.
    pub fn kill(&self) {
        if self.hand(DEAD) {
            return;
        }
        // Not waiting: the owner sees DEAD on its next announce or
        // reclaim. A CAS loop, because the owner may be announcing now.
        let mut s = self.state();
        loop {
            if s == DEAD {
                return;
            }
            match self
                .state
                .compare_exchange(s, DEAD, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if s == WAITING {
                        self.bell.bump_and_wake_private();
                    }
                    return;
                }
                Err(now) => s = now,
            }
        }
    }
}

/// How a [`Slot::wait_hand_off`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitEnd {
    /// `RUNNING`: withdrawn before any hand-off (the re-check found the
    /// source ready, the deadline passed, or a signal came). Otherwise how
    /// the dispatcher settled the wait, the slot already reclaimed:
    /// `HANDED`, `PAUSED` or `DEAD`.
    pub(crate) state: u32,
    /// Times the owner slept on its bell.
    pub(crate) sleeps: u32,
    /// A signal withdrew the wait (`state` is `RUNNING`).
    pub(crate) signalled: bool,
}

/// One bit per slot: "this slot may be waiting".
pub struct WaitSet {
    // Lines of their own: waiters announce here on every wait.
    words: LineWords,
}

impl WaitSet {
    /// Room for `capacity` slots.
    pub fn new(capacity: usize) -> WaitSet {
        WaitSet {
            words: LineWords::new(capacity.div_ceil(64), || AtomicU64::new(0)),
        }
    }

    /// Number of 64-bit words.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// Bits of word `w`.
    #[inline]
    pub fn word(&self, w: usize) -> u64 {
        self.words.get(w).load(Ordering::SeqCst)
    }

    fn mark(&self, index: usize) {
        let (w, b) = (index / 64, 1u64 << (index % 64));
        // Skip the locked RMW when the bit is still set from before.
        if self.words.get(w).load(Ordering::SeqCst) & b == 0 {
            self.words.get(w).fetch_or(b, Ordering::SeqCst);
        }
    }

    /// The slots whose bit is set, word by word (each word read once).
    /// For the cold scans (going idle, the watchdog); a pass goes through
    /// the watch instead.
    pub(crate) fn marked(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.words()).flat_map(move |w| {
            let mut bits = self.word(w);
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(i)
            })
        })
    }

    /// Dispatcher: drop the bit of a slot found not waiting, then re-read
    /// the state and restore the bit if the owner announced meanwhile.
    pub fn unmark(&self, index: usize, slot: &Slot) {
        let (w, b) = (index / 64, 1u64 << (index % 64));
        self.words.get(w).fetch_and(!b, Ordering::SeqCst);
        if slot.state() == WAITING {
            self.words.get(w).fetch_or(b, Ordering::SeqCst);
        }
    }
}
