//! Does a short slice while asleep pay for this thread? A trial of it
//! against none, decided on what the thread's own scheduler statistics
//! say.
//!
//! Beside busy neighbours, adaptive waits sleep under a short slice
//! ([`crate::slice::for_sleep`]) so that a woken waiter preempts the
//! neighbour. Whether that pays depends on the neighbours: beside bursty
//! ones at 100k requests/s it took queues down, beside a hog and bursty
//! neighbours at 10k/s it cost the thread CPU (four system calls a sleep)
//! and turns lost after the slice was given back, and its p50 came out at
//! up to 5× interrupt mode's (docs/design/adaptive.md, "A short slice
//! while asleep"). So the pressure sampler tries both, a period at a time:
//! in pairs of adjacent sampler periods, one with the slice and one
//! without (the order alternating from pair to pair, so that a load that
//! grows or shrinks over the trial favours neither), it reads the thread's
//! run-queue delay and CPU time (`/proc/self/task/TID/schedstat`) for each
//! period. The sum of the two is the time the thread either waited for its
//! CPU or spent on it, under the same request stream in both arms. After
//! [`PAIRS`] pairs the slice is kept if it cost less in at least [`WINS`]
//! of them and at most [`PAYS_BELOW`] of the other arm's total; otherwise
//! the sleeps go without it. The verdict holds for [`HOLD_PERIODS`]
//! periods of contended sleeping (twice, up to [`MAX_HOLD_DOUBLINGS`]
//! doublings, each time a trial repeats the verdict), then the slice is
//! tried again: neighbours come and go.
//!
//! Only periods in which the thread slept at least [`MIN_SLEEPS`] times on
//! a contended CPU count; any other breaks the pair it falls in. All of it
//! runs on the sampler's thread: the waiter reads one flag per sleep.

/// Pairs of periods in one trial.
pub const PAIRS: u32 = 8;
/// Pairs the slice must win (cost less in) for it to be kept.
pub const WINS: u32 = 5;
/// The slice is kept only if its periods cost at most this share of the
/// other arm's, in total: its four system calls a sleep are certain, a
/// gain within a few percent is not.
pub const PAYS_BELOW: f64 = 0.95;
/// Periods of contended sleeping a verdict holds before the next trial.
pub const HOLD_PERIODS: u32 = 40;
/// How many times the hold doubles while trials repeat their verdict.
pub const MAX_HOLD_DOUBLINGS: u32 = 2;
/// Contended sleeps a period needs to count.
pub const MIN_SLEEPS: u64 = 8;

/// The trial's verdict so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No trial has ended yet.
    Unknown,
    /// The last trial kept the slice.
    Pays,
    /// The last trial dropped it.
    DoesNotPay,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Trying {
        pair: u32,
        /// The cost of the pair's first period, once it counted.
        first: Option<f64>,
        sum_on: f64,
        sum_off: f64,
        wins: u32,
    },
    Holding {
        left: u32,
    },
}

const FRESH: Phase = Phase::Trying {
    pair: 0,
    first: None,
    sum_on: 0.0,
    sum_off: 0.0,
    wins: 0,
};

/// One thread's trial (see the module docs).
#[derive(Clone, Debug)]
pub struct SliceTrial {
    phase: Phase,
    verdict: Verdict,
    /// Trials in a row that gave the current verdict.
    streak: u32,
    trials: u32,
    /// The slice's periods' cost over the others', in the last trial.
    last_ratio: f64,
}

impl Default for SliceTrial {
    fn default() -> Self {
        SliceTrial {
            phase: FRESH,
            verdict: Verdict::Unknown,
            streak: 0,
            trials: 0,
            last_ratio: 1.0,
        }
    }
}

impl SliceTrial {
    /// Whether the thread's sleeps take the short slice in the coming
    /// period.
    pub fn arm(&self) -> bool {
        match self.phase {
            // Even pairs try the slice first, odd pairs second.
            Phase::Trying { pair, first, .. } => (pair % 2 == 0) == first.is_none(),
            Phase::Holding { .. } => self.verdict == Verdict::Pays,
        }
    }

