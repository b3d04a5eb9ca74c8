//! A completion ring owned by someone else — an io_uring completion queue
//! set up with liburing, or any single-producer ring whose producer and
//! consumer counters sit in shared memory — as a source.
//!
//! The ring's owner keeps consuming it its own way (`io_uring_peek_cqe` /
//! `io_uring_cqe_seen`); fastwake only decides *how to wait* until the ring
//! holds something, in every wait mode:
//!
//! - **peek** ([`Source::ready`]): `tail != head`, two loads of the ring's
//!   32-bit counters, no syscall: what poll mode, hybrid spins and a
//!   dispatcher use. The peek handle makes rings dispatchable; io_uring's
//!   own source ([`super::uring`]) shares its code.
//! - **interrupt**: `poll(fd, POLLIN)`, where `fd` is either
//!   - [`RingFd::Level`]: readable exactly while the ring holds entries.
//!     An io_uring fd is: the kernel's `io_uring_poll` reports `POLLIN`
//!     when the CQ is not empty, and checks it after queueing the waiter,
//!     so a completion cannot slip between the re-check and the sleep.
//!   - [`RingFd::EventFd`]: a non-blocking eventfd the producer writes
//!     *after* it publishes the tail (an io_uring registered eventfd, or a
//!     user ring's doorbell). A wake-up drains it; the re-check after the
//!     drain sees every tail published before the write.
//!
//! Taking does not consume: [`Source::try_take`] reports how many entries
//! the ring holds, like `epoll_wait` reports readiness. A caller that does
//! not consume them gets the next wait back at once.
//!
//! Task work: io_uring posts many completions (sockets, timeouts) from
//! task work of the submitting thread. A thread spinning in user space is
//! interrupted to run it (`TWA_SIGNAL`), and one asleep in `poll` or on a
//! dispatcher's futex is woken to run it and goes back to sleep, so every
//! mode sees them — unless the ring was set up with `DEFER_TASKRUN`, whose
//! completions only appear when the owner enters the kernel to get them.
//! Do not use such rings here.

use super::{Peek, Rechecked, Source};
use crate::{Fail, Result};
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// What the ring's fd says when it is readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingFd {
    /// Readable while the ring holds entries (an io_uring fd).
    Level,
    /// A non-blocking eventfd written after each publish; drained on wake.
    EventFd,
}

/// The peek of a ring whose 32-bit consumer (`head`) and producer (`tail`)
/// counters sit in shared memory: `tail != head`, two loads, no syscall.
/// Shared by [`ExternalRing`] and io_uring's own source
/// ([`super::uring::UringSource`]), which differ only in who keeps the
/// counters mapped: the caller of [`ExternalRing::new`] promises it
/// (`K = ()`), the uring source hands the handle a mapping of its own
/// (`K` owns it).
///
/// No [`Peek::counters`] fast path: [`super::Counters`] are two 64-bit
/// counts, ready when `produced > consumed`; these are 32-bit counters
/// that wrap, ready when they differ, which no choice of words and shift
/// turns into that test.
pub(crate) struct RingPeek<K = ()> {
    head: *const AtomicU32,
    tail: *const AtomicU32,
    keep: K,
}

// SAFETY: the counters are atomics in memory kept mapped while the handle
// lives (the contract of `RingPeek::new`); reading them from any thread is
// what they are for. `keep` crosses threads only as far as its type
// allows (the bounds).
unsafe impl<K: Send> Send for RingPeek<K> {}
// SAFETY: as above; the handle only loads the counters.
unsafe impl<K: Sync> Sync for RingPeek<K> {}

impl<K> RingPeek<K> {
    /// # Safety
    /// `head` and `tail` must point to 4-byte aligned counters that stay
    /// mapped for as long as the returned value lives (`keep` may be what
    /// keeps them mapped).
    pub(crate) unsafe fn new(head: *const u32, tail: *const u32, keep: K) -> RingPeek<K> {
        RingPeek {
            head: head.cast(),
            tail: tail.cast(),
            keep,
        }
    }

