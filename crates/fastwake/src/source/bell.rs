//! A conditional doorbell for one watcher that sleeps when it finds nothing:
//! producers ring it only while the watcher has armed it, so a watcher that
//! keeps polling costs them one load.
//!
//! Shared by the readiness [`super::summary::Summary`] and the
//! [`super::notice::NoticeRing`] of one dispatcher, so that a task runtime
//! going idle arms one bell that covers both kinds of source.
//!
//! Dekker handshake, as the channel's doorbell: the watcher stores
//! `sleeping`, fences, then re-checks (drains its summary, pops its ring);
//! the producer makes its flag or notice visible, then (after a full
//! barrier of its own) reads `sleeping`. One of the two sees the other.

use crate::sync::{AtomicU32, FutexWord, Ordering, fence};
use std::time::Duration;

/// See the [module docs](self). Line aligned: producers on other CPUs
/// read it after every flag or notice, so it must not share a line with a
/// heap object written on every operation.
#[repr(align(64))]
pub struct Bell {
    sleeping: AtomicU32,
    bell: FutexWord,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").finish_non_exhaustive()
    }
}

impl Default for Bell {
    fn default() -> Self {
        Bell::new()
    }
}

impl Bell {
    /// Unarmed.
    pub fn new() -> Bell {
        Bell {
            sleeping: AtomicU32::new(0),
            bell: FutexWord::new(0),
        }
    }

    /// Watcher: the next producer rings. Returns the token for
    /// [`Bell::sleep`]; the caller must re-check after this and sleep only
    /// if that found nothing.
    pub fn arm(&self) -> u32 {
        let seq = self.bell.load();
        self.sleeping.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        seq
    }

    /// Watcher: withdraw an [`Bell::arm`] (the re-check found work, or
    /// after waking).
    pub fn disarm(&self) {
        self.sleeping.store(0, Ordering::Relaxed);
    }

    /// Watcher: sleep until a producer rings after [`Bell::arm`], `timeout`
    /// passes, or spuriously.
    pub fn sleep(&self, token: u32, timeout: Option<Duration>) {
        self.bell.wait_private(token, timeout);
    }

    /// Producer, after making its flag or notice visible and a full
    /// barrier: wake the watcher if it armed.
    #[inline]
    pub(crate) fn ring_if_armed(&self) {
        if self.sleeping.load(Ordering::SeqCst) != 0 && self.sleeping.swap(0, Ordering::SeqCst) != 0
        {
            self.bell.bump_and_wake_private();
        }
    }
}
