//! How long a wait may spin: the adaptive controller.
//!
//! The shim's adaptive mode derives the spin budget from the recent
//! inter-arrival times the waiting thread saw (how long each intercepted
//! wait lasted until something was ready, whether it spun or slept). The
//! logic sits behind [`Controller`] so a fuller controller can replace it
//! without touching the hooks.

/// Chooses spin budgets from observed waits.
pub trait Controller {
    /// The spin budget for the next wait, at most `ceiling_ns`.
    fn budget_ns(&mut self, ceiling_ns: u64) -> u64;
    /// One finished wait lasted `wait_ns` until an event (not recorded for
    /// waits that timed out or failed).
    fn record(&mut self, wait_ns: u64);
}

const WINDOW: usize = 32;
/// Recompute the budget every this many records (sorting 32 words costs a
/// few hundred ns; amortised it is noise next to a syscall).
const EVERY: u32 = 8;
/// Spinning pays only if most waits end within the budget: below this many
/// of the window's waits short enough, do not spin at all.
const MIN_SHORT: usize = WINDOW / 2;
/// Slack added to the observed quantile, so a wait a little longer than
/// usual still ends while spinning.
const SLACK_NS: u64 = 2_000;

/// Budget = 1.5 × the 75th percentile of recent waits (+2 µs), if at least
/// half of the recent waits were shorter than the ceiling; else 0.
///
/// Why these numbers: a wait that spins and then sleeps anyway costs the
/// whole budget *plus* the wake-up, so spinning is worth it only when it
/// usually succeeds (half or more of waits within the ceiling); 1.5 × p75
/// catches the bulk of a jittery but quick peer without spinning through a
/// long gap. Until the window has filled once, the ceiling is used so the
/// first samples come from spinning waits (which measure arrival times
/// without a wake-up's delay).
#[derive(Debug, Clone, Copy)]
pub struct InterArrival {
    ring: [u32; WINDOW],
    next: usize,
    filled: bool,
    since: u32,
    /// Last computed budget; `u64::MAX` = "use the ceiling".
    budget: u64,
}

impl InterArrival {
    pub const fn new() -> Self {
        InterArrival {
            ring: [0; WINDOW],
            next: 0,
            filled: false,
            since: 0,
            budget: u64::MAX,
        }
    }

    /// The budget the window implies for `ceiling_ns`.
    fn compute(&self, ceiling_ns: u64) -> u64 {
        let mut s = self.ring;
        s.sort_unstable();
        let short = s.iter().filter(|&&w| (w as u64) <= ceiling_ns).count();
        if short < MIN_SHORT {
            return 0;
        }
        let p75 = s[(short * 3 / 4).min(short - 1)] as u64;
        (p75 + p75 / 2 + SLACK_NS).min(ceiling_ns)
    }
}

impl Default for InterArrival {
    fn default() -> Self {
        Self::new()
    }
}

impl Controller for InterArrival {
    fn budget_ns(&mut self, ceiling_ns: u64) -> u64 {
        if self.filled && self.since >= EVERY {
            self.since = 0;
            self.budget = self.compute(ceiling_ns);
        }
        self.budget.min(ceiling_ns)
    }

    fn record(&mut self, wait_ns: u64) {
        self.ring[self.next] = wait_ns.min(u32::MAX as u64) as u32;
        self.next = (self.next + 1) % WINDOW;
        if self.next == 0 {
            self.filled = true;
        }
        self.since = self.since.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(c: &mut InterArrival, ceiling: u64, waits: impl Iterator<Item = u64>) {
        for w in waits {
            let _ = c.budget_ns(ceiling);
            c.record(w);
        }
    }

    #[test]
    fn starts_at_the_ceiling() {
        assert_eq!(InterArrival::new().budget_ns(50_000), 50_000);
    }

    #[test]
    fn quick_peer_gets_a_budget_near_its_gaps() {
        let mut c = InterArrival::new();
        feed(&mut c, 50_000, (0..64).map(|i| 10_000 + (i % 4) * 1_000));
        let b = c.budget_ns(50_000);
        assert!((13_000..=25_000).contains(&b), "{b}");
    }

    #[test]
    fn slow_peer_gets_no_spin() {
        let mut c = InterArrival::new();
        feed(&mut c, 50_000, (0..64).map(|_| 1_000_000));
        assert_eq!(c.budget_ns(50_000), 0);
    }

    #[test]
    fn mostly_slow_peer_gets_no_spin_and_recovers() {
        let mut c = InterArrival::new();
        feed(
            &mut c,
            50_000,
            (0..64).map(|i| if i % 3 == 0 { 5_000 } else { 900_000 }),
        );
        assert_eq!(c.budget_ns(50_000), 0);
        feed(&mut c, 50_000, (0..64).map(|_| 8_000));
        assert!(c.budget_ns(50_000) > 8_000);
    }

    #[test]
    fn never_exceeds_the_ceiling() {
        let mut c = InterArrival::new();
        feed(&mut c, 20_000, (0..64).map(|_| 19_000));
        assert_eq!(c.budget_ns(20_000), 20_000);
    }
}
