//! Ready notices for a caller-owned ring: the producer's call
//! ([`RingProducer::published`]) and the owner's request (the ring
//! handle's [`super::super::Peek::arm_notice`]).
//!
//! # The protocol
//!
//! The channel answers a notice request in the compare-exchange that
//! publishes: the request is a bit of the word the producer publishes
//! with, and two read-modify-writes of one word are totally ordered. A
//! caller-owned ring's published word, its tail, is the caller's, stored
//! the caller's way; the request has to live in a word of fastwake's
//! (here, on the heap, shared by the ring's handle and its producer
//! handles). Two threads, two words, each thread writes one and then
//! reads the other: the Dekker pattern, which needs a full (store→load)
//! barrier on both sides.
//!
//! A request names the head the owner waits beyond (`want << 1 | 1`),
//! and only a publish beyond it answers it. The steps:
//!
//! - owner, `arm_notice` as it announces a wait, its head being `h`:
//!   - O1: `request.swap(h << 1 | 1, AcqRel)`;
//!   - O2: `fence(SeqCst)`;
//!   - O3: `tail.load(Acquire) != h`: the answer, "ready now" (then the
//!     owner does not wait, and its request costs at most one stale
//!     notice).
//! - producer, [`RingProducer::published`], after the caller's own
//!   `tail.store(t, Release)` (P1):
//!   - P2: `fence(SeqCst)`;
//!   - P3: `w = request.load(Relaxed)`; only if `w` holds a request
//!     (odd): read the tail again (`t' >= t`), and if `t'` is beyond the
//!     request's `want`, `compare_exchange(w, w & !1, AcqRel)` (retried
//!     on a new value), and if that succeeds, push the notice to the
//!     attached [`Notifier`].
//!
//! **Why no notice is lost.** SeqCst fences are totally ordered. If P2
//! comes before O2, then O3, after O2, reads the tail of P1 or a later
//! one (C++ `[atomics.order]`: a load after a SeqCst fence observes a
//! store sequenced before an earlier SeqCst fence, or a later one): the
//! owner sees the completion (unless it consumed it already: then
//! nothing is owed) and does not wait. If O2 comes before P2, P3 reads
//! the request of O1 or a later value: a later request (its owner
//! stopped waiting on this one), or another producer's answer, which
//! pushed a notice after a tail beyond `want`. So the request is
//! answered, once, by a publish beyond `want`; and the notice is pushed
//! after that tail was stored, so the dispatcher that pops it sees the
//! ring ready.
//!
//! **Why the request names the head.** The caller's consumer reads the
//! real tail, so the owner may see a completion before its producer's
//! call: a producer that finds a request (P3) may be held up while the
//! owner takes that completion itself and asks again. An answer that did
//! not look at `want` would answer the new request with a notice for the
//! old completion (stale: the dispatcher peeks, finds the ring empty and
//! drops it), and the next publish, finding no request, would push
//! nothing: the owner would wait for the safety net. The loom model
//! `ring_notice_meets_dispatch_wait` (`dispatch/loom_tests.rs`), which
//! runs this code, found that race in a first version whose request was
//! one bit; it fails without P2 too.
//!
//! **Why read-modify-writes where a store (O1) would do for the Dekker
//! alone:** the notifier, which a dispatcher attaches on another thread
//! (`attach`: a pointer store, then an RMW of the request word, then one
//! peek of the ring). An answer acquires the word: if it reads from the
//! attach's RMW, or from an owner's request made after it (an RMW, so it
//! continues the attach's release sequence; a plain store would end it),
//! it sees the notifier. If the attach's RMW comes after the answer
//! instead, it reads from the answer, a release after P1, and the
//! dispatcher's peek sees the tail. Either way a completion published
//! around an attach is notified or peeked.
//!
//! # What it costs
//!
//! A producer whose owner is not waiting pays P2 and one load of a word
//! that stays in its cache (nobody writes it until the owner asks
//! again): on x86-64, a `lock or` on the stack and an L1 load. The
//! fence is what the ordering strictly requires: the request and the
//! tail are different words, and without a store→load barrier the
//! producer's read of the request may be satisfied before its tail store
//! is visible to the owner, while the owner's read of the tail misses the
//! store too. It has one cost a bare store has not: it waits until the
//! tail store has reached the cache, so when the consumer just read the
//! tail, the line transfer the store buffer would have hidden is paid
//! here. A producer whose owner waits also reads the tail again, pays the
//! compare-exchange (the request's line comes from the owner's core) and
//! the push. `examples/ring_published.rs` measures both cases
//! (docs/design/dispatcher.md has the figures). Moving the barrier to the owner's
//! side (an asymmetric fence, `membarrier`) would make it a syscall and
//! an interrupt of every CPU running the process per wait: not for a
//! wait per completion.

use crate::source::attached::Attached;
use crate::source::notice::Notifier;
use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};
use std::sync::Arc;

/// The request word is odd while a notice is requested; the bits above
/// are the head the owner waits beyond.
const REQUESTED: u64 = 1;