    /// A period has passed under [`SliceTrial::arm`]: `sleeps` contended
    /// sleeps, and `cost`, the thread's run-queue delay plus its CPU time
    /// over the period's length.
    pub fn observe(&mut self, sleeps: u64, cost: f64) {
        if sleeps < MIN_SLEEPS || !cost.is_finite() {
            // Not comparable: the pair it falls in starts again.
            if let Phase::Trying { first, .. } = &mut self.phase {
                *first = None;
            }
            return;
        }
        let on = self.arm();
        match &mut self.phase {
            Phase::Holding { left } => {
                *left -= 1;
                if *left == 0 {
                    self.phase = FRESH;
                }
            }
            Phase::Trying {
                first: first @ None,
                ..
            } => *first = Some(cost),
            Phase::Trying {
                pair,
                first: Some(a),
                sum_on,
                sum_off,
                wins,
            } => {
                let (c_on, c_off) = if on { (cost, *a) } else { (*a, cost) };
                *sum_on += c_on;
                *sum_off += c_off;
                *wins += u32::from(c_on < c_off);
                *pair += 1;
                if *pair == PAIRS {
                    let (s_on, s_off, w) = (*sum_on, *sum_off, *wins);
                    self.decide(s_on, s_off, w);
                } else {
                    self.phase = Phase::Trying {
                        pair: *pair,
                        first: None,
                        sum_on: *sum_on,
                        sum_off: *sum_off,
                        wins: *wins,
                    };
                }
            }
        }
    }

    fn decide(&mut self, sum_on: f64, sum_off: f64, wins: u32) {
        let ratio = if sum_off > 0.0 { sum_on / sum_off } else { 1.0 };
        let v = if wins >= WINS && ratio <= PAYS_BELOW {
            Verdict::Pays
        } else {
            Verdict::DoesNotPay
        };
        self.streak = if v == self.verdict {
            self.streak + 1
        } else {
            1
        };
        self.verdict = v;
        self.trials += 1;
        self.last_ratio = ratio;
        self.phase = Phase::Holding {
            left: HOLD_PERIODS << (self.streak - 1).min(MAX_HOLD_DOUBLINGS),
        };
    }

    /// The last trial's verdict.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Trials ended.
    pub fn trials(&self) -> u32 {
        self.trials
    }

