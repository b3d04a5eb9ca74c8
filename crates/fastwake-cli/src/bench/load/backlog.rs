//! The open-loop backlog: for each request taken, how many others were
//! due by the schedule and not yet taken.
//!
//! The `queue` column counts requests *sent* and not yet taken. When the
//! producer itself is kept off its CPU (by neighbours that a mode which
//! never idles pushed there, say), requests that are due wait in the
//! producer instead, and the queue looks shallow while the latency,
//! measured from the scheduled time, grows. The backlog counts against
//! the schedule, as the latency does: requests whose scheduled time had
//! come when this one was taken and that were not yet taken. A server's
//! requests arrive from a NIC or a peer without waiting for a CPU of its
//! own, so this is the backlog a server would find; the queue is the part
//! of it that reached the consumer.
//!
//! The takes of a window are recorded as they happen (two stores into
//! memory touched before the window) and counted after it, so counting
//! costs the measured waits nothing.

/// The backlog over the takes counted so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backlog {
    pub(super) sum: u64,
    pub(super) max: u64,
    pub(super) takes: u64,
}

impl Backlog {
    /// The mean backlog a request found (None before any take).
    pub(super) fn mean(&self) -> Option<f64> {
        (self.takes > 0).then(|| self.sum as f64 / self.takes as f64)
    }
}

/// Most takes one window records (64 MiB); takes beyond are not counted.
const MAX_TAKES: usize = 1 << 22;

/// One window's takes: (scheduled time, time taken), in the order taken.
pub(super) struct Takes {
    v: Vec<(u64, u64)>,
    len: usize,
    /// Takes past the end of `v`.
    missed: u64,
}

impl Takes {
    /// Room for `n` takes a window (at most [`MAX_TAKES`]), every page
    /// touched now so that no take faults one in.
    pub(super) fn with_room(n: usize) -> Takes {
        Takes {
            v: vec![(u64::MAX, u64::MAX); n.clamp(1, MAX_TAKES)],
            len: 0,
            missed: 0,
        }
    }

    #[inline]
    pub(super) fn record(&mut self, scheduled: u64, got: u64) {
        match self.v.get_mut(self.len) {
            Some(slot) => {
                *slot = (scheduled, got);
                self.len += 1;
            }
            None => self.missed += 1,
        }
    }

    /// Count the window's takes into `b`, and start afresh. A request
    /// taken has a scheduled time no later than when it was taken, so
    /// the requests due when take `i` happened are those scheduled up to
    /// then, less the `i + 1` taken by then. Where the window outgrew its
    /// room, only takes whose due requests were all recorded are counted.
    pub(super) fn close(&mut self, b: &mut Backlog) {
        let takes = &self.v[..self.len];
        let mut sched: Vec<u64> = takes.iter().map(|t| t.0).collect();
        if !sched.is_sorted() {
            sched.sort_unstable();
        }
        let last = sched.last().copied().unwrap_or(0);
        for (i, &(_, got)) in takes.iter().enumerate() {
            if self.missed > 0 && got > last {
                continue;
            }
            let due = sched.partition_point(|&s| s <= got);
            let q = (due as u64).saturating_sub(i as u64 + 1);
            b.sum += q;
            b.max = b.max.max(q);
            b.takes += 1;
        }
        self.len = 0;
        self.missed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(takes: &[(u64, u64)], room: usize) -> Backlog {
        let mut t = Takes::with_room(room);
        for &(s, g) in takes {
            t.record(s, g);
        }
        let mut b = Backlog::default();
        t.close(&mut b);
        b
    }

    #[test]
    fn a_consumer_that_keeps_up_finds_no_backlog() {
        let takes: Vec<(u64, u64)> = (0..100).map(|i| (i * 10, i * 10 + 3)).collect();
        let b = count(&takes, 1000);
        assert_eq!((b.sum, b.max, b.takes), (0, 0, 100));
        assert_eq!(b.mean(), Some(0.0));
    }

    #[test]
    fn requests_due_but_not_yet_sent_are_counted() {
        // Due every 10 ns; the consumer takes all of them at 1000 ns,
        // as it would behind a late producer that sent them together.
        let takes: Vec<(u64, u64)> = (0..10).map(|i| (i * 10, 1000 + i)).collect();
        let b = count(&takes, 16);
        // Take i finds the 9 - i after it due.
        assert_eq!(b.sum, (0..10).sum::<u64>());
        assert_eq!(b.max, 9);
        assert_eq!(b.takes, 10);
    }

    #[test]
    fn only_requests_due_by_the_take_count() {
        // Two due at once, taken at 5 and 25; a third due at 20.
        let b = count(&[(0, 5), (0, 25), (20, 26)], 4);
        // Take 0 at 5: due {0, 0} less 1 taken = 1; take 1 at 25: due all
        // 3 less 2 = 1; take 2: 0.
        assert_eq!((b.sum, b.max, b.takes), (2, 1, 3));
    }

    #[test]
    fn a_window_past_its_room_counts_only_what_it_saw_whole() {
        let takes: Vec<(u64, u64)> = (0..10).map(|i| (i * 10, 1000 + i)).collect();
        let b = count(&takes, 4);
        // The four recorded were all taken after the last recorded was
        // due, so none can be counted whole.
        assert_eq!(b.takes, 0);
        assert_eq!(b.mean(), None);
        // Taken as soon as due: the first three are counted; the fourth,
        // taken after the last recorded was due, might have had an
        // unrecorded one due before it.
        let ok: Vec<(u64, u64)> = (0..10).map(|i| (i * 10, i * 10 + 1)).collect();
        assert_eq!(count(&ok, 4).takes, 3);
    }

    #[test]
    fn close_starts_afresh_and_adds_up() {
        let mut t = Takes::with_room(8);
        let mut b = Backlog::default();
        t.record(0, 50);
        t.record(10, 51);
        t.close(&mut b);
        t.record(100, 101);
        t.close(&mut b);
        assert_eq!((b.sum, b.max, b.takes), (1, 1, 3));
    }
}
