//! How long a wait may spin: the adaptive controller.
//!
//! The shim's adaptive mode uses the library's controller
//! ([`fastwake::adaptive::Core`]): the same learned wait-time histogram,
//! cost model, catch limit and idle-rate rule as `WaitMode::Adaptive`, so a
//! program under the shim and one linked against the library decide alike.
//! The shim keeps what is particular to a hook: the ceiling
//! (`FASTWAKE_BUDGET_US`), its own CPU-cap bucket, its preemption back-off
//! and the peer-CPU check (see `wait.rs`); the core is told nothing of
//! those (`Env::default()`), they are applied after it.
//!
//! The logic sits behind [`Controller`] so the hooks do not depend on it.

use fastwake::adaptive::{Config, Core, Env, Model, Outcome, Plan};

/// Chooses spin budgets from observed waits.
pub trait Controller {
    /// The spin budget for the wait starting at `now_ns` (any epoch), at
    /// most `ceiling_ns`.
    fn budget_ns(&mut self, now_ns: u64, ceiling_ns: u64) -> u64;
    /// The wait planned last ended with an event after `wait_ns`, of which
    /// `spun_ns` spinning; `slept` if it went on to block. Not called for
    /// waits that timed out or failed.
    fn record(&mut self, wait_ns: u64, spun_ns: u64, slept: bool);
}

/// The library's controller with its defaults.
#[derive(Debug, Clone)]
pub struct Learned(Core);

impl Learned {
    /// A `const fn`: the shim keeps one per thread in a const-initialised
    /// thread-local (no lazy initialisation, no destructor on a hook path).
    pub const fn new() -> Self {
        Learned(Core::new(Config::DEFAULT, Model::DEFAULT))
    }
}

impl Default for Learned {
    fn default() -> Self {
        Self::new()
    }
}

impl Controller for Learned {
    fn budget_ns(&mut self, now_ns: u64, ceiling_ns: u64) -> u64 {
        match self.0.plan(now_ns, Env::default()) {
            Plan::Spin(b) => b.min(ceiling_ns),
            Plan::Dispatch => 0,
        }
    }

    fn record(&mut self, wait_ns: u64, spun_ns: u64, slept: bool) {
        self.0.record(Outcome {
            waited_ns: wait_ns,
            spun_ns: spun_ns.min(wait_ns),
            slept,
            wake_ns: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits of `gap` ns one after another (each wait starts `gap` after the
    /// previous one ended, plus 1 µs of work); spinning ones are caught,
    /// blocking ones pay a 5 µs wake-up. Returns the last budget.
    fn feed(c: &mut Learned, ceiling: u64, gaps: impl Iterator<Item = u64>) -> u64 {
        let mut now = 1_000_000;
        let mut b = 0;
        for g in gaps {
            b = c.budget_ns(now, ceiling);
            if b >= g {
                c.record(g, g, false);
                now += g;
            } else {
                c.record(g + 5_000, b, true);
                now += g + 5_000;
            }
            now += 1_000;
        }
        b
    }

    #[test]
    fn learns_before_spinning() {
        assert_eq!(Learned::new().budget_ns(1_000, 50_000), 0);
    }

    #[test]
    fn quick_peer_gets_a_budget_that_catches_it() {
        let mut c = Learned::new();
        let b = feed(&mut c, 50_000, (0..400).map(|i| 10_000 + (i % 4) * 1_000));
        assert!((13_000..=50_000).contains(&b), "{b}");
    }

    #[test]
    fn slow_peer_gets_no_spin() {
        let mut c = Learned::new();
        assert_eq!(feed(&mut c, 50_000, (0..400).map(|_| 1_000_000)), 0);
    }

    #[test]
    fn mostly_slow_peer_gets_no_spin_and_recovers() {
        let mut c = Learned::new();
        let slow = (0..600).map(|i| if i % 3 == 0 { 5_000 } else { 2_000_000 });
        assert_eq!(feed(&mut c, 50_000, slow), 0);
        let b = feed(&mut c, 50_000, (0..2_000).map(|_| 8_000));
        assert!(b > 8_000, "{b}");
    }

    #[test]
    fn never_exceeds_the_ceiling() {
        let mut c = Learned::new();
        assert_eq!(feed(&mut c, 20_000, (0..400).map(|_| 19_000)), 20_000);
    }
}
