//! Ready notices: a dispatcher's list of "this source became ready",
//! pushed by producers, so a dispatcher pays for what is ready, not for
//! what it watches (the role of epoll's ready list, or of an RDMA NIC's
//! event queue in the FastWake paper).
//!
//! # Who pushes, and when
//!
//! A producer pushes its source's index only when the source's *owner*
//! asked for a notice ([`super::Peek::arm_notice`]) as it announced a wait
//! in dispatch mode, and then once: the request is a bit in the word the
//! producer publishes with, set by the owner with an atomic OR and
//! cleared by the producer's publish, the channel's conditional doorbell
//! again (see `source::channel`). Two read-modify-writes of one word are
//! totally ordered, so either the publish sees the request (and pushes)
//! or the owner's OR returns the new head (and the owner does not wait).
//! A producer whose consumer is not waiting pays nothing extra.
//!
//! A caller-owned ring cannot: its published word (the tail) is the
//! caller's. Its request lives in a word of fastwake's, and its
//! producer's call (`source::ring::producer`) pays a SeqCst fence and a
//! load to read it after the tail store (a Dekker, not one word's RMWs).
//!
//! # The ring
//!
//! A bounded multi-producer, multi-consumer ring of `u32` indices.
//! Multi-consumer because a dispatch-mode thread about to sleep relays for
//! its core, popping notices next to the dispatcher. A cell is one 64-bit
//! word, `lap << 32 | index`, written once per notice by its producer and
//! never by a consumer, so a notice moves one cache line between the two
//! cores, twice (the producer's write, the consumer's read): the least a
//! message between cores can cost. Producers claim tickets on `tail`; a
//! consumer takes ticket `head` when its cell carries the ticket's lap and
//! claims it on `head`. Producers learn that cells are free from `limit`
//! (in their own line), refreshed from `head` only once per ring's worth
//! of notices, so a notice does not read the consumers' line either.
//!
//! A full ring drops the notice and raises `overflow`; the consumer then
//! peeks every source once ([`NoticeRing::take_overflow`]). Each wait
//! yields at most one notice, so a ring with room for twice the
//! dispatcher's sources overflows only when its consumer is starved.
//!
//! Notices are hints: one may be stale (the owner took the completion
//! itself meanwhile, or waits again for a later one), so the consumer
//! peeks the named source before it hands off.
//!
//! No sleeping consumer: a task runtime going idle attaches its readiness
//! summary to its noticed sources and sleeps on that (`dispatch::tasks`),
//! so a notice needs no fence and no check of a sleeper.

use crate::sync::{AtomicU8, AtomicU64, LineWords, Ordering};
use std::sync::Arc;

/// See the [module docs](self).
pub struct NoticeRing {
    // The producers' line: next ticket, and the first ticket whose cell
    // may still hold an unread notice.
    tail: LineWords,
    // The consumers' line: next ticket to take.
    head: LineWords,
    overflow: LineWords,
    cells: LineWords,
    mask: u64,
    /// The safety net's ledger, per source: it served a wait of the
    /// source and no notice has come since. Here rather than with one
    /// consumer, so a late notice is counted as late whoever pops it (a
    /// relaying thread pops most of them in dispatch-mode threads).
    scanned: Box<[AtomicU8]>,
    late: AtomicU64,
}

/// Word indices in the producers' line.
const TAIL: usize = 0;
const LIMIT: usize = 1;

impl std::fmt::Debug for NoticeRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoticeRing")
            .field("capacity", &self.cells.len())
            .finish()
    }
}

impl NoticeRing {
    /// A ring for notices about `sources` sources (room for twice as many
    /// notices, at least 64).
    pub fn new(sources: usize) -> Arc<NoticeRing> {
        let n = (sources.saturating_mul(2))
            .clamp(64, 1 << 24)
            .next_power_of_two();
        let mut w = 0;
        Arc::new(NoticeRing {
            tail: LineWords::new(2, || {
                w += 1;
                // TAIL = 0; LIMIT = n: every cell is free.
                AtomicU64::new(if w == 1 { 0 } else { n as u64 })
            }),
            head: LineWords::new(1, || AtomicU64::new(0)),
            overflow: LineWords::new(1, || AtomicU64::new(0)),
            // Lap 0: no ticket's (ticket t's notice carries lap t + 1).
            cells: LineWords::new(n, || AtomicU64::new(0)),
            mask: n as u64 - 1,
            scanned: (0..sources).map(|_| AtomicU8::new(0)).collect(),
            late: AtomicU64::new(0),
        })
    }

    /// The handle a source's producer uses to notify about source `index`.
    pub fn notifier(self: &Arc<Self>, index: usize) -> Notifier {
        Notifier {
            ring: self.clone(),
            index: u32::try_from(index).expect("notice index fits in 32 bits"),
        }
    }

    fn cell(&self, ticket: u64) -> &AtomicU64 {
        self.cells.get((ticket & self.mask) as usize)
    }

    /// The lap a cell carries for ticket `t` (32 bits, wrapping: a ring
    /// holds far fewer than 2^32 cells).
    fn lap(t: u64) -> u64 {
        (t as u32).wrapping_add(1) as u64
    }

    /// Append `index`; false when the ring is full.
    fn push(&self, index: u32) -> bool {
        let (tail, limit) = (self.tail.get(TAIL), self.tail.get(LIMIT));
        let mut t = tail.load(Ordering::Relaxed);
        loop {
            if t >= limit.load(Ordering::Relaxed) {
                // Acquire: the consumers read the cells below `head` before
                // they moved it, so those cells may be written again.
                let free = self.head.get(0).load(Ordering::Acquire) + self.mask + 1;
                limit.fetch_max(free, Ordering::Relaxed);
                if t >= free {
                    return false;
                }
            }
            match tail.compare_exchange(t, t + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => t = now,
            }
        }
        self.cell(t)
            .store(Self::lap(t) << 32 | index as u64, Ordering::Release);
        true
    }

