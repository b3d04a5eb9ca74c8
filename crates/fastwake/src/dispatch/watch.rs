//! The set of sources one dispatcher watches, and how a pass finds the ready
//! ones: sources whose producer pushes ready notices ([`NoticeRing`]) are
//! visited only when a notice names them ("noticed": O(ready), whatever
//! their number); sources whose producer raises a [`Summary`] flag are
//! visited only when flagged; sources whose readiness only the kernel
//! knows (sockets) are visited only when the kernel's ready list names
//! them ([`KernelList`]: one `epoll_wait` a pass for all of them); the
//! rest ("plain") are peeked every pass.
//!
//! A notice lost to a bug would leave its waiter asleep, so noticed
//! sources are also peeked by a safety net, a few per call
//! ([`Watch::safety_step`]), which the dispatchers call now and then and
//! count what it finds: expected zero.
//!
//! The summary is not free: the producer's flag write and the dispatcher's
//! read-and-clear move one more cache line between cores on every
//! completion, which costs more than peeking a few dozen idle sources
//! (their lines stay in the dispatcher's cache). So a watch peeks plainly
//! while it holds at most `summary_above` sources and switches every
//! source to the summary when it grows past that (see `docs/design/dispatcher.md`
//! for the measurements behind the default).

use super::kernel_list::{self, KernelList};
use crate::source::notice::NoticeRing;
use crate::source::summary::Summary;
use crate::source::{NextAt, Peek, Pump};
use crate::sync::{AtomicU64, Ordering};
use std::cell::Cell;
use std::sync::Arc;

/// Cached [`crate::source::Counters`] of one entry: a pass reads these
/// contiguously and compares two words, instead of a virtual call through
/// three pointers per source (measured: ~10 ns → ~2 ns per source).
#[derive(Clone)]
struct Fast {
    produced: *const AtomicU64,
    consumed: *const AtomicU64,
    shift: u32,
    /// `produced` as last read when the entry was not ready (u64::MAX:
    /// none). While `produced` still reads the same the entry is still not
    /// ready (`consumed` only grows), so an idle source costs a pass one
    /// load, of a line only its producer writes, instead of two: with 16
    /// sources the scan is most of a hand-off's detection delay.
    idle_at: Cell<u64>,
    /// Prefetched when the entry is found ready (see [`NextAt`]).
    next_at: Option<NextAt>,
}

/// Default switch-over point to the summary, in sources.
pub(crate) const SUMMARY_ABOVE: usize = 32;

/// Noticed sources a task runtime keeps *hot*: peeked every pass like
/// plain ones, without notices. A notice moves one more cache line
/// between the cores than a peek of the source itself (measured: 0.140
/// against 0.120 µs one-way at 16 connections), so the sources that were
/// served last are peeked, and only the rest wait for notices: the cost of
/// a pass grows with the busy sources (up to this many), not the idle ones.
pub(crate) const HOT: usize = 16;

/// Noticed sources the safety net peeks per [`Watch::safety_step`]: with
/// a step every few hundred empty passes, a full round over 1024 sources
/// takes ~0.1 ms, and one step (a complete peek each, ~10 ns) stays far
/// below the latency it could add to a hand-off it delays.
const SAFETY_STEP: usize = 8;

pub(crate) struct Watch {
    entries: Vec<Option<Arc<dyn Peek>>>,
    /// Per entry, when its peek offers counters; valid while `entries[i]`
    /// holds the handle they were taken from.
    fast: Vec<Option<Fast>>,
    summary: Option<Arc<Summary>>,
    /// Entries not covered by the summary, one bit each.
    plain: Vec<u64>,
    plain_count: usize,
    count: usize,
    summary_above: usize,
    /// Every source was switched to the summary: visit all once, since
    /// completions before the switch raised no flag.
    full_pass: Cell<bool>,
    summarising: bool,
    /// Words of `plain` (and groups of the summary) in use: one past the
    /// highest entry's word. Passes stop there, so a large capacity costs
    /// nothing.
    words: usize,
    /// Prefetch a ready entry's next slot (see [`NextAt`]).
    prefetch: bool,
    /// Where producers push ready notices, for sources that can.
    notices: Option<Arc<NoticeRing>>,
    /// Entries served by notices, one bit each (neither plain nor
    /// summarised).
    noticed: Vec<u64>,
    noticed_count: usize,
    /// Where the next safety-net step starts.
    safety_at: Cell<usize>,
    /// Noticed entries peeked like plain ones (their plain bit is set),
    /// oldest first; see [`HOT`]. Only a watcher that arms its sources'
    /// notices itself (a task runtime) promotes any.
    hot: std::collections::VecDeque<usize>,
    /// Entries whose readiness the kernel's ready list reports (neither
    /// plain nor summarised nor noticed).
    kernel: KernelList,
    /// Shared queues behind some entries ([`Peek::pump`]), each once, with
    /// how many entries use it: a pass polls each once, whatever the
    /// number of sources behind it.
    pumps: Vec<(Arc<dyn Pump>, usize)>,
}

