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
//! # Ready notices (opt-in)
//!
//! A dispatcher peeks a ring made with [`ExternalRing::new`] on every
//! pass while its owner waits: the cost of a pass grows with the rings it
//! watches. A ring made with [`ExternalRing::with_notices`] instead has a
//! producer side, [`RingProducer`] ([`ExternalRing::producer`]): the
//! caller's producer calls [`RingProducer::published`] after each publish
//! of the tail, and a dispatcher serves the ring through ready notices,
//! as it serves a channel: the owner asks for a notice as it announces a
//! dispatch-mode wait, the producer's call pushes it only then, and a
//! pass pops what became ready and peeks nothing else. The request word
//! is fastwake's own (the counters are the caller's), so the call costs
//! a producer whose owner is not waiting one SeqCst fence and one load
//! from its own cache; the protocol, why it loses nothing and what it
//! costs are in [`producer`].
//!
//! Opt-in because a ring served by notices is not peeked by passes: a
//! producer that does not call it (the kernel filling an io_uring CQ, or
//! code that forgets) leaves its owner to the dispatcher's safety net,
//! which peeks a few noticed sources now and then and counts each wait it
//! finds ready without a notice (`DispatchStats::scan_found`,
//! `TaskStats::scan_found`): served late, never lost. Notices do not
//! replace the doorbell: an owner the dispatcher hands back to interrupt
//! mode (it went idle) sleeps on the fd as before.
//!
//! Task work: io_uring posts many completions (sockets, timeouts) from
//! task work of the submitting thread. A thread spinning in user space is
//! interrupted to run it (`TWA_SIGNAL`), and one asleep in `poll` or on a
//! dispatcher's futex is woken to run it and goes back to sleep, so every
//! mode sees them — unless the ring was set up with `DEFER_TASKRUN`, whose
//! completions only appear when the owner enters the kernel to get them.
//! Do not use such rings here.

pub mod producer;

use super::notice::Notifier;
use super::{Peek, Rechecked, Source};
use crate::sync::{AtomicU32, Ordering};
use crate::{Fail, Result};
use producer::Requests;
pub use producer::RingProducer;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;
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

    /// The consumer's counter (the owner's own: current when the owner
    /// reads it).
    #[inline]
    fn head(&self) -> u32 {
        // SAFETY: mapped while we live (see `new`).
        unsafe { (*self.head).load(Ordering::Relaxed) }
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

/// An [`ExternalRing`]'s handle: the counters' peek, and with notices
/// the request word its producer answers.
struct ExternalPeek {
    ring: RingPeek,
    requests: Option<Arc<Requests>>,
}

impl ExternalPeek {
    #[inline]
    fn ready(&self) -> bool {
        self.ring.pending() != 0
    }
}

impl Peek for ExternalPeek {
    fn ready(&self) -> bool {
        ExternalPeek::ready(self)
    }

    fn attach_notices(&self, notifier: Notifier) -> bool {
        match &self.requests {
            Some(r) => {
                r.attach(notifier);
                true
            }
            None => false,
        }
    }

    fn detach_notices(&self) {
        if let Some(r) = &self.requests {
            r.detach();
        }
    }

    fn arm_notice(&self) -> Option<bool> {
        let r = self.requests.as_ref()?;
        Some(r.arm(self.ring.head(), || self.ready()))
    }
}

/// See the [module docs](self).
pub struct ExternalRing {
    c: Arc<ExternalPeek>,
    /// `c` as the dispatcher's handle (the same allocation).
    peek: Arc<dyn Peek>,
    fd: RawFd,
    kind: RingFd,
}

impl ExternalRing {
    /// A source over the ring whose consumer counter is at `head` and
    /// producer counter at `tail`, with `fd` as its doorbell. A
    /// dispatcher peeks it on every pass while its owner waits (see
    /// [`ExternalRing::with_notices`] for O(ready) service).
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
        // SAFETY: our own contract, passed on.
        unsafe { Self::make(head, tail, fd, kind, false) }
    }

    /// As [`ExternalRing::new`], for a ring whose producer calls
    /// [`RingProducer::published`] after every publish of the tail (get
    /// the handle from [`ExternalRing::producer`]): a dispatcher then
    /// serves it through ready notices instead of peeking it every pass
    /// (see the [module docs](self)). The producer must still write `fd`
    /// as [`RingFd`] says: an owner the dispatcher hands back to interrupt
    /// mode sleeps on it.
    ///
    /// # Safety
    /// As [`ExternalRing::new`].
    pub unsafe fn with_notices(
        head: *const u32,
        tail: *const u32,
        fd: RawFd,
        kind: RingFd,
    ) -> Result<ExternalRing> {
        // SAFETY: our own contract, passed on.
        unsafe { Self::make(head, tail, fd, kind, true) }
    }

    /// The producer's handle: see [`RingProducer::published`]. `EINVAL`
    /// for a ring made with [`ExternalRing::new`] (it takes no notices).
    pub fn producer(&self) -> Result<RingProducer> {
        match &self.c.requests {
            Some(r) => Ok(RingProducer::new(r.clone())),
            None => Err(Fail::invalid(
                "this ring takes no notices (make it with ExternalRing::with_notices)",
            )),
        }
    }

    /// # Safety
    /// As [`ExternalRing::new`].
    unsafe fn make(
        head: *const u32,
        tail: *const u32,
        fd: RawFd,
        kind: RingFd,
        notices: bool,
    ) -> Result<ExternalRing> {
        if head.is_null() || tail.is_null() {
            return Err(Fail::invalid("ring counters must not be null"));
        }
        if !head.is_aligned() || !tail.is_aligned() {
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
        let ring = unsafe { RingPeek::new(head, tail, ()) };
        let c = Arc::new(ExternalPeek {
            ring,
            // SAFETY: the tail as the ring's handle reads it (checked and
            // kept mapped as above); a producer stores it right before
            // each call, so it is mapped then too.
            requests: notices.then(|| unsafe { Requests::new(tail) }),
        });
        Ok(ExternalRing {
            peek: c.clone(),
            c,
            fd,
            kind,
        })
    }

    /// Entries in the ring now.
    pub fn pending(&self) -> u32 {
        self.c.ring.pending()
    }
}

impl Source for ExternalRing {
    /// Entries the ring holds (not consumed: the owner reaps them).
    type Completion = u32;

    fn name(&self) -> &'static str {
        "ring"
    }

    fn ready(&self) -> bool {
        self.c.ready()
    }

    fn try_take(&mut self) -> Result<Option<u32>> {
        Ok(match self.c.ring.pending() {
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
