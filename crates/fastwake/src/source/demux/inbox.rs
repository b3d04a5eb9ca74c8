//! One owner's inbox of a demultiplexed shared queue: the [`Source`] its
//! owner waits on ([`Inbox`], whose docs say how it sleeps), and the
//! [`Peek`] handle its dispatcher watches.
//!
//! The inbox's state is a publish word (`source::publish`), a consumer
//! count and the routed completions, in order. Only routers (one at a
//! time: the demultiplexer's lock) add; only the owner takes.

use super::{Core, SharedQueue};
use crate::source::notice::Notifier;
use crate::source::publish::{ARMED, HEAD_SHIFT, NOTICE, publish};
use crate::source::{Counters, Peek, Pump, Rechecked, Source, attached::Attached};
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};
use crate::{Fail, Result};
use rustix::event::epoll;
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A value in a cache line of its own: the router writes the publish
/// word, the owner its count.
#[repr(align(64))]
struct Line<T>(T);

/// What the owner, its peek handle and the routers share.
pub(crate) struct Shared<T> {
    /// `head << 2 | notice << 1 | armed`.
    word: Line<AtomicU64>,
    /// Completions taken by the owner.
    tail: Line<AtomicU64>,
    items: Mutex<VecDeque<T>>,
    notifier: Attached<Notifier>,
    /// The owner's doorbell, made on its first arm (owners that only
    /// poll or wait in dispatch mode never need one).
    doorbell: OnceLock<OwnedFd>,
    /// The shared queue failed: no completion will come again.
    closed: AtomicU32,
    pub(crate) key: u64,
}

impl<T> Shared<T> {
    pub(crate) fn new(key: u64) -> Shared<T> {
        Shared {
            word: Line(AtomicU64::new(0)),
            tail: Line(AtomicU64::new(0)),
            items: Mutex::new(VecDeque::new()),
            notifier: Attached::default(),
            doorbell: OnceLock::new(),
            closed: AtomicU32::new(0),
            key,
        }
    }

    /// Router: add `c` and answer the owner's requests. Returns (notice
    /// pushed, doorbell to ring): the router rings it with [`Shared::ring`]
    /// once it has let go of the pump lock (see `Core::pump`).
    pub(crate) fn deliver(&self, c: T) -> (bool, bool) {
        super::lock(&self.items).push_back(c);
        // Only routers move the head, one at a time.
        let head = self.word.0.load(Ordering::Relaxed) >> HEAD_SHIFT;
        let prev = publish(&self.word.0, head, 1);
        let notified = prev & NOTICE != 0 && self.notify();
        let asleep = prev & ARMED != 0 && self.doorbell.get().is_some();
        (notified, asleep)
    }

    fn notify(&self) -> bool {
        self.notifier.get().map(Notifier::notify).is_some()
    }

    pub(crate) fn ring(&self) -> bool {
        // A failed write means the counter is saturated: a wake-up is
        // pending anyway.
        self.doorbell
            .get()
            .map(|fd| rustix::io::write(fd, &1u64.to_ne_bytes()))
            .is_some()
    }

    /// The queue failed: tell the owner as a channel's close does (a
    /// notice first, if it asked: the doorbell is a syscall).
    pub(crate) fn close(&self) {
        self.closed.store(1, Ordering::Release);
        if self.word.0.fetch_and(!NOTICE, Ordering::AcqRel) & NOTICE != 0 {
            self.notify();
        }
        self.ring();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) != 0
    }

    /// A completion is here (or the queue failed); from any thread.
    fn ready_now(&self) -> bool {
        // The count first: it only grows up to the head.
        let tail = self.tail.0.load(Ordering::Acquire);
        (self.word.0.load(Ordering::Acquire) >> HEAD_SHIFT) > tail || self.is_closed()
    }

    /// What is left when the owner is gone (routes' lock held: no router
    /// adds meanwhile).
    pub(crate) fn take_all(&self) -> VecDeque<T> {
        std::mem::take(&mut *super::lock(&self.items))
    }

    /// Owner: take the oldest completion.
    fn take(&self) -> Option<T> {
        let t = self.tail.0.load(Ordering::Relaxed);
        if self.word.0.load(Ordering::Acquire) >> HEAD_SHIFT <= t {
            return None;
        }
        // Pushed before it was published: it is there.
        let c = super::lock(&self.items).pop_front();
        self.tail.0.store(t + 1, Ordering::Release);
        c
    }
}

/// One owner's inbox: a [`Source`] of the completions routed to its key;
/// made by [`super::Demux::inbox`].
///
/// Interrupt mode, where many owners share one event channel: arming sets
/// the inbox's `ARMED` bit (so a router rings this inbox's doorbell, an
/// eventfd) and arms the shared queue (so its next completion raises an
/// event). A sleeper waits on its doorbell and, through an epoll set of
/// its own, on the queue's event fd with `EPOLLEXCLUSIVE`: an event wakes
/// one sleeper (not all of them), which consumes it, re-arms the queue
/// (the others still sleep, and the arm was one-shot), then polls and
/// routes, ringing the doorbells of whichever sleepers got completions.
pub struct Inbox<Q: SharedQueue> {
    core: Arc<Core<Q>>,
    shared: Arc<Shared<Q::Item>>,
    peek: Arc<dyn Peek>,
    /// The sleeper's epoll set (doorbell, queue's event fd), made on its
    /// first sleep.
    epoll: Option<OwnedFd>,
}

impl<Q: SharedQueue> Inbox<Q> {
    pub(super) fn new(core: Arc<Core<Q>>, shared: Arc<Shared<Q::Item>>) -> Inbox<Q> {
        if core.failed().is_some() {
            shared.close();
        }
        Inbox {
            peek: Arc::new(InboxPeek {
                core: Arc::clone(&core),
                shared: Arc::clone(&shared),
            }),
            core,
            shared,
            epoll: None,
        }
    }