impl Watch {
    pub(crate) fn new(
        capacity: usize,
        use_summary: bool,
        summary_above: usize,
        prefetch: bool,
        notices: Option<Arc<NoticeRing>>,
        kernel: Arc<kernel_list::Shared>,
    ) -> Watch {
        Watch {
            entries: (0..capacity).map(|_| None).collect(),
            fast: vec![None; capacity],
            summary: use_summary.then(|| Summary::new(capacity)),
            plain: vec![0; capacity.div_ceil(64)],
            plain_count: 0,
            count: 0,
            summary_above,
            full_pass: Cell::new(false),
            summarising: false,
            words: 0,
            prefetch,
            notices,
            noticed: vec![0; capacity.div_ceil(64)],
            noticed_count: 0,
            safety_at: Cell::new(0),
            hot: std::collections::VecDeque::with_capacity(HOT + 1),
            kernel: KernelList::new(kernel),
            pumps: Vec::new(),
        }
    }

    /// Poll the shared queues behind the entries, so that what they hold
    /// reaches the entries (and their notices the ring) before a pass
    /// looks. Nothing when no entry has one.
    #[inline]
    pub(crate) fn pump(&self) {
        for (p, _) in &self.pumps {
            p.pump();
        }
    }

    /// Entry `peek` comes (`+1`) or goes (`-1`): count its pump, if any.
    fn count_pump(&mut self, peek: &dyn Peek, delta: isize) {
        let Some(p) = peek.pump() else { return };
        match self.pumps.iter().position(|(q, _)| Arc::ptr_eq(q, &p)) {
            Some(k) => {
                let n = self.pumps[k].1.saturating_add_signed(delta);
                if n == 0 {
                    self.pumps.swap_remove(k);
                } else {
                    self.pumps[k].1 = n;
                }
            }
            None if delta > 0 => self.pumps.push((p, 1)),
            None => {}
        }
    }

    /// Peek every source one by one, even those the kernel could list
    /// (to measure what the list saves). Before the first insert.
    pub(crate) fn without_kernel_list(&mut self) {
        self.kernel.turn_off();
    }

    /// The kernel ready list's counters.
    pub(crate) fn kernel_stats(&self) -> super::KernelListStats {
        self.kernel.stats()
    }

    pub(crate) fn summary(&self) -> Option<&Arc<Summary>> {
        self.summary.as_ref()
    }

    /// Is entry `i` served by notices?
    #[inline]
    pub(crate) fn noticed(&self, i: usize) -> bool {
        self.noticed[i / 64] & (1 << (i % 64)) != 0
    }

    /// Is noticed entry `i` hot (peeked, not noticed)?
    #[inline]
    pub(crate) fn hot(&self, i: usize) -> bool {
        self.noticed(i) && self.plain[i / 64] & (1 << (i % 64)) != 0
    }

    /// Make noticed entry `i` hot (it was just served). Returns the entry
    /// that stopped being hot to make room, if any: its owner must arm its
    /// notice now ([`Watch::arm_notice`]), since nothing peeks it any more.
    pub(crate) fn promote(&mut self, i: usize) -> Option<usize> {
        if !self.noticed(i) || self.hot(i) {
            return None;
        }
        self.plain[i / 64] |= 1 << (i % 64);
        self.plain_count += 1;
        self.hot.push_back(i);
        if self.hot.len() <= HOT {
            return None;
        }
        let j = self.hot.pop_front()?;
        self.cool(j);
        Some(j)
    }

    /// Entry `j` is no longer hot.
    fn cool(&mut self, j: usize) {
        self.plain[j / 64] &= !(1 << (j % 64));
        self.plain_count -= 1;
    }

    /// Owner side (a task runtime arms for its tasks): ask entry `i`'s
    /// producer for a notice of its next completion. True when the entry
    /// is ready now (then no notice will come for what is there).
    pub(crate) fn arm_notice(&self, i: usize) -> bool {
        self.entries[i]
            .as_ref()
            .is_some_and(|p| p.arm_notice() == Some(true))
    }

