//! The backlog rule of adaptive waits: notice that a waiter fell behind,
//! and stop spinning while that helps.
//!
//! A waiter that took [`BACKLOG_RUN`] completions in a row without waiting
//! was off its CPU while they queued. Next to a bursty co-located load (a
//! Soft-RoCE guest's TCG vCPU threads) a waiter that spins spends its fair
//! share of the CPU and then waits out the others' slices while its
//! requests queue, where a sleeper keeps the scheduler's wake-up
//! preemption: measured, adaptive lean-spinning at 100k/s Poisson had p50
//! 452 µs and a mean queue of 110 against interrupt mode's 90 µs and 77.
//! But a backlog can also come from a load the CPU cannot serve whatever
//! the waiter does (bursts at 1M/s next to two always-busy processes):
//! there spinning catches the requests that arrive while the waiter holds
//! the CPU (hybrid p50 0.2 µs) and holding it off only adds a wake-up to
//! each (adaptive p50 17× hybrid's, the same mean queue of ~250). Next to
//! the guest, backlogs came in both regimes too, but fewer requests queued
//! while holding (mean queue 47-71 against hybrid's 82-106). So the rule
//! keeps, per regime (spinning allowed, held off) and decaying, the share
//! of completions that were taken in a backlog, and holds spinning off
//! after a backlog only while holding has shown a share at most
//! [`HOLD_GAIN`] of spinning's (or has not been tried lately).
//!
//! And only a waiter that wants its CPU most of the time: one that sleeps
//! between the bursts of a bursty stream (a 10k/s ON/OFF stream: ~10 % of
//! the time busy) has not spent its fair share, so its backlogs are the
//! others' time slices falling on a burst, which come whatever it does;
//! holding only makes each request of the next bursts pay a wake-up on a
//! CPU the others hold (measured beside two busy processes: holds on 4-57 %
//! of the waits, p50 0.5-115 µs, over 2× hybrid's in 3 of 4 runs, against
//! 0.2-0.55 µs without the rule).

use crate::adaptive::learner::SHARED_MAX_FRAC;

/// A run this long of completions taken without waiting is a backlog (at
/// 100k/s, 640 µs of arrivals; a waiter that keeps up finds its
/// wake-up's worth at most).
pub const BACKLOG_RUN: u32 = 64;
/// A hold lasts this long...
pub const MIN_BEHIND_NS: u64 = 50_000_000;
/// ...doubling while backlogs recur right after one, up to this.
pub const MAX_BEHIND_NS: u64 = 2_000_000_000;
/// Holding must have cut the backlogged share to this fraction of
/// spinning's to go on (equal shares: spinning, which serves the rest
/// faster).
pub const HOLD_GAIN: f64 = 0.8;
/// The shares' memory: the counts halve once this many completions are
/// in them, so the comparison follows a load that changes.
const MEMORY: f64 = 400_000.0;
/// Fewer completions than this while held off say nothing about holding.
const MIN_TRIED: f64 = 2_000.0;
/// A hold starts only while at least this share of the recent completions
/// were taken in backlogs. Why: on a VM an idle vCPU is sometimes not run
/// for a ms, which makes a lone backlog now and then (measured: ~50 a
/// second at 100k/s Poisson with nothing else running, 3 % of the
/// completions); holding spinning off for each put adaptive in interrupt
/// mode for 67 % of its waits there, at 60× poll's p50. Beside the busy
/// guest most completions were taken in backlogs.
pub const MIN_SHARE: f64 = 0.3;
/// The recent share's memory, completions (halved past it).
const RECENT: f64 = 20_000.0;

/// See the module docs. Const-constructible, no heap.
#[derive(Debug, Clone)]
pub struct Backlog {
    until: u64,
    hold_ns: u64,
    /// Per regime (spinning allowed, held off): completions taken in
    /// backlogs, completions found waiting at all, and all completions.
    spin: Shares,
    held: Shares,
    /// The same over the recent completions, whatever the regime.
    recent: (f64, f64),
}

