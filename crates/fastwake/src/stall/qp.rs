//! One QP's monitor state: the send queue's outstanding posts in order, its
//! per-opcode latency histograms and its stall episode.
//!
//! Matching: an RC send queue completes in order, and a completion for a
//! signaled work request also means every unsignaled one posted before it
//! is done. So a completion retires every entry up to the oldest one with
//! its `wr_id` (programs often reuse one `wr_id` for every send: the oldest
//! is the one completing). A `wr_id` not in the ring (a receive's, or a post
//! the ring had to drop) retires nothing.

use super::Op;
use super::hist::LogHist;

/// Posts one QP keeps track of. A deeper send queue (more unsignaled work
/// requests in flight than this) drops its oldest entries: their
/// completions then go unmatched, never falsely late.
pub const RING: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posted {
    pub wr_id: u64,
    /// CLOCK_MONOTONIC ns at the post.
    pub t_ns: u64,
    pub op: Op,
    /// The work request touched memory registered with ON_DEMAND.
    pub odp: bool,
}

const EMPTY: Posted = Posted {
    wr_id: 0,
    t_ns: 0,
    op: Op::Other,
    odp: false,
};

/// A matched completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    pub op: Op,
    pub odp: bool,
    pub latency_ns: u64,
    /// Posts of this QP still outstanding after this one.
    pub outstanding: usize,
}

pub struct QpMon {
    ring: [Posted; RING],
    head: usize,
    len: usize,
    /// Outstanding READs that touch ODP memory (for damming vs flood).
    odp_reads: u32,
    pub hist: [LogHist; Op::COUNT],
    pub in_episode: bool,
    pub stalls: u64,
    pub episodes: u64,
    /// Posts dropped because the ring was full.
    pub dropped: u64,
    /// The QP's retransmission attributes, as the caller last read them
    /// (it reads them once, at the first post: the QP is ready to send by
    /// then), for naming a stall's cause without a syscall on the data path.
    pub attrs: Option<super::cause::QpAttrs>,
    /// The caller tried to read `attrs` (once: a failed query is not
    /// retried on every post).
    pub attrs_tried: bool,
}

/// What a post or completion did to the number of QPs with outstanding
/// ODP READs (the caller keeps that count across QPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadsChange {
    None,
    Started,
    Ended,
}

impl QpMon {
    pub const NEW: QpMon = QpMon {
        ring: [EMPTY; RING],
        head: 0,
        len: 0,
        odp_reads: 0,
        hist: [LogHist::NEW; Op::COUNT],
        in_episode: false,
        stalls: 0,
        episodes: 0,
        dropped: 0,
        attrs: None,
        attrs_tried: false,
    };

    pub fn outstanding(&self) -> usize {
        self.len
    }

    pub fn odp_reads(&self) -> u32 {
        self.odp_reads
    }

    fn odp_read(p: &Posted) -> bool {
        p.odp && p.op == Op::Read
    }

    fn before(&self) -> bool {
        self.odp_reads > 0
    }

    fn change(&self, before: bool) -> ReadsChange {
        match (before, self.odp_reads > 0) {
            (false, true) => ReadsChange::Started,
            (true, false) => ReadsChange::Ended,
            _ => ReadsChange::None,
        }
    }

    /// Record a post (the oldest is dropped when the ring is full).
    #[inline]
    pub fn post(&mut self, p: Posted) -> ReadsChange {
        let before = self.before();
        if self.len == RING {
            let old = self.ring[self.head];
            self.odp_reads -= Self::odp_read(&old) as u32;
            self.head = (self.head + 1) % RING;
            self.len -= 1;
            self.dropped += 1;
        }
        self.ring[(self.head + self.len) % RING] = p;
        self.len += 1;
        self.odp_reads += Self::odp_read(&p) as u32;
        self.change(before)
    }

    /// Forget the `n` newest posts (the provider refused them).
    pub fn unpost(&mut self, n: usize) -> ReadsChange {
        let before = self.before();
        for _ in 0..n.min(self.len) {
            self.len -= 1;
            let p = self.ring[(self.head + self.len) % RING];
            self.odp_reads -= Self::odp_read(&p) as u32;
        }
        self.change(before)
    }