    /// Watch `peek` as entry `i` (replacing what was there). The caller
    /// must peek the entry once afterwards: a completion that arrived
    /// before the summary flag was attached raised no flag.
    pub(crate) fn insert(&mut self, i: usize, peek: Arc<dyn Peek>) {
        self.remove(i);
        let noticed = self
            .notices
            .as_ref()
            .is_some_and(|r| peek.attach_notices(r.notifier(i)));
        let listed = !noticed && self.kernel.add(i, &*peek);
        let summarised = match &self.summary {
            _ if noticed || listed => false,
            Some(s) if self.summarising => peek.attach_summary(s.flag(i)),
            _ => false,
        };
        if noticed {
            self.noticed[i / 64] |= 1 << (i % 64);
            self.noticed_count += 1;
        } else if !summarised && !listed {
            self.plain[i / 64] |= 1 << (i % 64);
            self.plain_count += 1;
        }
        self.fast[i] = peek.counters().map(|c| Fast {
            produced: c.produced,
            consumed: c.consumed,
            shift: c.shift,
            idle_at: Cell::new(u64::MAX),
            next_at: c.next_at,
        });
        self.count_pump(&*peek, 1);
        self.entries[i] = Some(peek);
        self.count += 1;
        self.words = self.words.max(i / 64 + 1);
        // Noticed and listed sources do not count: a pass does not peek
        // them.
        if !self.summarising
            && self.count - self.noticed_count - self.kernel.count() > self.summary_above
        {
            self.switch_to_summary();
        }
    }