impl Default for Backlog {
    fn default() -> Self {
        Backlog::new()
    }
}

impl Backlog {
    pub const fn new() -> Backlog {
        Backlog {
            until: 0,
            hold_ns: MIN_BEHIND_NS,
            spin: Shares::ZERO,
            held: Shares::ZERO,
            recent: (0.0, 0.0),
        }
    }

    /// A wait starts at `now` after `run` completions were taken without
    /// waiting, by a waiter that wanted its CPU `busy` of the time lately
    /// (`Learner::busy_share`): was it a backlog (first), and is spinning
    /// held off now (second)?
    pub fn observe(&mut self, now: u64, run: u32, busy: f64) -> (bool, bool) {
        let holding = now < self.until;
        let backlog = run >= BACKLOG_RUN;
        let acc = if holding {
            &mut self.held
        } else {
            &mut self.spin
        };
        // The run, and the completion the previous wait returned.
        acc.total += run as f64 + 1.0;
        acc.found += run as f64;
        self.recent.1 += run as f64 + 1.0;
        if self.recent.1 > RECENT {
            self.recent.0 /= 2.0;
            self.recent.1 /= 2.0;
        }
        if backlog {
            acc.backlogged += run as f64;
            self.recent.0 += run as f64;
            let sustained = self.recent.0 >= MIN_SHARE * self.recent.1;
            if !holding && sustained && busy > SHARED_MAX_FRAC && self.holding_helps() {
                // Right after a hold: the next one is longer.
                let recent = self.until > 0 && now < self.until.saturating_add(self.hold_ns);
                self.hold_ns = if recent {
                    (self.hold_ns * 2).min(MAX_BEHIND_NS)
                } else {
                    MIN_BEHIND_NS
                };
                self.until = now.saturating_add(self.hold_ns);
            }
        }
        if self.spin.total + self.held.total > MEMORY {
            for x in [&mut self.spin, &mut self.held] {
                *x = Shares {
                    backlogged: x.backlogged / 2.0,
                    found: x.found / 2.0,
                    total: x.total / 2.0,
                };
            }
        }
        (backlog, now < self.until)
    }

    /// Has holding spinning off helped, or not been tried lately? The
    /// median request tells: while spinning most completions are caught
    /// (found waiting by fewer than half the takes), spinning serves the
    /// typical request best, however long the backlogs it also meets (ON/
    /// OFF bursts at 1M/s beside a CPU hog: spinning p50 0.23 µs, holding
    /// 9.3 µs). Where both regimes find most completions waiting, the
    /// typical request waits in a queue either way, and holding helps if
    /// it cut the share taken in backlogs to [`HOLD_GAIN`] of spinning's
    /// (beside the busy guest: interrupt mode's p50 33-71 µs against
    /// hybrid's 121-183 µs).
    fn holding_helps(&self) -> bool {
        if self.held.total < MIN_TRIED {
            return true;
        }
        let (s, h) = (&self.spin, &self.held);
        if s.found_share() < 0.5 {
            return h.found_share() < s.found_share();
        }
        h.backlogged_share() <= HOLD_GAIN * s.backlogged_share()
    }
}

/// Completion counts of one regime (decaying).
#[derive(Debug, Clone, Copy)]
struct Shares {
    backlogged: f64,
    found: f64,
    total: f64,
}

impl Shares {
    const ZERO: Shares = Shares {
        backlogged: 0.0,
        found: 0.0,
        total: 0.0,
    };

    fn found_share(&self) -> f64 {
        self.found / self.total.max(1.0)
    }