/// Is tail `t` beyond head `h`? (32-bit counters that wrap.)
#[inline]
fn beyond(t: u32, h: u32) -> bool {
    (t.wrapping_sub(h) as i32) > 0
}

/// The request word and the notifier that answers it, shared by a ring's
/// handle and its producer handles.
///
/// Aligned to a cache line, so the `Arc` puts the word on a line of its
/// own (its counts on the line before): the producer reads it on every
/// publish, and a write to a neighbouring heap object must not take the
/// line away (docs/design/dispatcher.md, "False sharing in the heap").
#[repr(C, align(64))]
pub(crate) struct Requests {
    word: AtomicU64,
    /// The ring's tail, read only by an answer (see `new`).
    tail: *const AtomicU32,
    notifier: Attached<Notifier>,
}

// SAFETY: `tail` is an atomic in memory the producer keeps mapped while
// it calls `published` (the contract of `new`); reading it from any
// thread is what it is for. The rest is atomics and a lock.
unsafe impl Send for Requests {}
// SAFETY: as above; the tail is only loaded.
unsafe impl Sync for Requests {}

impl Requests {
    /// # Safety
    /// `tail` must point to the ring's 4-byte aligned tail counter, mapped
    /// whenever a producer calls [`RingProducer::published`] (it just
    /// stored it) and whenever the owner asks for a notice.
    pub(crate) unsafe fn new(tail: *const u32) -> Arc<Requests> {
        Arc::new(Requests {
            word: AtomicU64::new(0),
            tail: tail.cast(),
            notifier: Attached::default(),
        })
    }

    /// Owner (O1-O3), whose head is `head`: ask for a notice of the next
    /// publish beyond it, then return `ready()`, the ring's emptiness
    /// test (its tail load is O3).
    pub(crate) fn arm(&self, head: u32, ready: impl FnOnce() -> bool) -> bool {
        self.word
            .swap((head as u64) << 1 | REQUESTED, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        ready()
    }

    /// Push notices to `n` from now on; the caller peeks the ring once
    /// afterwards (see the module docs for why the RMW).
    pub(crate) fn attach(&self, n: Notifier) {
        self.notifier.attach(n, Notifier::same_as);
        self.word.fetch_or(0, Ordering::AcqRel);
    }

    pub(crate) fn detach(&self) {
        self.notifier.detach();
    }

    /// Producer (P2-P3), after its tail store.
    #[inline]
    fn published(&self) {
        fence(Ordering::SeqCst);
        let w = self.word.load(Ordering::Relaxed);
        if w & REQUESTED != 0 {
            self.answer(w);
        }
    }

    /// Request word `w` was seen: answer the request it holds, if the
    /// tail is beyond it and no one answered or replaced it meanwhile.
    /// Out of line, so the common path stays small.
    #[inline(never)]
    fn answer(&self, mut w: u64) {
        // SAFETY: mapped while a producer calls `published` (`new`).
        // Relaxed: this thread (or another producer, before the request
        // was seen) stored it; the notice's push orders it for the
        // dispatcher.
        let tail = unsafe { (*self.tail).load(Ordering::Relaxed) };
        while w & REQUESTED != 0 && beyond(tail, (w >> 1) as u32) {
            match self
                .word
                .compare_exchange(w, w & !REQUESTED, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if let Some(n) = self.notifier.get() {
                        n.notify();
                    }
                    return;
                }
                Err(now) => w = now,
            }
        }
    }
}

/// The producer's handle on a caller-owned ring made with
/// [`super::ExternalRing::with_notices`] (from
/// [`super::ExternalRing::producer`]): cheap to clone, usable from any
/// thread. It reads the ring's tail only in [`RingProducer::published`],
/// so it may outlive the ring's memory if it is not called then.
#[derive(Clone)]
pub struct RingProducer {
    requests: Arc<Requests>,
}

impl std::fmt::Debug for RingProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingProducer").finish_non_exhaustive()
    }
}

impl RingProducer {
    pub(crate) fn new(requests: Arc<Requests>) -> RingProducer {
        RingProducer { requests }
    }

    /// Call after every publish of the ring's tail (after your own
    /// release store of it, on the thread that made it, while the ring's
    /// memory is mapped): if the ring's
    /// owner waits in dispatch mode and asked for a notice, this pushes
    /// it to the owner's dispatcher. Otherwise it costs one SeqCst fence
    /// and one load of a word in this core's cache (see the [module
    /// docs](self) for why the fence is needed and what it costs).
    ///
    /// A publish without this call is not lost: the owner is still woken
    /// through the ring's fd when it sleeps in interrupt mode, and a
    /// dispatcher's safety net finds a waiting owner's ring ready (late,
    /// and counted as `scan_found`); but a ring made with notices is not
    /// peeked every pass, so skipping the call makes its hand-offs slow.
    #[inline]
    pub fn published(&self) {
        self.requests.published();
    }
}