    /// The key this inbox gets the completions of.
    pub fn key(&self) -> u64 {
        self.shared.key
    }

    fn epoll(&mut self) -> Result<&OwnedFd> {
        if self.epoll.is_none() {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
                .map_err(|e| Fail::os("epoll_create (inbox)", e))?;
            let bell = self
                .shared
                .doorbell
                .get()
                .ok_or_else(|| Fail::invalid("inbox: sleep before arm"))?;
            epoll::add(
                &ep,
                bell,
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )
            .map_err(|e| Fail::os("epoll_ctl (inbox doorbell)", e))?;
            if let Some(fd) = self.core.queue.event_fd() {
                // Exclusive: one event wakes one of the queue's sleepers,
                // which routes for the others.
                epoll::add(
                    &ep,
                    fd,
                    epoll::EventData::new_u64(1),
                    epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE,
                )
                .map_err(|e| Fail::os("epoll_ctl (shared queue events)", e))?;
            }
            self.epoll = Some(ep);
        }
        Ok(self.epoll.as_ref().expect("made above"))
    }
}

impl<Q: SharedQueue> Source for Inbox<Q> {
    type Completion = Q::Item;

    fn name(&self) -> &'static str {
        "demux"
    }

    fn ready(&self) -> bool {
        self.peek.ready()
    }

    fn try_take(&mut self) -> Result<Option<Q::Item>> {
        if let Some(c) = self.shared.take() {
            return Ok(Some(c));
        }
        self.core.pump();
        if let Some(c) = self.shared.take() {
            return Ok(Some(c));
        }
        if self.shared.is_closed() {
            return Err(self
                .core
                .failed()
                .unwrap_or_else(|| Fail::closed("shared completion queue closed")));
        }
        Ok(None)
    }

    fn arm(&mut self) -> Result<()> {
        if self.shared.doorbell.get().is_none() {
            let fd = rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .map_err(|e| Fail::os("eventfd (inbox doorbell)", e))?;
            // Only the owner sets it, and before its first ARMED: a router
            // that sees the bit sees the doorbell.
            let _ = self.shared.doorbell.set(fd);
        }
        self.shared.word.0.fetch_or(ARMED, Ordering::AcqRel);
        // The caller's re-check (`ready`) polls the queue after this, so a
        // completion that came before the arm is routed, not missed.
        self.core.queue.arm()
    }

    fn disarm(&mut self) {
        let w = &self.shared.word.0;
        if w.load(Ordering::Relaxed) & ARMED != 0 {
            w.fetch_and(!ARMED, Ordering::AcqRel);
        }
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        let mut evs = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 2];
        let ep = self.epoll()?;
        let got = match epoll::wait(ep, &mut evs, ts.as_ref()) {
            Ok((got, _)) => got,
            Err(rustix::io::Errno::INTR) => return Ok(()),
            Err(e) => return Err(Fail::os("epoll_wait (inbox)", e)),
        };
        let mut event = false;
        for ev in got.iter() {
            if ev.data.u64() == 0 {
                let bell = self.shared.doorbell.get().expect("armed before sleeping");
                let _ = rustix::io::read(bell.as_fd(), &mut [0u8; 8]);
            } else {
                event = true;
            }
        }
        if event {
            // The arm was one-shot and others may sleep on it: re-arm
            // before routing, so a completion after the poll below raises
            // the next event.
            self.core.queue.take_event()?;
            self.core.queue.arm()?;
            self.core.pump();
        }
        Ok(())
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(&self.peek)
    }
}

impl<Q: SharedQueue> Drop for Inbox<Q> {
    fn drop(&mut self) {
        self.core.remove(&self.shared);
    }
}

/// The dispatcher's handle on an inbox: the inbox's counters, and the
/// shared queue as its pump.
struct InboxPeek<Q: SharedQueue> {
    core: Arc<Core<Q>>,
    shared: Arc<Shared<Q::Item>>,
}

impl<Q: SharedQueue> Peek for InboxPeek<Q> {
    /// The inbox, and if it is empty the shared queue (polled and routed:
    /// a completion still in the queue is this source's too).
    fn ready(&self) -> bool {
        if self.shared.ready_now() {
            return true;
        }
        self.core.pump();
        self.shared.ready_now()
    }

    fn attach_notices(&self, notifier: Notifier) -> bool {
        self.shared.notifier.attach(notifier, Notifier::same_as);
        // As the channel's: a read-modify-write of the publish word after
        // the store, so a publish before it is seen by the caller's peek
        // and one after it sees the notifier.
        self.shared.word.0.fetch_or(0, Ordering::AcqRel);
        true
    }

    fn detach_notices(&self) {
        self.shared.notifier.detach();
    }

    fn arm_notice(&self) -> Option<bool> {
        let w = self.shared.word.0.fetch_or(NOTICE, Ordering::AcqRel);
        // The owner's own count: the caller is the owner.
        let tail = self.shared.tail.0.load(Ordering::Relaxed);
        if (w >> HEAD_SHIFT) > tail || self.shared.is_closed() {
            return Some(true);
        }
        // What is still in the shared queue: routing it answers the
        // request just made (a notice that comes with it is stale).
        self.core.pump();
        Some(self.shared.ready_now())
    }

    fn counters(&self) -> Option<Counters<'_>> {
        Some(Counters {
            produced: &self.shared.word.0,
            shift: HEAD_SHIFT,
            consumed: &self.shared.tail.0,
            next_at: None,
        })
    }

    fn pump(&self) -> Option<Arc<dyn Pump>> {
        Some(Arc::clone(&self.core) as Arc<dyn Pump>)
    }
}