    /// Match a send-queue completion: retire every post up to the oldest
    /// with `wr_id`, record its latency. `None` if no post has that wr_id.
    #[inline]
    pub fn complete(&mut self, wr_id: u64, now_ns: u64) -> Option<(Done, ReadsChange)> {
        let i = (0..self.len).find(|&i| self.ring[(self.head + i) % RING].wr_id == wr_id)?;
        let before = self.before();
        for k in 0..=i {
            let p = self.ring[(self.head + k) % RING];
            self.odp_reads -= Self::odp_read(&p) as u32;
        }
        let p = self.ring[(self.head + i) % RING];
        self.head = (self.head + i + 1) % RING;
        self.len -= i + 1;
        let latency_ns = now_ns.saturating_sub(p.t_ns);
        self.hist[p.op as usize].record(latency_ns);
        Some((
            Done {
                op: p.op,
                odp: p.odp,
                latency_ns,
                outstanding: self.len,
            },
            self.change(before),
        ))
    }

    /// Start over (the QP was destroyed and its number may come back).
    pub fn reset(&mut self) {
        *self = QpMon::NEW;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(wr_id: u64, t_ns: u64, op: Op, odp: bool) -> Posted {
        Posted {
            wr_id,
            t_ns,
            op,
            odp,
        }
    }

    #[test]
    fn in_order_matching_with_reused_and_unsignaled_ids() {
        let mut q = QpMon::NEW;
        // Three sends with the same wr_id (ibv_rc_pingpong does that).
        for t in [100, 200, 300] {
            q.post(p(2, t, Op::Send, false));
        }
        let (d, _) = q.complete(2, 1_100).unwrap();
        assert_eq!(
            (d.latency_ns, d.outstanding),
            (1_000, 2),
            "the oldest is matched"
        );
        // Unsignaled 7, 8 then signaled 9 and 10: completing 9 retires
        // everything posted before it (the two sends too), not 10.
        for (id, t) in [(7, 400), (8, 500), (9, 600), (10, 700)] {
            q.post(p(id, t, Op::Write, false));
        }
        let (d, _) = q.complete(9, 1_600).unwrap();
        assert_eq!((d.op, d.latency_ns, d.outstanding), (Op::Write, 1_000, 1));
        assert_eq!(q.complete(7, 2_000), None, "retired with 9");
        // A receive's wr_id retires nothing.
        assert_eq!(q.complete(1, 2_000), None);
        assert_eq!(q.outstanding(), 1);
        assert_eq!(q.hist[Op::Send as usize].count(), 1);
    }

    #[test]
    fn full_ring_drops_oldest_and_unpost_removes_newest() {
        let mut q = QpMon::NEW;
        for i in 0..RING as u64 + 3 {
            q.post(p(i, i, Op::Send, false));
        }
        assert_eq!((q.outstanding(), q.dropped), (RING, 3));
        assert_eq!(q.complete(0, 10), None, "dropped: unmatched, never late");
        q.unpost(2);
        assert_eq!(q.complete(RING as u64 + 2, 10_000), None);
        assert!(q.complete(RING as u64, 10_000).is_some());
    }

    #[test]
    fn odp_read_accounting() {
        let mut q = QpMon::NEW;
        assert_eq!(q.post(p(1, 0, Op::Read, true)), ReadsChange::Started);
        assert_eq!(q.post(p(2, 0, Op::Read, true)), ReadsChange::None);
        assert_eq!(q.post(p(3, 0, Op::Read, false)), ReadsChange::None);
        assert_eq!(q.odp_reads(), 2);
        assert_eq!(q.complete(1, 5).unwrap().1, ReadsChange::None);
        assert_eq!(q.complete(3, 5).unwrap().1, ReadsChange::Ended);
        assert_eq!(q.post(p(4, 0, Op::Read, true)), ReadsChange::Started);
        assert_eq!(q.unpost(1), ReadsChange::Ended);
    }
}