    /// The slice's cost over none's in the last trial (1.0 before one).
    pub fn last_ratio(&self) -> f64 {
        self.last_ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Run periods with the slice's cost `on` and none's `off` (each
    /// scaled by `noise(i)`), until `n` trials ended; the periods spent
    /// under the slice, and in all.
    fn run(
        t: &mut SliceTrial,
        on: f64,
        off: f64,
        n: u32,
        noise: impl Fn(u32) -> f64,
    ) -> (u32, u32) {
        let (mut under, mut all) = (0, 0);
        let end = t.trials() + n;
        while t.trials() < end {
            let arm = t.arm();
            under += u32::from(arm);
            t.observe(100, if arm { on } else { off } * noise(all));
            all += 1;
        }
        (under, all)
    }

    #[test]
    fn a_slice_that_costs_is_dropped_and_one_that_pays_is_kept() {
        let mut t = SliceTrial::default();
        assert_eq!(t.verdict(), Verdict::Unknown);
        assert!(t.arm(), "a trial starts with the slice");
        run(&mut t, 0.12, 0.10, 1, |_| 1.0);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
        assert!((t.last_ratio() - 1.2).abs() < 1e-9);
        assert!(!t.arm(), "held without the slice");
        let mut t = SliceTrial::default();
        run(&mut t, 0.05, 0.10, 1, |_| 1.0);
        assert_eq!(t.verdict(), Verdict::Pays);
        assert!(t.arm(), "held with the slice");
    }

    #[test]
    fn each_trial_tries_both_arms_equally_in_alternating_order() {
        let mut t = SliceTrial::default();
        let mut arms = Vec::new();
        for _ in 0..2 * PAIRS {
            arms.push(t.arm());
            t.observe(100, 1.0);
        }
        let on = arms.iter().filter(|a| **a).count() as u32;
        assert_eq!(on, PAIRS);
        assert_eq!(&arms[..4], &[true, false, false, true]);
        assert_eq!(t.trials(), 1);
    }

    #[test]
    fn a_gain_within_the_margin_does_not_keep_the_slice() {
        let mut t = SliceTrial::default();
        run(&mut t, 0.097, 0.10, 1, |_| 1.0);
        assert_eq!(
            t.verdict(),
            Verdict::DoesNotPay,
            "all pairs won, 3% is not enough"
        );
    }

    #[test]
    fn periods_that_do_not_count_break_a_pair_and_move_nothing() {
        let mut t = SliceTrial::default();
        t.observe(100, 0.5);
        assert!(!t.arm(), "second half of the first pair: without");
        // Too few sleeps: the half pair is dropped.
        t.observe(MIN_SLEEPS - 1, 0.1);
        assert!(t.arm(), "the pair starts again with the slice");
        t.observe(100, f64::NAN);
        assert!(t.arm());
        // A verdict holds only across counted periods.
        run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        for _ in 0..10 * HOLD_PERIODS {
            t.observe(0, 0.1);
        }
        assert_eq!(t.trials(), 1);
        assert!(!t.arm());
    }

    #[test]
    fn the_slice_is_tried_again_after_the_hold_and_the_hold_doubles_on_repeats() {
        let mut t = SliceTrial::default();
        let (_, first) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(first, 2 * PAIRS);
        let (_, second) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(second, HOLD_PERIODS + 2 * PAIRS);
        let (_, third) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(third, 2 * HOLD_PERIODS + 2 * PAIRS);
        for _ in 0..3 {
            let (_, n) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
            assert_eq!(n, (HOLD_PERIODS << MAX_HOLD_DOUBLINGS) + 2 * PAIRS);
        }
        // A changed verdict starts the hold over.
        let (_, n) = run(&mut t, 0.05, 0.1, 1, |_| 1.0);
        assert_eq!(n, (HOLD_PERIODS << MAX_HOLD_DOUBLINGS) + 2 * PAIRS);
        assert_eq!(t.verdict(), Verdict::Pays);
        let (_, n) = run(&mut t, 0.05, 0.1, 1, |_| 1.0);
        assert_eq!(n, HOLD_PERIODS + 2 * PAIRS);
    }

    #[test]
    fn a_load_that_grows_through_the_trial_favours_neither_arm() {
        // Equal arms under a load that doubles over the trial: the
        // alternating order leaves the slice's total above the bar.
        let mut t = SliceTrial::default();
        run(&mut t, 0.1, 0.1, 1, |i| 1.0 + i as f64 / 16.0);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
        assert!((t.last_ratio() - 1.0).abs() < 0.02, "{}", t.last_ratio());
    }

    proptest! {
        /// Under noise of ±20 % a period, drawn anew for each: a slice
        /// that costs 1.5× is dropped by every trial, and the thread spends
        /// only the trials' halves under it; one that costs 0.5× is kept.
        #[test]
        fn clear_differences_are_found_through_noise(seed in any::<u64>()) {
            let noise = move |i: u32| {
                let x = (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .wrapping_mul(0xBF58_476D_1CE4_E5B9);
                0.8 + 0.4 * ((x >> 11) as f64 / (1u64 << 53) as f64)
            };
            let mut worse = SliceTrial::default();
            let (under, all) = run(&mut worse, 0.15, 0.10, 4, noise);
            prop_assert_eq!(worse.verdict(), Verdict::DoesNotPay);
            prop_assert_eq!(under, 4 * PAIRS, "periods under the slice, of {}", all);
            let mut better = SliceTrial::default();
            run(&mut better, 0.05, 0.10, 3, noise);
            prop_assert_eq!(better.verdict(), Verdict::Pays);
        }
    }
}
