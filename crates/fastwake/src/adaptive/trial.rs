//! Does a behaviour of adaptive waits pay for this thread on a busy CPU?
//! A trial of it against none, decided on what the thread's own scheduler
//! statistics say. Two behaviours are tried so, one at a time (the
//! pressure sampler runs them in turn): the short slice while asleep,
//! below, and lean spins (spinning through short waits on a CPU others
//! want, `docs/design/adaptive.md`, "lean spins"), which beside a hog and
//! two neighbours that never rest kept the waiter off its CPU between
//! waits: 78 % of its waits spun lean, 93 % of those spins caught their
//! completion, and its p50 was 5.3× interrupt mode's with a run-queue delay
//! of 34.5 % of the time. The trial of lean spins counts periods by the
//! waits on a contended CPU instead of the sleeps, and before its first
//! verdict lean spins are allowed, as they were before it.
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
//! period. Its cost is the delay plus the CPU time over the waiter's worth
//! ([`crate::adaptive::Config::worth`], µs of CPU one µs of latency is
//! worth, as the rest of adaptive weighs them): the run-queue delay is
//! latency its completions waited, under the same request stream in both
//! arms, and the CPU holds the slice's system calls. Counting CPU time at
//! par with the delay undid the slice's gain at 100k/s: beside bursty
//! neighbours it cut the delay by 0.65 µs a request and added 0.74 µs of
//! CPU, while its p50 was 0.45× and its backlog 0.73× of the trial's.
//! After
//! [`PAIRS`] pairs the slice is kept if it cost less in at least [`WINS`]
//! of them and at most [`PAYS_BELOW`] of the other arm's total; otherwise
//! the sleeps go without it. A trial whose first [`EARLY_PAIRS`] pairs all
//! went the same way ends there. The verdict holds for [`HOLD_PERIODS`]
//! periods of contended sleeping (twice, up to [`MAX_HOLD_DOUBLINGS`]
//! doublings, each time a trial repeats the verdict), then the slice is
//! tried again: neighbours come and go.
//!
//! A period counts only if the thread slept at least [`MIN_SLEEPS`] times
//! on a contended CPU in it and in the periods on both sides of it: a
//! period in which the thread started or stopped sleeping partway through
//! holds the cost of whatever else it did (spinning in another wait,
//! computing) and would weigh on one arm by chance. A period that does
//! not count breaks the pair it falls in. So a period is judged one period
//! late; the arms run on a schedule fixed in advance (each trial's slots,
//! pair by pair). All of it runs on the sampler's thread: the waiter reads
//! one flag and bumps one counter per contended sleep.

/// Pairs of periods in one trial.
pub const PAIRS: u32 = 8;
/// Pairs after which a trial ends early when every pair went the same
/// way: the slice won them all and costs at most [`PAYS_BELOW`], or lost
/// them all. Each such period spent on the worse arm is a cost.
pub const EARLY_PAIRS: u32 = 4;
/// Pairs the slice must win (cost less in) for it to be kept.
pub const WINS: u32 = 5;
/// The slice is kept only if its periods cost less than this share of
/// the other arm's, in total. No margin: its system calls are in the cost
/// already (CPU time over worth), and where the arms tie either will do.
/// A margin of 5 % dropped the slice beside bursty neighbours at 100k/s
/// where it cost 0.96×, while with it for every sleep the p50 was 0.58×
/// and the backlog 0.84× of the trial's.
pub const PAYS_BELOW: f64 = 1.0;
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
        /// The trial slot the next period gets.
        next_slot: u32,
        /// The cost and slot of a pair's first period, once it counted.
        first: Option<(u32, f64)>,
        pairs: u32,
        sum_on: f64,
        sum_off: f64,
        wins: u32,
    },
    Holding {
        left: u32,
    },
}

const FRESH: Phase = Phase::Trying {
    next_slot: 0,
    first: None,
    pairs: 0,
    sum_on: 0.0,
    sum_off: 0.0,
    wins: 0,
};

/// A period: the arm it ran under, and its slot in trial `trial_no`, if it
/// was one of the trial's.
#[derive(Clone, Copy, Debug)]
struct Period {
    arm: bool,
    slot: Option<(u32, u32)>,
}

