//! Sleep, then poll: the pre-wake plan of adaptive mode.
//!
//! Many µs waits are predictable: an RDMA READ of a large object, an NVMe
//! read, a request to a server whose service time is steady. Spinning
//! through the whole wait costs a core; sleeping costs a wake-up after the
//! completion. When the waits are concentrated, a waiter can instead sleep
//! on a timer until shortly before the earliest typical completion and spin
//! from there: the timer's lateness is paid *before* the completion, so it
//! costs no latency, and only the last stretch is spun. The kernel does
//! this for block devices (blk-mq's `io_poll_delay`, io_uring's
//! `IORING_SETUP_HYBRID_IOPOLL`); here it is done in user space, for every
//! source, from the waits this waiter has seen.
//!
//! What is kept, per waiter, all const-constructible and without heap:
//! - the last [`RECENT`] wait lengths, exact (the log-linear histogram's
//!   buckets are ~19 % wide, too coarse to place a wake-up inside a ±10 %
//!   service time);
//! - the last [`LATENESS`] timer lateness samples (wake-up time minus the
//!   time asked for), measured on each pre-wake whose timer fired: the
//!   margin is a high quantile of them, learned on this host, not assumed.
//!   They are forgotten after [`LATENESS_TTL_WAITS`] waits without a new
//!   one: lateness is only measured by pre-wakes, so a burst of late
//!   timers that left no room to sleep would otherwise stop the pre-wakes
//!   that could measure the timers recover, for good.
//!
//! The plan ([`Candidate`]) is chosen by the learner's one objective,
//! latency + CPU/worth, evaluated over the exact recent waits, so it wins
//! only where it beats spinning and interrupt mode on the same terms.

/// Wait lengths kept for planning pre-wakes.
pub const RECENT: usize = 64;
/// Waits needed before a pre-wake is planned.
pub const MIN_RECENT: usize = 32;
/// Timer lateness samples kept.
pub const LATENESS: usize = 32;
/// Waits after the last lateness sample before the samples are forgotten
/// and the margin is the bootstrap one again, which probes the timers
/// anew. Four windows of recent waits: while pre-wakes run, every one
/// whose timer fires refreshes the samples, so only a waiter that has
/// stopped pre-waking (or whose waits stopped being predictable) gets
/// here; the probes it then plans cost at most [`MIN_LATENESS`] early or
/// wide-margin pre-wakes per this many waits (seen once in CI: a burst of
/// timers 329 µs late at p90 left no room in 300 µs waits, and the waiter
/// never pre-woke again).
pub const LATENESS_TTL_WAITS: u32 = 4 * RECENT as u32;
/// Each time the samples are forgotten while they left no room to sleep
/// before the shortest recent wait (the timers still too late for the
/// waits), the next forgetting waits twice as long, up to this many times
/// [`LATENESS_TTL_WAITS`]; samples that left room bring it back to once.
/// Why: steady 19 µs waits beside timers ~20 µs late were probed every
/// 256 waits for good, two plan changes each time.
pub const MAX_TTL_FACTOR: u32 = 32;
/// Lateness samples needed before the margin is their quantile; until
/// then the margin is [`BOOTSTRAP_MARGIN_NS`], or half the earliest wait
/// when that is less (a pre-wake has to happen for its timer to be
/// measured, so the first ones are planned with a margin that holds for
/// any plausible lateness).
pub const MIN_LATENESS: usize = 8;
/// The margin before the timer is measured: 2.5x the worst p99 lateness
/// seen on this project's VMs (27-39 µs, `clock_nanosleep` with a 1 ns
/// slack), so the first pre-wakes are early, never late.
pub const BOOTSTRAP_MARGIN_NS: u64 = 100_000;
/// The margin is this quantile of the lateness samples...
pub const MARGIN_QUANTILE: f64 = 0.9;
/// ...plus this much (clock reads, the re-check before spinning).
pub const MARGIN_GUARD_NS: u64 = 1_000;
/// A pre-wake is planned only when the median recent wait is at most this
/// many times the shortest (strays aside: [`STRAYS`]).
pub const CONCENTRATION: u64 = 2;
/// Of every this many recent waits, the shortest one is a stray once the
/// timers are measured: not the shortest wait a plan is placed by, and
/// weighed in its figures as a completion that comes early (a wake-up, as
/// in interrupt mode). One
/// short wait among 64 (a message sent early, a retransmit, two requests
/// close together) otherwise stopped every pre-wake until it left the
/// window: a busy-polling server at 1,000 msg/s, whose waits were
/// 915-1,009 µs but for one of 214 µs, blocked through the next 64.
pub const STRAYS: usize = 32;
/// Shortest sleep worth planning: below it the timer's own CPU and its
/// lateness eat what the sleep saves.
pub const MIN_SLEEP_NS: u64 = 8_000;

