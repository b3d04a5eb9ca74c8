//! One completion queue shared by many owners, demultiplexed: each
//! completion is routed by a key (an RDMA QP number, part of a `wr_id`)
//! into the *inbox* of its owner, and each inbox is a [`super::Source`] of its
//! own, with the channel's notice protocol. This is the per-core shared
//! CQ: a dispatcher serving many connections polls one queue
//! per pass, whatever their number, and pays for the completions it
//! routes, not for the connections it watches.
//!
//! Hardware-independent: the queue is anything that implements
//! [`SharedQueue`] (a verbs CQ, `source::verbs::SharedCq`; an in-memory
//! queue, [`MemQueue`], which the tests use on hosts without RDMA).
//!
//! # Who polls the queue
//!
//! Whoever needs a completion: an owner whose inbox is empty (in its
//! `try_take`, `ready` or notice request), or the dispatcher once per pass
//! ([`crate::source::Peek::pump`]). Polling and routing happen under a
//! try-lock, in batches, so completions leave the queue and enter the
//! inboxes in the queue's order (order per inbox is kept). A pump that
//! finds the lock taken does not wait: it leaves a request in the lock's
//! word, and the holder polls again before it lets go, so a completion
//! present when any pump started is routed before that pump's caller
//! could miss it (loom model `demux_pump_meets_dispatch_wait`).
//!
//! # Routing into an inbox
//!
//! An inbox's publish word is the channel's (`source::publish`): the
//! router adds each completion with a compare-exchange that clears the
//! owner's requests and, if the owner waited in dispatch mode, pushes the
//! owner's dispatcher a ready notice; if it sleeps in interrupt mode, it
//! rings the inbox's doorbell (an eventfd). An owner that is not waiting
//! costs the router nothing extra.
//!
//! # Completions nobody owns
//!
//! A completion whose key has no inbox is kept, in order, and counted
//! ([`DemuxStats::unrouted`]); it goes to an inbox registered later with
//! its key, or to [`Demux::take_unrouted`]. So do the completions an
//! inbox held when its owner dropped it. Nothing is dropped silently.
//!
//! # Interrupt mode: one event channel for many owners
//!
//! See [`Inbox`]: a sleeping owner waits on its own doorbell and on the
//! queue's event fd (exclusively, so one sleeper per event wakes); the one
//! that gets an event re-arms the queue, polls it and routes, ringing the
//! doorbells of the other sleepers whose inboxes got completions.

mod inbox;
mod mem;

pub use inbox::Inbox;
pub use mem::MemQueue;

use super::Pump;
use crate::sync::{AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{Fail, Result};
use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// A completion queue many owners share; see the [module docs](self).
pub trait SharedQueue: Send + Sync + 'static {
    /// One completion.
    type Item: Send + 'static;

    /// Append the completions the queue holds, up to a batch, to `out`.
    /// Only one thread at a time calls this (the demultiplexer's pump
    /// lock), so the queue's order is the order of routing.
    fn poll(&self, out: &mut Vec<Self::Item>) -> Result<()>;

    /// The key the completion is routed by.
    fn key(&self, item: &Self::Item) -> u64;

    /// Ask for an event on [`SharedQueue::event_fd`] when the next
    /// completion arrives (one-shot, as `ibv_req_notify_cq`). The default:
    /// no event path, so only poll and dispatch modes can wait.
    fn arm(&self) -> Result<()> {
        Err(Fail::invalid(
            "this shared queue has no event path: only poll and dispatch modes can wait on it",
        ))
    }

    /// The fd that becomes readable when an armed queue gets a completion.
    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Consume the event that made the event fd readable, if it is still
    /// there (another sleeper may have taken it). Never blocks.
    fn take_event(&self) -> Result<()> {
        Ok(())
    }
}

/// Counters of a [`Demux`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DemuxStats {
    /// Pumps that found completions to route (an empty pump, most of a
    /// polling dispatcher's, is not counted).
    pub pumps: u64,
    /// Pumps that found another thread pumping and left it their request.
    pub handed_over: u64,
    /// Completions routed into an inbox.
    pub routed: u64,
    /// Completions that came for a key with no inbox, or were left in a
    /// dropped inbox (kept).
    pub unrouted: u64,
    /// Ready notices the routing pushed (owners waiting in dispatch mode).
    pub notices: u64,
    /// Doorbells the routing rang (owners asleep in interrupt mode).
    pub rings: u64,
}

/// The demultiplexer of one shared queue: make one per queue, then an
/// [`Inbox`] per owner ([`Demux::inbox`]).
pub struct Demux<Q: SharedQueue> {
    core: Arc<Core<Q>>,
}