/// A period that ended, waiting for the next one to end: it counts only
/// if the thread slept through the periods on both sides of it too, so
/// that one it shared with other work (the thread busy elsewhere until or
/// from partway through) does not count as one of the arm's.
#[derive(Clone, Copy, Debug)]
struct Ended {
    period: Period,
    cost: f64,
    active: bool,
    /// Whether the period before it counted as one the thread slept
    /// through.
    before_active: bool,
}

/// Whether a trial slot runs with the slice: pairs alternate which half
/// has it (on-off, off-on, ...).
fn slot_arm(slot: u32) -> bool {
    let first_on = (slot / 2).is_multiple_of(2);
    first_on == slot.is_multiple_of(2)
}

/// One thread's trial (see the module docs).
#[derive(Clone, Debug)]
pub struct Trial {
    phase: Phase,
    /// The arm between trials while no trial has ended.
    unknown_arm: bool,
    verdict: Verdict,
    /// Trials in a row that gave the current verdict.
    streak: u32,
    trials: u32,
    /// The slice's periods' cost over the others', in the last trial.
    last_ratio: f64,
    /// Trials started, naming their slots.
    trial_no: u32,
    /// The period under way.
    now: Period,
    /// The period before it.
    pending: Option<Ended>,
}

impl Default for Trial {
    fn default() -> Self {
        let mut t = Trial {
            phase: FRESH,
            unknown_arm: false,
            verdict: Verdict::Unknown,
            streak: 0,
            trials: 0,
            last_ratio: 1.0,
            trial_no: 0,
            now: Period {
                arm: false,
                slot: None,
            },
            pending: None,
        };
        t.now = t.next_period();
        t
    }
}

impl Trial {
    /// A trial that holds `arm` while [`Trial::pause`]d before its first
    /// verdict (for a behaviour that was the rule before its trial
    /// existed, waiting for its turn after another trial's).
    pub fn waiting(arm: bool) -> Trial {
        Trial {
            unknown_arm: arm,
            ..Trial::default()
        }
    }

    /// Whether the behaviour is on in the period under way.
    pub fn arm(&self) -> bool {
        self.now.arm
    }

    /// Is a trial under way (arms alternating), rather than a verdict
    /// held?
    pub fn trying(&self) -> bool {
        matches!(self.phase, Phase::Trying { .. })
    }

    /// The period under way belongs to another trial: it does not count
    /// here, and this one holds its resting arm (its verdict's, or the
    /// one it was made with) until [`Trial::observe`] is called again; a
    /// pair under way starts again.
    pub fn pause(&mut self) {
        self.pending = None;
        if let Phase::Trying { first, .. } = &mut self.phase {
            *first = None;
        }
        self.now = Period {
            arm: self.resting_arm(),
            slot: None,
        };
    }

    fn resting_arm(&self) -> bool {
        match self.verdict {
            Verdict::Pays => true,
            Verdict::DoesNotPay => false,
            Verdict::Unknown => self.unknown_arm,
        }
    }

    /// The period under way has ended: `sleeps` contended sleeps, and
    /// `cost`, the thread's run-queue delay plus its CPU time over the
    /// period's length. The period before it is judged now: it counts if
    /// it and both its neighbours had [`MIN_SLEEPS`] and a cost.
    pub fn observe(&mut self, sleeps: u64, cost: f64) {
        let active = sleeps >= MIN_SLEEPS && cost.is_finite();
        let before = self.pending.take();
        if let Some(e) = before
            && e.active
            && e.before_active
            && active
        {
            self.feed(e.period, e.cost);
        }
        self.pending = Some(Ended {
            period: self.now,
            cost,
            active,
            before_active: before.is_some_and(|e| e.active),
        });
        self.now = self.next_period();
    }

    /// The arm and slot of the next period.
    fn next_period(&mut self) -> Period {
        match &mut self.phase {
            Phase::Trying { next_slot, .. } => {
                let slot = *next_slot;
                *next_slot += 1;
                Period {
                    arm: slot_arm(slot),
                    slot: Some((self.trial_no, slot)),
                }
            }
            Phase::Holding { .. } => Period {
                arm: self.resting_arm(),
                slot: None,
            },
        }
    }