/// Where a pre-wake's completion arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Before the timer: the source woke the thread (an interrupt-mode
    /// wake-up; the waits' low quantile was too optimistic).
    Early,
    /// While spinning after the timer: the plan's aim.
    Caught,
    /// After the spin budget: the thread slept again.
    Late,
}

/// A pre-wake plan: sleep `sleep_ns` from the start of the wait, then spin
/// until `spin_end_ns` from the start, then block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub sleep_ns: u64,
    pub spin_end_ns: u64,
}

/// A small ring of the most recent `N` values.
#[derive(Debug, Clone)]
struct Ring<const N: usize> {
    v: [u32; N],
    n: usize,
    next: usize,
}

impl<const N: usize> Ring<N> {
    const fn new() -> Self {
        Ring {
            v: [0; N],
            n: 0,
            next: 0,
        }
    }

    fn push(&mut self, x: u64) {
        self.v[self.next] = x.min(u32::MAX as u64) as u32;
        self.next = (self.next + 1) % N;
        self.n = (self.n + 1).min(N);
    }

    /// The values, sorted, in `out` (which must hold `N`); returns how many.
    fn sorted(&self, out: &mut [u32; N]) -> usize {
        out[..self.n].copy_from_slice(&self.v[..self.n]);
        out[..self.n].sort_unstable();
        self.n
    }
}

/// What the pre-wake plan learns (see the module docs).
#[derive(Debug, Clone)]
pub struct Prewake {
    waits: Ring<RECENT>,
    lateness: Ring<LATENESS>,
    /// Lateness samples seen (for the explain line).
    samples: u64,
    /// Waits recorded since the last lateness sample.
    since_lateness: u32,
    /// Times the lateness samples were forgotten as stale.
    forgotten: u64,
    /// Waits without a sample before they are forgotten (see
    /// [`MAX_TTL_FACTOR`]).
    ttl: u32,
}

/// The model's costs a pre-wake is weighed with.
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    /// Latency of a wake-up by the source, ns.
    pub wake_ns: f64,
    /// CPU of one sleep, ns.
    pub sleep_cpu_ns: f64,
    /// µs of CPU one µs of latency is worth.
    pub worth: f64,
    /// The caller's longest spin, ns, counted from the thread's wake-up
    /// (`u64::MAX`: none; [`crate::wait::Decision::Prewake`]): a
    /// completion later than the wake-up plus this is a miss, however far
    /// the plan's spin end. Weighed only once the margin is learned from
    /// the timers: the probes that measure them (the bootstrap margin)
    /// must run, whatever the ceiling cuts off their spins.
    pub spin_max_ns: u64,
}

/// A candidate with its predicted figures.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    pub plan: Candidate,
    /// Objective J, ns (latency + CPU/worth), per wait.
    pub cost: f64,
    /// Predicted CPU per wait, ns.
    pub cpu: f64,
    /// Predicted spin per wait, ns.
    pub spin: f64,
    /// Predicted share of waits caught spinning.
    pub p_hit: f64,
}

impl Default for Prewake {
    fn default() -> Self {
        Prewake::new()
    }
}

impl Prewake {
    pub const fn new() -> Self {
        Prewake {
            waits: Ring::new(),
            lateness: Ring::new(),
            samples: 0,
            since_lateness: 0,
            forgotten: 0,
            ttl: LATENESS_TTL_WAITS,
        }
    }