    fn backlogged_share(&self) -> f64 {
        self.backlogged / self.total.max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// A waiter that wants its CPU all the time.
    const BUSY: f64 = 1.0;

    #[test]
    fn a_backlog_holds_spinning_off_then_lets_it_resume() {
        let mut b = Backlog::new();
        assert_eq!(b.observe(0, 3, BUSY), (false, false));
        assert_eq!(b.observe(MS, BACKLOG_RUN - 1, BUSY), (false, false));
        assert_eq!(b.observe(2 * MS, BACKLOG_RUN, BUSY), (true, true));
        assert_eq!(b.observe(40 * MS, 0, BUSY), (false, true));
        assert_eq!(b.observe(60 * MS, 0, BUSY), (false, false));
    }

    #[test]
    fn holding_stops_when_backlogs_come_as_often_while_held() {
        // A load the CPU cannot serve: a backlog every 10 ms whatever the
        // waiter does (waits 10 µs apart between). After holds have been
        // tried, spinning stays on.
        let mut b = Backlog::new();
        let at = |b: &mut Backlog, i: u64| {
            // The backlog at a pseudo-random point of each 10 ms.
            let k0 = i
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
                >> 54;
            let mut h = false;
            for k in 0..1_000u64 {
                // 256 of every ~1,250 completions queued: a sustained share.
                let run = if k == k0 { 4 * BACKLOG_RUN } else { 0 };
                h |= b.observe(i * 10 * MS + k * 10_000, run, BUSY).1;
            }
            h
        };
        let held = (0..100u64).filter(|&i| at(&mut b, i)).count();
        let tail = (100..200u64).filter(|&i| at(&mut b, i)).count();
        assert!(held > 0, "never held");
        assert!(tail < 20, "still held {tail} of 100 times");
    }

    #[test]
    fn a_lone_backlog_now_and_then_holds_nothing() {
        // 3 % of the completions in backlogs: a vCPU not run for a ms now
        // and then, not a waiter losing its CPU to others.
        let mut b = Backlog::new();
        let mut held = 0;
        for i in 0..100_000u64 {
            let run = if i % 2_000 == 1_999 { BACKLOG_RUN } else { 0 };
            held += b.observe(i * 10_000, run, BUSY).1 as u32;
        }
        assert_eq!(held, 0);
    }

    #[test]
    fn holding_stops_where_spinning_catches_most_requests() {
        // Bursts beside a hog: spinning catches most requests, and meets a
        // long backlog when the hog runs (run of 2,000 every 4,000
        // waits); held off, every wake-up finds 15 waiting.
        let mut b = Backlog::new();
        let mut now = 0;
        let mut step = |b: &mut Backlog, i: u64| {
            now += 1_000;
            let run = if now < b.until {
                15
            } else if i % 4_000 == 3_999 {
                2_000
            } else {
                0
            };
            b.observe(now, run, BUSY).1
        };
        for i in 0..200_000 {
            step(&mut b, i);
        }
        let held = (200_000..400_000).filter(|&i| step(&mut b, i)).count();
        assert!(held < 20_000, "held {held} of 200000 waits");
    }

    #[test]
    fn holding_goes_on_while_it_prevents_backlogs() {
        // Backlogs only while spinning: every wait not held is one.
        let mut b = Backlog::new();
        let mut holds = 0;
        for i in 0..2_000u64 {
            let now = i * MS;
            let spinning = now >= b.until;
            let (_, h) = b.observe(now, if spinning { BACKLOG_RUN } else { 0 }, BUSY);
            holds += h as u32;
        }
        assert!(holds > 1_800, "held {holds} of 2000 waits");
    }

    #[test]
    fn a_waiter_asleep_most_of_the_time_is_not_held() {
        // The backlogs of the test above, every wait not held is one, but
        // the waiter sleeps through most of its time (the gaps between
        // bursts): no hold. The same waiter busy is held.
        let run = |busy: f64| {
            let mut b = Backlog::new();
            (0..2_000u64)
                .filter(|&i| {
                    let now = i * MS;
                    let spinning = now >= b.until;
                    b.observe(now, if spinning { BACKLOG_RUN } else { 0 }, busy)
                        .1
                })
                .count()
        };
        assert_eq!(run(0.1), 0);
        assert!(run(SHARED_MAX_FRAC + 0.05) > 1_800);
    }
}