impl<Q: SharedQueue> Clone for Demux<Q> {
    fn clone(&self) -> Self {
        Demux {
            core: Arc::clone(&self.core),
        }
    }
}

/// The pump lock's word: `BUSY` while a thread polls and routes, `WANT`
/// when another pump came meanwhile. One word, so that leaving a request
/// and letting go are read-modify-writes of one location: totally
/// ordered, no fence (the holder's release fails if a request came).
const BUSY: u32 = 1;
const WANT: u32 = 2;

/// What a [`Demux`], its inboxes and their peek handles share.
pub(crate) struct Core<Q: SharedQueue> {
    pub(crate) queue: Q,
    state: AtomicU32,
    inner: Mutex<Routes<Q::Item>>,
    /// errno of a failed poll (0: none): the queue is closed for good.
    failed: AtomicU32,
    pumps: AtomicU64,
    handed_over: AtomicU64,
    routed: AtomicU64,
    unrouted: AtomicU64,
    notices: AtomicU64,
    rings: AtomicU64,
}

struct Routes<T> {
    map: HashMap<u64, Arc<inbox::Shared<T>>>,
    kept: VecDeque<T>,
    batch: Vec<T>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<Q: SharedQueue> Demux<Q> {
    /// Demultiplex `queue`.
    pub fn new(queue: Q) -> Demux<Q> {
        Demux {
            core: Arc::new(Core {
                queue,
                state: AtomicU32::new(0),
                inner: Mutex::new(Routes {
                    map: HashMap::new(),
                    kept: VecDeque::new(),
                    batch: Vec::new(),
                }),
                failed: AtomicU32::new(0),
                pumps: AtomicU64::new(0),
                handed_over: AtomicU64::new(0),
                routed: AtomicU64::new(0),
                unrouted: AtomicU64::new(0),
                notices: AtomicU64::new(0),
                rings: AtomicU64::new(0),
            }),
        }
    }

    /// The shared queue.
    pub fn queue(&self) -> &Q {
        &self.core.queue
    }

    /// The inbox of the owner of `key`: a source of the completions routed
    /// to it. Completions kept for `key` so far come first. Fails when
    /// `key` already has an inbox.
    pub fn inbox(&self, key: u64) -> Result<Inbox<Q>> {
        let shared = Arc::new(inbox::Shared::new(key));
        {
            let mut r = lock(&self.core.inner);
            if r.map.contains_key(&key) {
                return Err(Fail::invalid(format!(
                    "shared queue: key {key} already has an inbox"
                )));
            }
            let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut r.kept)
                .into_iter()
                .partition(|c| self.core.queue.key(c) == key);
            r.kept = rest;
            // Nobody sleeps on an inbox not made yet: no doorbell.
            for c in mine {
                self.core.deliver(&shared, c);
            }
            r.map.insert(key, Arc::clone(&shared));
        }
        Ok(Inbox::new(Arc::clone(&self.core), shared))
    }

    /// Take the completions kept because their key had no inbox, in
    /// order (each was counted in [`DemuxStats::unrouted`]).
    pub fn take_unrouted(&self) -> Vec<Q::Item> {
        self.take_unrouted_at_most(usize::MAX)
    }

    /// [`Demux::take_unrouted`], the oldest `max` of them at most (the rest
    /// stay kept).
    pub fn take_unrouted_at_most(&self, max: usize) -> Vec<Q::Item> {
        let mut r = lock(&self.core.inner);
        let n = r.kept.len().min(max);
        r.kept.drain(..n).collect()
    }

    /// Poll the queue and route what it holds (what a dispatcher does
    /// once per pass).
    pub fn pump(&self) {
        self.core.pump();
    }

    /// Counters so far.
    pub fn stats(&self) -> DemuxStats {
        let c = &*self.core;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DemuxStats {
            pumps: get(&c.pumps),
            handed_over: get(&c.handed_over),
            routed: get(&c.routed),
            unrouted: get(&c.unrouted),
            notices: get(&c.notices),
            rings: get(&c.rings),
        }
    }
}

impl<Q: SharedQueue> Core<Q> {
    /// The queue failed for good: its errno.
    pub(crate) fn failed(&self) -> Option<Fail> {
        match self.failed.load(Ordering::Acquire) {
            0 => None,
            e => Some(Fail::new(
                e as i32,
                format!("shared completion queue failed (errno {e})"),
            )),
        }
    }