    /// Learn one wait's length (from its start to its completion).
    #[inline]
    pub fn record_wait(&mut self, w_ns: u64) {
        self.waits.push(w_ns);
        self.since_lateness = self.since_lateness.saturating_add(1);
        if self.since_lateness >= self.ttl && self.lateness.n > 0 {
            self.forget();
        }
    }

    /// Forget the lateness samples (stale), and set how long the next
    /// ones last: longer each time the timers they measured left no room
    /// to sleep (see [`MAX_TTL_FACTOR`]).
    #[cold]
    fn forget(&mut self) {
        let room = self
            .margin_ns()
            .is_some_and(|m| self.shortest_wait_ns().saturating_sub(m) >= MIN_SLEEP_NS);
        self.ttl = if room {
            LATENESS_TTL_WAITS
        } else {
            (self.ttl * 2).min(MAX_TTL_FACTOR * LATENESS_TTL_WAITS)
        };
        self.lateness = Ring::new();
        self.since_lateness = 0;
        self.forgotten += 1;
    }

    /// Learn one timer's lateness (woke this long after the time asked).
    pub fn record_lateness(&mut self, ns: u64) {
        self.lateness.push(ns);
        self.samples += 1;
        self.since_lateness = 0;
    }

    /// Times the lateness samples were forgotten as stale (see
    /// [`LATENESS_TTL_WAITS`]).
    pub fn lateness_forgotten(&self) -> u64 {
        self.forgotten
    }

    /// The shortest recent wait a plan is placed by (see [`STRAYS`]), ns
    /// (0: none yet).
    pub fn shortest_wait_ns(&self) -> u64 {
        let mut s = [0u32; RECENT];
        let n = self.waits.sorted(&mut s);
        if n == 0 { 0 } else { s[self.first(n)] as u64 }
    }

    /// Which of `n` sorted recent waits a plan is placed by: strays aside
    /// once the timers are measured. Before, the probes that measure them
    /// are placed by every wait: set aside, the strays of a 50k/s stream
    /// (20 µs gaps, a few of 9 µs) let a dispatcher probe 9 µs timers that
    /// fired 20-60 µs late, after the completion, so no lateness was ever
    /// learned and the probes went on (a sixth of its waits paused).
    fn first(&self, n: usize) -> usize {
        if self.timers_measured() {
            n / STRAYS
        } else {
            0
        }
    }

    /// Enough lateness samples for a margin ([`Prewake::margin_ns`] is
    /// `Some`), without sorting them.
    fn timers_measured(&self) -> bool {
        self.lateness.n >= MIN_LATENESS
    }

    /// Lateness samples seen.
    pub fn lateness_samples(&self) -> u64 {
        self.samples
    }

    /// The margin in force, ns, when enough lateness was measured (`None`:
    /// not yet; see [`BOOTSTRAP_MARGIN_NS`]).
    pub fn margin_ns(&self) -> Option<u64> {
        let mut s = [0u32; LATENESS];
        let n = self.lateness.sorted(&mut s);
        (n >= MIN_LATENESS).then(|| quantile(&s[..n], MARGIN_QUANTILE) as u64 + MARGIN_GUARD_NS)
    }

    /// The lateness the figures are computed over: four quantiles of the
    /// measured lateness (each standing for a quarter of the timers), or
    /// none measured yet (`[0]`: the bootstrap margin is wide enough).
    fn lateness_points(&self) -> ([u64; 4], usize) {
        let mut s = [0u32; LATENESS];
        let n = self.lateness.sorted(&mut s);
        if n < MIN_LATENESS {
            return ([0; 4], 1);
        }
        let s = &s[..n];
        (
            [0.125, 0.375, 0.625, 0.875].map(|q| quantile(s, q) as u64),
            4,
        )
    }

    /// `c` with the ceiling weighed only once the margin is learned (see
    /// [`Costs::spin_max_ns`]).
    fn ceilinged(&self, c: Costs) -> Costs {
        if self.timers_measured() {
            c
        } else {
            Costs {
                spin_max_ns: u64::MAX,
                ..c
            }
        }
    }