    /// Take the oldest notice: the index of a source that may be ready.
    #[inline]
    pub fn pop(&self) -> Option<usize> {
        let head = self.head.get(0);
        let mut h = head.load(Ordering::Relaxed);
        loop {
            let c = self.cell(h).load(Ordering::Acquire);
            if c >> 32 != Self::lap(h) {
                // Still the notice of the previous lap (or none): empty, or
                // a producer that claimed ticket `h` has not written it.
                return None;
            }
            // Release: a producer that sees the new head (to reuse the
            // cell) comes after our read of it.
            match head.compare_exchange(h, h + 1, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => {
                    let i = c as u32 as usize;
                    self.settle(i);
                    return Some(i);
                }
                Err(now) => h = now,
            }
        }
    }

    /// A notice for source `i` was popped: if the safety net had served
    /// the source since its previous notice, this one came late. The load
    /// first: the flag's line is only read on this path.
    #[inline]
    fn settle(&self, i: usize) {
        if let Some(s) = self.scanned.get(i)
            && s.load(Ordering::Relaxed) != 0
            && s.swap(0, Ordering::Relaxed) != 0
        {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The safety net served a wait of source `i` that had no notice: a
    /// notice for it popped later is counted in [`NoticeRing::late`].
    pub fn mark_scanned(&self, i: usize) {
        if let Some(s) = self.scanned.get(i) {
            s.store(1, Ordering::Relaxed);
        }
    }

    /// Notices popped, by any consumer, for sources the safety net had
    /// served since their previous notice: late, not lost.
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Did a push find the ring full since the last call? Then some
    /// notices were dropped: the caller must peek every source once.
    #[inline]
    pub fn take_overflow(&self) -> bool {
        let o = self.overflow.get(0);
        o.load(Ordering::Relaxed) != 0 && o.swap(0, Ordering::AcqRel) != 0
    }
}

/// One source's way into a [`NoticeRing`]; cheap to clone, safe to use
/// from any thread.
#[derive(Clone, Debug)]
pub struct Notifier {
    ring: Arc<NoticeRing>,
    index: u32,
}

impl Notifier {
    /// Producer: tell the ring's consumer that the source may be ready.
    /// Call after the completion is visible to peeks.
    pub fn notify(&self) {
        let r = &*self.ring;
        if !r.push(self.index) {
            r.overflow.get(0).store(1, Ordering::Release);
        }
    }

    /// Is this the same notifier as `other`?
    pub fn same_as(&self, other: &Notifier) -> bool {
        Arc::ptr_eq(&self.ring, &other.ring) && self.index == other.index
    }

    /// The source's index in its ring's dispatcher.
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pops_in_order_across_laps_and_reports_overflow() {
        let r = NoticeRing::new(1);
        let cap = 64;
        for lap in 0..3 {
            for i in 0..cap {
                r.notifier(i + lap).notify();
            }
            assert!(!r.take_overflow());
            r.notifier(999).notify();
            assert!(r.take_overflow(), "a push into a full ring is reported");
            assert!(!r.take_overflow(), "once");
            for i in 0..cap {
                assert_eq!(r.pop(), Some(i + lap));
            }
            assert_eq!(r.pop(), None);
        }
    }

    #[test]
    fn a_notice_after_the_safety_net_served_its_source_is_late_once() {
        let r = NoticeRing::new(4);
        r.notifier(1).notify();
        assert_eq!(r.pop(), Some(1));
        assert_eq!(r.late(), 0, "a notice the safety net did not pre-empt");
        r.mark_scanned(2);
        r.notifier(2).notify();
        r.notifier(2).notify();
        // A relay's pop or the dispatcher's: the ring counts either.
        let relay = std::thread::scope(|s| s.spawn(|| r.pop()).join().unwrap());
        assert_eq!(relay, Some(2));
        assert_eq!(r.late(), 1);
        assert_eq!(r.pop(), Some(2));
        assert_eq!(r.late(), 1, "only the first notice after the scan");
        r.mark_scanned(1000);
        assert_eq!(r.late(), 1, "an index past the ring's sources is ignored");
    }

    #[test]
    fn many_producers_and_consumers_lose_and_repeat_nothing() {
        let r = NoticeRing::new(4);
        let per = 20_000usize;
        let seen: Vec<std::sync::atomic::AtomicU32> = (0..4 * per)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for p in 0..4 {
                let r = &r;
                s.spawn(move || {
                    for k in 0..per {
                        let n = r.notifier(p * per + k);
                        while !r.push(n.index) {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut got = 0;
                        loop {
                            match r.pop() {
                                Some(i) => {
                                    seen[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    got += 1;
                                }
                                None if done.load(std::sync::atomic::Ordering::Acquire) => {
                                    break got;
                                }
                                None => std::thread::yield_now(),
                            }
                        }
                    })
                })
                .collect();
            while seen
                .iter()
                .any(|c| c.load(std::sync::atomic::Ordering::Relaxed) == 0)
            {
                std::thread::yield_now();
            }
            done.store(true, std::sync::atomic::Ordering::Release);
            let total: usize = consumers.into_iter().map(|c| c.join().unwrap()).sum();
            assert_eq!(total, 4 * per);
        });
        assert!(
            seen.iter()
                .all(|c| c.load(std::sync::atomic::Ordering::Relaxed) == 1)
        );
    }
}
