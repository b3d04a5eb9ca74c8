//! Synchronisation primitives, switchable to loom's models under `--cfg loom`.
//!
//! Every atomic that takes part in the arm/re-check/sleep protocol comes from
//! here, so the loom model tests exercise the same code that runs in
//! production, not a copy of it.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};
/// For state a protocol's threads share under a lock (the shared-queue
/// demultiplexer's routes and inboxes), so the loom models see the lock.
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
/// Parking, for turns that threads hand each other (lanes' senders).
#[cfg(loom)]
pub(crate) use loom::thread::{Thread, ThreadId, current as current_thread, park};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::{Thread, ThreadId, current as current_thread, park};

use std::time::Duration;

/// A 32-bit word a thread can sleep on until another thread (or process)
/// changes it: a Linux futex.
///
/// It is `repr(C)` and only a `u32` wide outside loom, so it can live in a
/// shared mapping between processes; for that reason the futex is not
/// `FUTEX_PRIVATE`.
#[repr(C)]
pub(crate) struct FutexWord {
    word: AtomicU32,
    // loom cannot model a kernel futex; a mutex + condvar pair has the same
    // contract (sleep only while the word still equals `expected`, checked
    // atomically with going to sleep) and lets loom find lost wake-ups as
    // deadlocks.
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    cv: loom::sync::Condvar,
}

impl FutexWord {
    pub(crate) fn new(v: u32) -> Self {
        FutexWord {
            word: AtomicU32::new(v),
            #[cfg(loom)]
            lock: loom::sync::Mutex::new(()),
            #[cfg(loom)]
            cv: loom::sync::Condvar::new(),
        }
    }

    pub(crate) fn load(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    /// Change the word and wake one sleeper.
    pub(crate) fn bump_and_wake(&self) {
        self.word.fetch_add(1, Ordering::Release);
        self.wake_all(false);
    }

    /// [`FutexWord::bump_and_wake`] for a word that never leaves this
    /// process: `FUTEX_PRIVATE` skips the kernel's page lookup. Pair with
    /// [`FutexWord::wait_private`].
    pub(crate) fn bump_and_wake_private(&self) {
        self.word.fetch_add(1, Ordering::Release);
        self.wake_all(true);
    }

    #[cfg(not(loom))]
    fn flags(private: bool) -> rustix::thread::futex::Flags {
        if private {
            rustix::thread::futex::Flags::PRIVATE
        } else {
            rustix::thread::futex::Flags::empty()
        }
    }

    #[cfg(not(loom))]
    fn wake_all(&self, private: bool) {
        // Errors cannot be acted on: the only failures are EFAULT/EINVAL,
        // impossible for a word we own. A waiter re-checks state anyway.
        let _ = rustix::thread::futex::wake(&self.word, Self::flags(private), u32::MAX);
    }

    #[cfg(loom)]
    fn wake_all(&self, _private: bool) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }

    /// Sleep while the word equals `expected`. Returns on change, timeout,
    /// signal or spuriously: callers always re-check their condition.
    /// True when a signal interrupted the sleep (for callers that must
    /// return `EINTR` the way a blocking syscall would).
    #[cfg(not(loom))]
    pub(crate) fn wait(&self, expected: u32, timeout: Option<Duration>) -> bool {
        self.wait_flags(expected, timeout, false)
    }

    /// [`FutexWord::wait`] for a process-private word.
    #[cfg(not(loom))]
    pub(crate) fn wait_private(&self, expected: u32, timeout: Option<Duration>) -> bool {
        self.wait_flags(expected, timeout, true)
    }

    #[cfg(loom)]
    pub(crate) fn wait_private(&self, expected: u32, timeout: Option<Duration>) -> bool {
        self.wait(expected, timeout)
    }

    #[cfg(not(loom))]
    fn wait_flags(&self, expected: u32, timeout: Option<Duration>, private: bool) -> bool {
        let ts = timeout.map(|d| rustix::thread::futex::Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        rustix::thread::futex::wait(&self.word, Self::flags(private), expected, ts.as_ref())
            == Err(rustix::io::Errno::INTR)
    }

    /// loom has no signals.
    #[cfg(loom)]
    pub(crate) fn wait(&self, expected: u32, _timeout: Option<Duration>) -> bool {
        let mut g = self.lock.lock().unwrap();
        while self.word.load(Ordering::Acquire) == expected {
            g = self.cv.wait(g).unwrap();
        }
        false
    }
}

/// Atomics in cache lines of their own: the allocation starts on a line
/// and fills its last line, so no other heap object shares a line with
/// them. `PER` is how many fit in a line (64 for bytes, 8 for words).
///
/// Why: memory written on one CPU (a producer raising a flag, a waiter
/// announcing itself) and a small allocation next to it read on another
/// CPU on every operation would pay a line transfer per operation,
/// invisible in the code. The channel's payload buffer did this and cost
/// `fastwake bench share` 10-25 % (docs/design/dispatcher.md, "False sharing in the
/// heap").
pub(crate) struct LineArray<T, const PER: usize> {
    lines: Box<[LineOf<T, PER>]>,
    len: usize,
}

#[repr(C, align(64))]
struct LineOf<T, const PER: usize>([T; PER]);

/// Atomic bytes in lines of their own.
pub(crate) type LineBytes = LineArray<AtomicU8, 64>;
/// Atomic words in lines of their own.
pub(crate) type LineWords = LineArray<AtomicU64, 8>;

impl<T, const PER: usize> LineArray<T, PER> {
    /// `len` elements, each made by `init`.
    pub(crate) fn new(len: usize, mut init: impl FnMut() -> T) -> Self {
        LineArray {
            lines: (0..len.div_ceil(PER).max(1))
                .map(|_| LineOf(std::array::from_fn(|_| init())))
                .collect(),
            len,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Element `i`; panics past `len` like a slice.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> &T {
        assert!(i < self.len, "element {i} of {}", self.len);
        &self.lines[i / PER].0[i % PER]
    }
}