    /// Idle: put every source on the summary so one armed summary can wake
    /// the sleeper; noticed sources too, for the idle period only (their
    /// notices go to a ring, which nobody watches while the watcher
    /// sleeps). Hot entries stop being hot and are pushed onto `cooled`:
    /// their owners must arm their notices. True when every source
    /// accepted (else some must still be peeked). Undo with
    /// [`Watch::unarm`].
    pub(crate) fn arm_all(&mut self, cooled: &mut Vec<usize>) -> bool {
        while let Some(j) = self.hot.pop_front() {
            self.cool(j);
            cooled.push(j);
        }
        if !self.summarising {
            self.switch_to_summary();
        }
        let Some(s) = &self.summary else {
            return false;
        };
        // Nothing rings the summary for a listed source.
        let mut all = self.plain_count == 0 && self.kernel.count() == 0;
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(p) = e
                && self.noticed(i)
            {
                all &= p.attach_summary(s.flag(i));
            }
        }
        all
    }

    /// After an idle period: noticed sources off the summary again, and
    /// back to plain peeks if the watch is small.
    pub(crate) fn unarm(&mut self) {
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(p) = e
                && self.noticed(i)
            {
                p.detach_summary();
            }
        }
        if !self.summarising || self.count > self.summary_above {
            return;
        }
        self.summarising = false;
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(p) = e
                && self.plain[i / 64] & (1 << (i % 64)) == 0
                && !self.noticed(i)
                && !self.kernel.listed(i)
            {
                p.detach_summary();
                self.plain[i / 64] |= 1 << (i % 64);
                self.plain_count += 1;
            }
        }
    }

    fn switch_to_summary(&mut self) {
        let Some(s) = &self.summary else { return };
        self.summarising = true;
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(p) = e
                && self.plain[i / 64] & (1 << (i % 64)) != 0
                && !self.noticed(i)
                && p.attach_summary(s.flag(i))
            {
                self.plain[i / 64] &= !(1 << (i % 64));
                self.plain_count -= 1;
            }
        }
        self.full_pass.set(true);
    }

    pub(crate) fn remove(&mut self, i: usize) {
        self.fast[i] = None;
        let Some(p) = self.entries[i].take() else {
            return;
        };
        self.count -= 1;
        self.count_pump(&*p, -1);
        if self.hot(i) {
            self.hot.retain(|&j| j != i);
        }
        if self.noticed(i) {
            self.noticed[i / 64] &= !(1 << (i % 64));
            self.noticed_count -= 1;
            p.detach_notices();
        }
        if self.plain[i / 64] & (1 << (i % 64)) != 0 {
            self.plain[i / 64] &= !(1 << (i % 64));
            self.plain_count -= 1;
        }
        self.kernel.remove(i, &*p);
        // A summarised source keeps raising flag i until it is attached
        // elsewhere; a flag on an empty or reused entry is only a hint that
        // the ready check below rejects.
    }

    /// Is entry `i` ready? Uses the cached counters when there are some:
    /// then a closed source is only seen by [`Watch::ready_full`].
    #[inline]
    pub(crate) fn ready(&self, i: usize) -> bool {
        if let Some(f) = &self.fast[i] {
            // SAFETY: the pointers come from `counters()` of the handle in
            // `entries[i]`, which is alive (fast[i] is cleared when it is
            // removed) and promises they stay valid while it lives.
            unsafe {
                let produced = (*f.produced).load(Ordering::Acquire);
                if produced == f.idle_at.get() {
                    return false;
                }
                let consumed = (*f.consumed).load(Ordering::Acquire);
                let ready = (produced >> f.shift) > consumed;
                if !ready {
                    f.idle_at.set(produced);
                } else if self.prefetch
                    && let Some(n) = &f.next_at
                {
                    n.prefetch(consumed);
                }
                return ready;
            }
        }
        // Reported by this pass's `epoll_wait` (an entry visited through
        // the kernel's list); otherwise the complete test.
        if self.kernel.seen(i) {
            return true;
        }
        self.ready_full(i)
    }

    /// The handle's own, complete readiness test (also reports closes).
    pub(crate) fn ready_full(&self, i: usize) -> bool {
        match &self.entries[i] {
            Some(p) => {
                self.kernel.count_peek();
                p.ready()
            }
            None => false,
        }
    }

    /// One `epoll_wait` for the listed entries: visit the ones reported
    /// ready whose bit is set in `interest(word)`.
    #[inline]
    fn kernel_pass(&self, interest: impl Fn(usize) -> u64, visit: impl FnMut(usize)) {
        self.kernel
            .harvest(|i| interest(i / 64) & (1 << (i % 64)) != 0, visit);
        self.kernel
            .rebuild_if_stale(|i| self.entries[i].as_ref().and_then(|p| p.kernel_ready_fd()));
    }

    /// Visit every entry with its bit set in `interest(word)` whose full
    /// readiness test passes: the periodic slow pass that catches what the
    /// fast path does not report (closed sources).
    /// Noticed entries that are not hot are left to notices and the
    /// safety net; for listed ones the kernel's list is the complete test.
    pub(crate) fn slow_pass(&self, interest: impl Fn(usize) -> u64, mut visit: impl FnMut(usize)) {
        self.kernel_pass(&interest, &mut visit);
        for w in 0..self.words {
            let mut bits =
                interest(w) & (self.plain[w] | !self.noticed[w]) & !self.kernel.listed_word(w);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.ready_full(i) {
                    visit(i);
                }
            }
        }
    }

    /// Entries peeked every pass by their fast test.
    #[inline]
    pub(crate) fn plain_count(&self) -> usize {
        self.plain_count
    }

    /// Only plain entries, no summary and no pending full pass: the case
    /// [`Watch::next_plain_ready`] covers alone.
    #[inline]
    pub(crate) fn plain_only(&self) -> bool {
        !self.summarising && !self.full_pass.get() && self.kernel.count() == 0
    }

    /// The first plain entry at or after `from` (wrapping) whose bit is set
    /// in `interest` and whose fast test says ready. Starting after the
    /// last one served keeps the order round-robin, so no source starves.
    #[inline]
    pub(crate) fn next_plain_ready(&self, interest: &[u64], from: usize) -> Option<usize> {
        let n = self.words * 64;
        if n == 0 || self.plain_count == 0 {
            return None;
        }
        // `from` is at most one past the last entry: a compare, not a
        // `%` (a division is ~25 cycles, paid on every pass).
        let from = if from >= n { 0 } else { from };
        let (w0, b0) = (from / 64, from % 64);
        let first_ready = |w: usize, mut bits: u64| -> Option<usize> {
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.ready(i) {
                    return Some(i);
                }
            }
            None
        };
        // The word `from` is in, from its bit on; every other word; then
        // the bits of the first word before `from`.
        let here = self.plain[w0] & interest[w0];
        if let Some(i) = first_ready(w0, here & (!0u64 << b0)) {
            return Some(i);
        }
        let mut w = w0;
        for _ in 1..self.words {
            w += 1;
            if w == self.words {
                w = 0;
            }
            if let Some(i) = first_ready(w, self.plain[w] & interest[w]) {
                return Some(i);
            }
        }
        first_ready(w0, here & !(!0u64 << b0))
    }

    /// Visit entries that may be ready: every flagged summarised entry, and
    /// every plain entry whose bit is set in `interest(word)` (the waiting
    /// set). Visited entries still need [`Watch::ready`].
    #[inline]
    pub(crate) fn candidates(&self, interest: impl Fn(usize) -> u64, mut visit: impl FnMut(usize)) {
        if self.full_pass.replace(false) {
            let n = (self.words * 64).min(self.entries.len());
            for (i, e) in self.entries[..n].iter().enumerate() {
                if e.is_some()
                    && (!self.noticed(i) || self.hot(i))
                    && !self.kernel.listed(i)
                    && interest(i / 64) & (1 << (i % 64)) != 0
                {
                    visit(i);
                }
            }
            self.kernel_pass(interest, visit);
            return;
        }
        if self.summarising
            && let Some(s) = &self.summary
        {
            s.drain(self.words, &mut visit);
        }
        if self.plain_count > 0 {
            for (w, &plain) in self.plain[..self.words].iter().enumerate() {
                if plain == 0 {
                    continue;
                }
                let mut bits = plain & interest(w);
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    visit(w * 64 + b);
                }
            }
        }
        self.kernel_pass(interest, visit);
    }

    /// Noticed entries that may be ready: every entry a notice names, and
    /// after the ring overflowed every noticed entry whose bit is set in
    /// `interest(word)`. Visited entries still need
    /// [`Watch::ready_noticed`]: a notice may be stale.
    #[inline]
    pub(crate) fn noticed_candidates(
        &self,
        interest: impl Fn(usize) -> u64,
        mut visit: impl FnMut(usize),
    ) {
        let Some(r) = &self.notices else { return };
        while let Some(i) = r.pop() {
            visit(i);
        }
        if r.take_overflow() {
            for w in 0..self.words {
                let mut bits = self.noticed[w] & interest(w);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    visit(i);
                }
            }
        }
    }

    /// Is noticed entry `i` ready? The counters, and when they say no the
    /// complete test: a closing producer notifies too.
    ///
    /// Unlike [`Watch::ready`], the next slot is prefetched *before* the
    /// producer's counter is read: a notice says the slot was just
    /// written, so both lines come over from the producer's core at once
    /// instead of one after the other.
    #[inline]
    pub(crate) fn ready_noticed(&self, i: usize) -> bool {
        if let Some(f) = &self.fast[i] {
            // SAFETY: as in `ready`: the pointers come from the live
            // handle in `entries[i]`.
            let ready = unsafe {
                // The consumer's count first: it only grows up to the
                // producer's, so this order never reports a completion
                // that is not there.
                let consumed = (*f.consumed).load(Ordering::Acquire);
                if self.prefetch
                    && let Some(n) = &f.next_at
                {
                    n.prefetch(consumed);
                }
                ((*f.produced).load(Ordering::Acquire) >> f.shift) > consumed
            };
            if ready {
                return true;
            }
        }
        self.ready_full(i)
    }

    /// The safety net served entry `i`: a notice for it that comes
    /// later was late, not lost (its producer was held up between its
    /// publish and its push, e.g. preempted); the ring keeps that ledger.
    pub(crate) fn mark_scanned(&self, i: usize) {
        if let Some(r) = &self.notices {
            r.mark_scanned(i);
        }
    }

    /// Notices popped, here or by a relaying thread, for entries the
    /// safety net had served since their previous notice.
    pub(crate) fn late_notices(&self) -> u64 {
        self.notices.as_ref().map_or(0, |r| r.late())
    }

    /// The safety net: peek the next few noticed entries whose bit is set
    /// in `interest(word)` (round robin) with the complete test, and push
    /// the ready ones onto `found`. A waiting entry found here got no
    /// notice: the caller drains the ring once more (a notice may be on
    /// its way), hands off whatever is still waiting, and counts it.
    pub(crate) fn safety_step(&self, interest: impl Fn(usize) -> u64, found: &mut Vec<usize>) {
        if self.noticed_count == 0 || self.words == 0 {
            return;
        }
        let at = self.safety_at.get();
        let (mut w, mut from) = if at >= self.words * 64 {
            (0, 0)
        } else {
            (at / 64, at % 64)
        };
        let mut checked = 0;
        for _ in 0..=self.words {
            let mut bits = self.noticed[w] & !self.plain[w] & interest(w) & (!0u64 << from);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.ready_full(i) {
                    found.push(i);
                }
                checked += 1;
                if checked == SAFETY_STEP {
                    self.safety_at.set(i + 1);
                    return;
                }
            }
            w += 1;
            if w == self.words {
                w = 0;
            }
            from = 0;
        }
        self.safety_at.set(0);
    }
}