    /// What `plan` would have cost over the recent waits under `c`
    /// (`None`: too few waits).
    pub fn evaluate(&self, plan: Candidate, c: Costs) -> Option<Figures> {
        let mut s = [0u32; RECENT];
        let n = self.waits.sorted(&mut s);
        if n < MIN_RECENT {
            return None;
        }
        let (late, m) = self.lateness_points();
        Some(figures(&s[..n], plan, &late[..m], self.ceilinged(c)))
    }

    /// The best pre-wake plan for the recent waits under `c`, with its
    /// figures; `None` when there are too few waits or no sleep is long
    /// enough to be worth it. Evaluated over the exact recent waits and
    /// the measured timer lateness: for each wake-up point (a low order
    /// recent wait less a margin, one of three quantiles of the lateness)
    /// and each spin end (a high order statistic), what each recent wait
    /// would have cost with each lateness. Runs only where the shortest
    /// recent wait is long enough to sleep in, so it is done well before
    /// the completion it plans for is due.
    pub fn best(&self, c: Costs) -> Option<Figures> {
        let mut s = [0u32; RECENT];
        let n = self.waits.sorted(&mut s);
        // Every recent wait, strays too, must be long enough to sleep in:
        // the search runs at the start of a wait, and must be done well
        // before that wait's completion is due.
        if n < MIN_RECENT || (s[0] as u64) < MIN_SLEEP_NS {
            return None;
        }
        let first = self.first(n);
        let s = &s[..n];
        // Concentrated enough? The shortest recent wait must be at least
        // half the median: then a sleep covers most of every wait. A
        // spread-out distribution (exponential, heavy-tailed: the shortest
        // of 64 is a few % of the median) would be slept through only
        // briefly, for the timer's CPU, and its plan is a spin budget.
        if (s[first] as u64) * CONCENTRATION < s[n / 2] as u64 {
            return None;
        }
        let (late, m) = self.lateness_points();
        let late = &late[..m];
        let c = self.ceilinged(c);
        let margins: [Option<u64>; 3] = match self.margin_ns() {
            None => [None; 3],
            Some(m90) => {
                let mut l = [0u32; LATENESS];
                let k = self.lateness.sorted(&mut l);
                let q = |x| Some(quantile(&l[..k], x) as u64 + MARGIN_GUARD_NS);
                [q(0.5), q(0.75), Some(m90)]
            }
        };
        let mut best: Option<Figures> = None;
        // The wake-up point is a margin before the *shortest* recent wait,
        // never a later order statistic: a completion the waits predict
        // then never comes while the thread sleeps on its timer (which
        // would cost a full wake-up).
        let lo = s[first] as u64;
        for margin in margins {
            let sleep_ns = match margin {
                Some(m) => lo.saturating_sub(m),
                None => lo - (lo / 2).min(BOOTSTRAP_MARGIN_NS),
            };
            if sleep_ns < MIN_SLEEP_NS {
                continue;
            }
            for j in [n / 2, 3 * n / 4, n - 3, n - 1] {
                let end = (s[j] as u64 + MARGIN_GUARD_NS).max(sleep_ns + MARGIN_GUARD_NS);
                let plan = Candidate {
                    sleep_ns,
                    spin_end_ns: end,
                };
                let f = figures(s, plan, late, c);
                if best.is_none_or(|b| f.cost < b.cost) {
                    best = Some(f);
                }
            }
            if margin.is_none() {
                break;
            }
        }
        best
    }
}