    /// See [`Pump::pump`] and the module docs.
    pub(crate) fn pump(&self) {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            // Free: take it (clearing a request left on a free word: this
            // poll serves it). Taken: leave a request with a release RMW,
            // so the holder's next read of the word also sees whatever
            // completion made us pump.
            let (new, take) = if cur & BUSY == 0 {
                (BUSY, true)
            } else {
                (cur | WANT, false)
            };
            match self
                .state
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if take => break,
                Ok(_) => {
                    self.handed_over.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(now) => cur = now,
            }
        }
        // The doorbells of the owners asleep in interrupt mode that got
        // completions, rung once the lock is let go: a woken owner on the
        // router's CPU preempts it at once when the router is a
        // SCHED_IDLE dispatcher, and a router preempted while it holds the
        // lock leaves every other pump a request it cannot serve until the
        // CPU idles (seen under TCG: 5,578 pumps handed over to a
        // preempted dispatcher in one run, every dispatch wait fell back).
        let mut wake = Vec::new();
        loop {
            self.drain(&mut wake);
            // Let go unless a request came meanwhile; then clear it
            // (reading it: acquire), ring what this pass routed (a later
            // pass must not hold the first sleepers' wake-ups) and poll
            // again.
            match self
                .state
                .compare_exchange(BUSY, 0, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    ring(&mut wake);
                    return;
                }
                Err(_) => {
                    self.state.swap(BUSY, Ordering::AcqRel);
                    ring(&mut wake);
                }
            }
        }
    }

    /// Poll until the queue is empty and route every completion, adding
    /// the doorbells to ring to `wake`. Holds the pump lock.
    fn drain(&self, wake: &mut Vec<Arc<inbox::Shared<Q::Item>>>) {
        if self.failed.load(Ordering::Relaxed) != 0 {
            return;
        }
        let mut r = lock(&self.inner);
        let r = &mut *r;
        let mut polls = 0;
        loop {
            if let Err(e) = self.queue.poll(&mut r.batch) {
                self.fail(e, r);
                return;
            }
            if r.batch.is_empty() {
                if polls > 0 {
                    // Counted only here: an empty pump (most of a
                    // dispatcher's passes) must not write a shared line.
                    self.pumps.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            polls += 1;
            for c in r.batch.drain(..) {
                match r.map.get(&self.queue.key(&c)) {
                    Some(inbox) => {
                        if self.deliver(inbox, c) {
                            wake.push(Arc::clone(inbox));
                        }
                    }
                    None => {
                        self.unrouted.fetch_add(1, Ordering::Relaxed);
                        r.kept.push_back(c);
                    }
                }
            }
        }
    }

    /// Route `c` into `inbox` (the pump lock or the routes' lock held:
    /// one router at a time); true when its owner sleeps and its doorbell
    /// is to be rung (counted here).
    fn deliver(&self, inbox: &inbox::Shared<Q::Item>, c: Q::Item) -> bool {
        self.routed.fetch_add(1, Ordering::Relaxed);
        let (notified, asleep) = inbox.deliver(c);
        if notified {
            self.notices.fetch_add(1, Ordering::Relaxed);
        }
        if asleep {
            self.rings.fetch_add(1, Ordering::Relaxed);
        }
        asleep
    }

    /// A poll failed: the queue is closed for every owner. Each is told as
    /// a producer's close tells a channel's consumer: a notice if it
    /// asked, and its doorbell.
    fn fail(&self, e: Fail, r: &mut Routes<Q::Item>) {
        let errno = e.errno().unsigned_abs().max(1);
        self.failed.store(errno, Ordering::Release);
        for inbox in r.map.values() {
            inbox.close();
        }
    }

    /// Stop routing to `inbox` (its owner dropped it). What it held and
    /// its owner never took is kept, as every later completion for its
    /// key (none of its key is kept yet: they went to the inbox, so the
    /// order per key holds).
    pub(crate) fn remove(&self, inbox: &Arc<inbox::Shared<Q::Item>>) {
        let mut r = lock(&self.inner);
        if r.map.get(&inbox.key).is_some_and(|i| Arc::ptr_eq(i, inbox)) {
            r.map.remove(&inbox.key);
            let left = inbox.take_all();
            self.unrouted
                .fetch_add(left.len() as u64, Ordering::Relaxed);
            r.kept.extend(left);
        }
    }
}

/// Ring the doorbells in `wake` (emptied).
fn ring<T>(wake: &mut Vec<Arc<inbox::Shared<T>>>) {
    for inbox in wake.drain(..) {
        inbox.ring();
    }
}

impl<Q: SharedQueue> Pump for Core<Q> {
    fn pump(&self) {
        Core::pump(self);
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
