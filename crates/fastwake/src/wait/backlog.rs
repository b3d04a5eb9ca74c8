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

/// See the module docs. Const-constructible, no heap.
#[derive(Debug, Clone)]
pub struct Backlog {
    until: u64,
    hold_ns: u64,
    /// Completions taken in backlogs, and all completions, with spinning
    /// allowed and held off.
    spin: (f64, f64),
    held: (f64, f64),
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
            spin: (0.0, 0.0),
            held: (0.0, 0.0),
        }
    }

    /// A wait starts at `now` after `run` completions were taken without
    /// waiting: was it a backlog (first), and is spinning held off now
    /// (second)?
    pub fn observe(&mut self, now: u64, run: u32) -> (bool, bool) {
        let holding = now < self.until;
        let backlog = run >= BACKLOG_RUN;
        let acc = if holding {
            &mut self.held
        } else {
            &mut self.spin
        };
        // The run, and the completion the previous wait returned.
        acc.1 += run as f64 + 1.0;
        if backlog {
            acc.0 += run as f64;
            if !holding && self.holding_helps() {
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
        if self.spin.1 + self.held.1 > MEMORY {
            for x in [&mut self.spin, &mut self.held] {
                x.0 /= 2.0;
                x.1 /= 2.0;
            }
        }
        (backlog, now < self.until)
    }

    /// Has holding spinning off cut the share of completions taken in
    /// backlogs (to [`HOLD_GAIN`] of spinning's), or not been tried lately?
    fn holding_helps(&self) -> bool {
        if self.held.1 < MIN_TRIED {
            return true;
        }
        let share = |(b, n): (f64, f64)| b / n.max(1.0);
        share(self.held) <= HOLD_GAIN * share(self.spin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_backlog_holds_spinning_off_then_lets_it_resume() {
        let mut b = Backlog::new();
        assert_eq!(b.observe(0, 3), (false, false));
        assert_eq!(b.observe(MS, BACKLOG_RUN - 1), (false, false));
        assert_eq!(b.observe(2 * MS, BACKLOG_RUN), (true, true));
        assert_eq!(b.observe(40 * MS, 0), (false, true));
        assert_eq!(b.observe(60 * MS, 0), (false, false));
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
                let run = if k == k0 { BACKLOG_RUN } else { 0 };
                h |= b.observe(i * 10 * MS + k * 10_000, run).1;
            }
            h
        };
        let held = (0..100u64).filter(|&i| at(&mut b, i)).count();
        let tail = (100..200u64).filter(|&i| at(&mut b, i)).count();
        assert!(held > 0, "never held");
        assert!(tail < 20, "still held {tail} of 100 times");
    }

    #[test]
    fn holding_goes_on_while_it_prevents_backlogs() {
        // Backlogs only while spinning: every wait not held is one.
        let mut b = Backlog::new();
        let mut holds = 0;
        for i in 0..2_000u64 {
            let now = i * MS;
            let spinning = now >= b.until;
            let (_, h) = b.observe(now, if spinning { BACKLOG_RUN } else { 0 });
            holds += h as u32;
        }
        assert!(holds > 1_800, "held {holds} of 2000 waits");
    }
}