    /// What keeps the counters mapped.
    pub(crate) fn keep(&self) -> &K {
        &self.keep
    }

    #[inline]
    pub(crate) fn pending(&self) -> u32 {
        // SAFETY: mapped while we live (see `new`). Acquire on the tail
        // pairs with the producer's release store, so the entries below it
        // are visible once the caller reads them.
        unsafe {
            let tail = (*self.tail).load(Ordering::Acquire);
            let head = (*self.head).load(Ordering::Relaxed);
            tail.wrapping_sub(head)
        }
    }
}

impl<K: Send + Sync> Peek for RingPeek<K> {
    fn ready(&self) -> bool {
        self.pending() != 0
    }
}

/// See the [module docs](self).
pub struct ExternalRing {
    c: Arc<RingPeek>,
    /// `c` as the dispatcher's handle (the same allocation).
    peek: Arc<dyn Peek>,
    fd: RawFd,
    kind: RingFd,
}

impl ExternalRing {
    /// A source over the ring whose consumer counter is at `head` and
    /// producer counter at `tail`, with `fd` as its doorbell.
    ///
    /// # Safety
    /// `head` and `tail` must point to 4-byte aligned counters that stay
    /// mapped, and `fd` must stay open, for as long as the source and any
    /// peek handle taken from it live (a dispatcher it was registered with
    /// drops its handle when the waiter is dropped). fastwake only reads
    /// them (and drains an `EventFd`).
    pub unsafe fn new(
        head: *const u32,
        tail: *const u32,
        fd: RawFd,
        kind: RingFd,
    ) -> Result<ExternalRing> {
        if head.is_null() || tail.is_null() {
            return Err(Fail::invalid("ring counters must not be null"));
        }
        if !head.cast::<AtomicU32>().is_aligned() || !tail.cast::<AtomicU32>().is_aligned() {
            return Err(Fail::invalid("ring counters must be 4-byte aligned"));
        }
        if fd < 0 {
            return Err(Fail::new(libc::EBADF, "ring fd is negative"));
        }
        // SAFETY: only borrowed for the fcntl; the caller keeps it open.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let fl = rustix::fs::fcntl_getfl(b).map_err(|e| Fail::os("ring fd", e))?;
        if kind == RingFd::EventFd && !fl.contains(rustix::fs::OFlags::NONBLOCK) {
            // A blocking read after a racing drain would hang the waiter.
            return Err(Fail::invalid(
                "a ring's eventfd must be non-blocking (EFD_NONBLOCK)",
            ));
        }
        // SAFETY: null and alignment checked above; the caller keeps them
        // mapped while the source and its handles live (our own contract).
        let c = Arc::new(unsafe { RingPeek::new(head, tail, ()) });
        Ok(ExternalRing {
            peek: c.clone(),
            c,
            fd,
            kind,
        })
    }

    /// Entries in the ring now.
    pub fn pending(&self) -> u32 {
        self.c.pending()
    }
}

impl Source for ExternalRing {
    /// Entries the ring holds (not consumed: the owner reaps them).
    type Completion = u32;

    fn name(&self) -> &'static str {
        "ring"
    }

    fn ready(&self) -> bool {
        self.c.pending() != 0
    }

    fn try_take(&mut self) -> Result<Option<u32>> {
        Ok(match self.c.pending() {
            0 => None,
            n => Some(n),
        })
    }

    fn arm(&mut self) -> Result<()> {
        // Level: the kernel re-checks under its lock. EventFd: the
        // producer writes after every publish, armed or not.
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        // SAFETY: the caller of `new` keeps the fd open while we live.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        super::wait_readable(fd, timeout, self.kind == RingFd::EventFd, "poll ring fd").map(drop)
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: as in `sleep`; the borrow is tied to &self.
        Some(unsafe { BorrowedFd::borrow_raw(self.fd) })
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(&self.peek)
    }
}