    /// A period that counts.
    fn feed(&mut self, p: Period, cost: f64) {
        let trial_no = self.trial_no;
        match &mut self.phase {
            Phase::Holding { left } => {
                *left -= 1;
                if *left == 0 {
                    self.trial_no += 1;
                    self.phase = FRESH;
                }
            }
            Phase::Trying {
                first,
                pairs,
                sum_on,
                sum_off,
                wins,
                ..
            } => {
                let Some((g, slot)) = p.slot else { return };
                if g != trial_no {
                    return;
                }
                match *first {
                    _ if slot.is_multiple_of(2) => *first = Some((slot, cost)),
                    Some((s0, c0)) if s0 + 1 == slot => {
                        let (c_on, c_off) = if p.arm { (cost, c0) } else { (c0, cost) };
                        *sum_on += c_on;
                        *sum_off += c_off;
                        *wins += u32::from(c_on < c_off);
                        *pairs += 1;
                        *first = None;
                        let unanimous = *pairs >= EARLY_PAIRS
                            && (*wins == 0 || (*wins == *pairs && *sum_on < PAYS_BELOW * *sum_off));
                        if *pairs == PAIRS || unanimous {
                            let (s_on, s_off, w, n) = (*sum_on, *sum_off, *wins, *pairs);
                            self.decide(s_on, s_off, w, n);
                        }
                    }
                    // The pair's first half did not count.
                    _ => *first = None,
                }
            }
        }
    }