/// What `plan` would have cost over the waits `s`, each timer late by each
/// of `late` in turn, the spin cut at `c.spin_max_ns` from the wake-up.
fn figures(s: &[u32], plan: Candidate, late: &[u64], c: Costs) -> Figures {
    let (mut lat, mut cpu, mut spin, mut hits) = (0.0f64, 0.0f64, 0.0f64, 0u32);
    let sleep = plan.sleep_ns;
    for &l in late {
        let awake = sleep + l;
        let end = plan.spin_end_ns.min(awake.saturating_add(c.spin_max_ns));
        for &w in s {
            let w = w as u64;
            if w <= sleep {
                // Early: the source wakes the thread, as in interrupt mode.
                lat += c.wake_ns;
                cpu += c.sleep_cpu_ns;
            } else if w <= awake {
                // The timer has fired, the thread is not running yet: it
                // finds the completion when it runs.
                lat += (awake - w) as f64;
                cpu += c.sleep_cpu_ns;
            } else if w <= end {
                hits += 1;
                let x = (w - awake) as f64;
                spin += x;
                cpu += c.sleep_cpu_ns + x;
            } else {
                // Late: the whole spin, then a second sleep.
                let x = end.saturating_sub(awake) as f64;
                spin += x;
                lat += c.wake_ns;
                cpu += 2.0 * c.sleep_cpu_ns + x;
            }
        }
    }
    let n = (s.len() * late.len()) as f64;
    Figures {
        plan,
        cost: lat / n + cpu / n / c.worth,
        cpu: cpu / n,
        spin: spin / n,
        p_hit: hits as f64 / n,
    }
}