    fn decide(&mut self, sum_on: f64, sum_off: f64, wins: u32, pairs: u32) {
        let ratio = if sum_off > 0.0 { sum_on / sum_off } else { 1.0 };
        let v = if (wins >= WINS || wins == pairs) && ratio < PAYS_BELOW {
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
    fn run(t: &mut Trial, on: f64, off: f64, n: u32, noise: impl Fn(u32) -> f64) -> (u32, u32) {
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
        let mut t = Trial::default();
        assert_eq!(t.verdict(), Verdict::Unknown);
        assert!(t.arm(), "a trial starts with the slice");
        run(&mut t, 0.12, 0.10, 1, |_| 1.0);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
        assert!((t.last_ratio() - 1.2).abs() < 1e-9);
        t.observe(100, 0.1);
        assert!(!t.arm(), "held without the slice");
        let mut t = Trial::default();
        run(&mut t, 0.05, 0.10, 1, |_| 1.0);
        assert_eq!(t.verdict(), Verdict::Pays);
        t.observe(100, 0.1);
        assert!(t.arm(), "held with the slice");
    }

    #[test]
    fn each_pair_tries_both_arms_in_alternating_order() {
        let mut t = Trial::default();
        let mut arms = Vec::new();
        for _ in 0..2 * EARLY_PAIRS {
            arms.push(t.arm());
            t.observe(100, 1.0);
        }
        for (p, pair) in arms.chunks(2).enumerate() {
            assert_eq!(pair, [p % 2 == 0, p % 2 == 1], "pair {p}");
        }
    }

    /// A trial ends early only when every pair went the same way; else it
    /// runs all its pairs.
    #[test]
    fn a_split_trial_runs_all_its_pairs() {
        let mut t = Trial::default();
        // The slice costs less in the first half of each pair.
        let mut n = 0;
        while t.trials() == 0 {
            let cost = if n % 2 == 0 { 0.09 } else { 0.11 };
            t.observe(100, cost);
            n += 1;
        }
        assert_eq!(n, 2 * PAIRS + 3);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
    }

    #[test]
    fn a_small_gain_keeps_the_slice_and_a_tie_does_not() {
        let mut t = Trial::default();
        let (_, n) = run(&mut t, 0.097, 0.10, 1, |_| 1.0);
        assert_eq!(n, 2 * EARLY_PAIRS + 3, "every pair won: an early end");
        assert_eq!(t.verdict(), Verdict::Pays);
        let mut t = Trial::default();
        run(&mut t, 0.10, 0.10, 1, |_| 1.0);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
    }

    /// The thread sleeps in windows of a few periods between other work
    /// (as `bench load` runs its modes in turn). The periods at a window's
    /// edges hold that work's cost, ten times a sleeping period's here,
    /// whichever arm they ran under; they must not count, or they decide
    /// the trial by chance.
    #[test]
    fn periods_at_the_edges_of_sleeping_do_not_count() {
        for (window, gap) in [(4u32, 3u32), (5, 2), (6, 5)] {
            let mut t = Trial::default();
            let mut i = 0u32;
            while t.trials() < 3 {
                let k = i % (window + gap);
                if k < window {
                    let edge = k == 0 || k == window - 1;
                    let cost = match (edge, t.arm()) {
                        (true, _) => 1.0,
                        (false, true) => 0.12,
                        (false, false) => 0.10,
                    };
                    t.observe(100, cost);
                } else {
                    t.observe(0, 0.5);
                }
                i += 1;
                assert!(i < 100_000, "no trial ended ({window}, {gap})");
            }
            assert_eq!(t.verdict(), Verdict::DoesNotPay, "({window}, {gap})");
            assert!(
                (t.last_ratio() - 1.2).abs() < 1e-9,
                "({window}, {gap}): {}",
                t.last_ratio()
            );
        }
    }

    #[test]
    fn periods_that_do_not_count_move_no_hold() {
        let mut t = Trial::default();
        run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        for _ in 0..10 * HOLD_PERIODS {
            t.observe(MIN_SLEEPS - 1, 0.1);
            t.observe(100, f64::NAN);
        }
        assert_eq!(t.trials(), 1);
        assert!(!t.arm());
    }

    #[test]
    fn the_slice_is_tried_again_after_the_hold_and_the_hold_doubles_on_repeats() {
        let mut t = Trial::default();
        // The first period cannot count (none before it), so neither can
        // the first pair; the last pair is judged a period late.
        // Every pair goes the same way here: each trial ends early.
        let (_, first) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(first, 2 * EARLY_PAIRS + 3);
        // Later trials: the hold, the one period under way when it ended
        // (held, and not a slot of the trial), then the trial's pairs.
        let after = |hold: u32| hold + 1 + 2 * EARLY_PAIRS;
        let (_, second) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(second, after(HOLD_PERIODS));
        let (_, third) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
        assert_eq!(third, after(2 * HOLD_PERIODS));
        for _ in 0..3 {
            let (_, n) = run(&mut t, 0.2, 0.1, 1, |_| 1.0);
            assert_eq!(n, after(HOLD_PERIODS << MAX_HOLD_DOUBLINGS));
        }
        // A changed verdict starts the hold over.
        let (_, n) = run(&mut t, 0.05, 0.1, 1, |_| 1.0);
        assert_eq!(n, after(HOLD_PERIODS << MAX_HOLD_DOUBLINGS));
        assert_eq!(t.verdict(), Verdict::Pays);
        let (_, n) = run(&mut t, 0.05, 0.1, 1, |_| 1.0);
        assert_eq!(n, after(HOLD_PERIODS));
    }

    #[test]
    fn a_load_that_grows_through_the_trial_favours_neither_arm() {
        // Equal arms under a load that doubles over the trial: the
        // alternating order leaves the slice's total above the bar.
        let mut t = Trial::default();
        run(&mut t, 0.1, 0.1, 1, |i| 1.0 + i as f64 / 16.0);
        assert_eq!(t.verdict(), Verdict::DoesNotPay);
        assert!((t.last_ratio() - 1.0).abs() < 0.02, "{}", t.last_ratio());
    }

    proptest! {
        /// Under noise of ±20 % a period, drawn anew for each: a slice
        /// that costs 1.5× is dropped by every trial, and the thread spends
        /// only the trials' halves (and the period each is judged late)
        /// under it; one that costs 0.5× is kept.
        #[test]
        fn clear_differences_are_found_through_noise(seed in any::<u64>()) {
            let noise = move |i: u32| {
                let x = (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .wrapping_mul(0xBF58_476D_1CE4_E5B9);
                0.8 + 0.4 * ((x >> 11) as f64 / (1u64 << 53) as f64)
            };
            let mut worse = Trial::default();
            let (under, all) = run(&mut worse, 0.15, 0.10, 4, noise);
            prop_assert_eq!(worse.verdict(), Verdict::DoesNotPay);
            prop_assert!(under <= 4 * (PAIRS + 1), "{} periods under the slice, of {}", under, all);
            let mut better = Trial::default();
            run(&mut better, 0.05, 0.10, 3, noise);
            prop_assert_eq!(better.verdict(), Verdict::Pays);
        }
    }
}