/// The `q` quantile of sorted `s` (nearest rank).
fn quantile(s: &[u32], q: f64) -> u32 {
    let i = ((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    const COSTS: Costs = Costs {
        wake_ns: 4_300.0,
        sleep_cpu_ns: 5_000.0,
        worth: 100.0,
        spin_max_ns: u64::MAX,
    };

    fn fed(waits: impl Iterator<Item = u64>, late: &[u64]) -> Prewake {
        let mut p = Prewake::new();
        for w in waits {
            p.record_wait(w);
        }
        for &l in late {
            p.record_lateness(l);
        }
        p
    }

    #[test]
    fn a_steady_wait_is_slept_through_to_just_before_its_earliest_completion() {
        // 1 ms ± 10 %, lateness 5-15 µs: wake at least a margin (p90 of
        // the lateness + guard) before the shortest wait seen.
        let waits = (0..64).map(|i| 900_000 + i * 3_125);
        let late: Vec<u64> = (0..32).map(|i| 5_000 + (i % 11) * 1_000).collect();
        let p = fed(waits, &late);
        let m = p.margin_ns().unwrap();
        assert!((14_000..=17_000).contains(&m), "margin {m}");
        let f = p.best(COSTS).expect("a plan");
        assert!(f.plan.sleep_ns + m <= 900_000 + 4 * 3_125, "{f:?}");
        assert!(f.plan.sleep_ns >= 800_000, "{f:?}");
        // Spins about the jitter plus the margin, not the whole wait.
        assert!(f.spin < 150_000.0, "{f:?}");
        assert!(f.p_hit > 0.9, "{f:?}");
    }

    #[test]
    fn the_ceiling_cuts_each_spin_at_the_wake_up_plus_it() {
        // Waits 900-1000 µs, timers 5-15 µs late: unbounded, the plan
        // catches nearly every wait; weighed with a 20 µs ceiling from the
        // wake-up, the same plan spins at most that per wait and the
        // later completions are misses.
        let waits = (0..64).map(|i| 900_000 + i * 1_600);
        let late: Vec<u64> = (0..32).map(|i| 5_000 + (i % 11) * 1_000).collect();
        let p = fed(waits, &late);
        let free = p.best(COSTS).expect("a plan");
        let cut = Costs {
            spin_max_ns: 20_000,
            ..COSTS
        };
        let f = p.evaluate(free.plan, cut).expect("figures");
        assert!(free.p_hit > 0.9, "{free:?}");
        assert!(f.spin <= 20_000.0, "{f:?}");
        assert!(f.p_hit < free.p_hit - 0.3, "{f:?} against {free:?}");
        // Before the timers are measured, the ceiling is not weighed: the
        // probes that measure them must run.
        let fresh = fed((0..64).map(|i| 900_000 + i * 1_600), &[]);
        let probe = fresh.best(cut).expect("a probe");
        assert_eq!(fresh.evaluate(probe.plan, cut).unwrap().p_hit, probe.p_hit);
        assert_eq!(
            fresh.evaluate(probe.plan, COSTS).unwrap().p_hit,
            probe.p_hit
        );
    }

    #[test]
    fn without_lateness_samples_the_margin_is_the_bootstrap_one() {
        let p = fed((0..64).map(|_| 150_000), &[]);
        assert_eq!(p.margin_ns(), None);
        assert_eq!(p.best(COSTS).unwrap().plan.sleep_ns, 75_000);
        let p = fed((0..64).map(|_| 1_000_000), &[]);
        assert_eq!(p.best(COSTS).unwrap().plan.sleep_ns, 900_000);
    }

    #[test]
    fn stale_lateness_is_forgotten_so_the_timers_are_probed_again() {
        // A burst of timers 329 µs late left no room to sleep in 300 µs
        // waits; with no pre-wake nothing measures the timers again, so
        // the samples must age out, and the bootstrap margin probes anew.
        let mut p = fed((0..64).map(|_| 300_000), &[329_000; 32]);
        assert!(p.best(COSTS).is_none());
        for _ in 1..LATENESS_TTL_WAITS {
            p.record_wait(300_000);
        }
        assert!(p.best(COSTS).is_none(), "forgotten a wait too early");
        assert_eq!(p.lateness_forgotten(), 0);
        p.record_wait(300_000);
        assert_eq!(p.lateness_forgotten(), 1);
        assert_eq!(p.margin_ns(), None);
        assert_eq!(p.best(COSTS).unwrap().plan.sleep_ns, 200_000);
        // While pre-wakes measure the timers, the samples are kept.
        let mut p = fed((0..64).map(|_| 300_000), &[20_000; 32]);
        for _ in 0..4 * LATENESS_TTL_WAITS {
            p.record_wait(300_000);
            p.record_lateness(20_000);
        }
        assert_eq!(p.lateness_forgotten(), 0);
        assert_eq!(p.margin_ns(), Some(21_000));
    }

    #[test]
    fn probes_that_find_no_room_again_come_further_apart() {
        // 300 µs waits, timers 329 µs late: each probe (the bootstrap
        // margin) measures the same, then no plan until forgotten.
        let mut p = fed((0..64).map(|_| 300_000), &[329_000; 32]);
        let until_forgotten = |p: &mut Prewake| {
            let (f0, mut n) = (p.lateness_forgotten(), 0u32);
            while p.lateness_forgotten() == f0 {
                p.record_wait(300_000);
                n += 1;
            }
            n
        };
        let mut gaps = vec![];
        for _ in 0..5 {
            gaps.push(until_forgotten(&mut p));
            // The probe: MIN_LATENESS timers, all as late as before.
            assert_eq!(p.margin_ns(), None);
            for _ in 0..MIN_LATENESS {
                p.record_lateness(329_000);
            }
            assert!(p.best(COSTS).is_none());
        }
        let t = LATENESS_TTL_WAITS;
        assert_eq!(gaps, vec![t, 2 * t, 4 * t, 8 * t, 16 * t]);
        // Timers that leave room again (the probe found them on time):
        // forgotten after the long wait once more, then soon again.
        for _ in 0..LATENESS {
            p.record_lateness(20_000);
        }
        assert!(p.best(COSTS).is_some());
        assert_eq!(until_forgotten(&mut p), 32 * t);
        for _ in 0..MIN_LATENESS {
            p.record_lateness(20_000);
        }
        assert_eq!(until_forgotten(&mut p), t);
        // And the backing off stops at its ceiling.
        let mut p = fed((0..64).map(|_| 300_000), &[329_000; 32]);
        for _ in 0..12 {
            until_forgotten(&mut p);
            for _ in 0..MIN_LATENESS {
                p.record_lateness(329_000);
            }
        }
        assert_eq!(p.ttl, MAX_TTL_FACTOR * t);
    }

    #[test]
    fn short_or_few_waits_get_no_plan() {
        assert!(
            fed((0..64).map(|_| 9_000), &[1_000; 8])
                .best(COSTS)
                .is_none()
        );
        assert!(
            fed((0..31).map(|_| 500_000), &[1_000; 8])
                .best(COSTS)
                .is_none()
        );
    }
}
