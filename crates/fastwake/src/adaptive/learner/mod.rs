//! The decision, with time passed in: no clock, no syscall, no thread.
//!
//! [`Learner`] learns the distribution of wait times `W` (from the start of a
//! wait that found nothing to the completion) and picks, for the next wait,
//! the plan that minimises
//!
//! ```text
//! J(B) = latency(B) + CPU(B) / worth
//! latency(B) = P(W > B) · wake                     (a caught wait costs ~nothing)
//! CPU(B)     = E[min(W, B)] + P(W > B) · sleep_cpu  (spin, plus a sleep when it misses)
//! ```
//!
//! over the spin budgets `B ∈ {0} ∪ {bucket edges}` (`B = 0` is interrupt
//! mode), subject to the CPU cap: the predicted spin fraction
//! `E[min(W, B)] · waits-per-second` must stay under it. `worth` says how
//! many µs of CPU one µs of latency is worth (λ = 1/worth).
//!
//! Why this form: with `worth = 1` it is the classic ski-rental rule (spin
//! up to about the wake-up cost, 2-competitive); a learned distribution lets
//! it do better than the worst case, e.g. spin exactly through the short
//! gaps inside a burst and not through the idle gap after it. Under a
//! memoryless (Poisson) stream the optimum is all-or-nothing: spin when the
//! mean gap is below `wake · worth + sleep_cpu`, else interrupt mode; that
//! is what makes an idle stream fall back to interrupt mode.
//!
//! Guards around the model:
//! - **hysteresis**: the budget changes only when the new one is better by
//!   more than [`SWITCH_MARGIN`], so steady load gives a steady plan;
//! - **CPU cap**: the caller passes what the cap's allowance affords now
//!   ([`Env::allowance_ns`]; the wait governor keeps the allowance, a
//!   token bucket refilled at `cap` × elapsed time); no plan spins past it,
//!   so the cap holds even when the model is wrong;
//! - **environment** (from the caller): never spin against a producer on the
//!   same CPU, nor on a CPU where other threads want to run.

use super::hist::Hist;
use super::prewake::{Arrival, Candidate, Prewake};
use super::{AdaptiveStats, Config, Reason};

mod figures;

/// Recompute the plan every this many waits (the scan over the buckets
/// costs ~100 ns; amortised it is noise)...
pub const RECOMPUTE_EVERY: u32 = 16;
/// ...or when this much time has passed since the last recompute.
pub const RECOMPUTE_NS: u64 = 10_000_000;
/// Waits needed before the first spin (until then: interrupt mode, which
/// also measures the waits, through the wake-up).
pub const MIN_WEIGHT: f32 = 8.0;
/// A new plan must beat the current one by this fraction of J (plus
/// [`SWITCH_FLOOR_NS`]) to replace it.
pub const SWITCH_MARGIN: f64 = 0.15;
/// Margin for a switch from interrupt mode to spinning (a change of
/// regime): wider, so a load near the break-even point stays in one regime
/// instead of flapping on estimate noise. The way back (spin to interrupt)
/// needs only [`SWITCH_MARGIN`]: near break-even the cheaper CPU wins.
pub const REGIME_MARGIN: f64 = 0.25;
/// Absolute part of the switching threshold, ns of J.
pub const SWITCH_FLOOR_NS: f64 = 20.0;
/// Shortest spin budget worth planning: below it a budget saves nothing a
/// 1 µs one would not (the spin stops at the completion anyway), and the
/// smallest buckets hold mostly the noise of wake-up estimates.
pub const MIN_BUDGET_NS: u64 = 1_024;
/// On a contended CPU, spin only while the spin stays below this share of
/// the core over the long run; see `apply_env`.
pub const SHARED_MAX_FRAC: f64 = 0.3;
/// Time constant of the window the spin's share of the core is judged
/// over: ten cycles of a 20 ms ON/OFF pattern, and about what a scheduler
/// remembers of a thread's recent use.
pub const SHARE_WINDOW_NS: u64 = 200_000_000;
/// Longest pause between two looks that the share window counts in full.
pub const MAX_SHARE_GAP_NS: u64 = 20_000_000;
/// A short slice given back in more than this lost the CPU on the way: a
/// give-back is two system calls (1-3 µs in a VM); the kernel then let
/// another thread run first, for up to its own slice.
pub const SLOW_GIVE_BACK_NS: u64 = 50_000;
/// Longest spin budget: beyond it a wait is long enough to sleep through.
pub const MAX_BUDGET_NS: u64 = 10_000_000;
/// When most recent pre-wakes came early (the completion woke the thread
/// before its timer: the waits it learned were longer than the real
/// ones, as where a source's wake-ups are not measured and the model's
/// 4.3 µs is far below the host's), pre-wakes are not planned for this
/// long, then tried again. Why: measured under the shim, sockperf's epoll
/// server planned 2,300 pre-wakes and caught none.
pub const PREWAKE_PAUSE_NS: u64 = 1_000_000_000;

/// What waiting costs on this machine (defaults: a cross-core futex
/// wake-up measured at p50 4.3 µs on the project's 2-vCPU VM type on a
/// day its host was quick; `fastwake doctor` measures this host's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// Latency a blocking wait adds over a spinning one (cross-core futex
    /// wake-up, p50 ≈ 4.3 µs here).
    pub wake_ns: f64,
    /// CPU the waiter spends per sleep (arm, futex wait, wake-up, re-check;
    /// about half of the ~6 µs per futex round trip).
    pub sleep_cpu_ns: f64,
    /// Latency of a hand-off from the core's dispatcher (same-core wake).
    pub dispatch_ns: f64,
    /// CPU the waiter spends per dispatcher hand-off.
    pub dispatch_cpu_ns: f64,
}

impl Model {
    /// The defaults, as a constant (see [`Learner::new`]).
    pub const DEFAULT: Model = Model {
        wake_ns: 4_300.0,
        sleep_cpu_ns: 3_000.0,
        dispatch_ns: 1_000.0,
        dispatch_cpu_ns: 1_500.0,
    };
}

impl Default for Model {
    fn default() -> Self {
        Model::DEFAULT
    }
}

/// Interrupt mode, spinning or dispatch: switching between these needs a
/// wider margin than adjusting a budget.
fn regime(p: Plan) -> u8 {
    match p {
        Plan::Spin(0) => 0,
        Plan::Spin(_) => 1,
        Plan::Dispatch => 2,
        Plan::Prewake { .. } => 3,
    }
}

/// What the caller knows about the world at a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Env {
    /// The producer last ran on this CPU.
    pub same_cpu: bool,
    /// Another thread of this process waits on this CPU: a spin would
    /// hold the CPU its completion needs (see `wait::siblings`).
    pub siblings: bool,
    /// Other threads want this CPU (from the pressure sampler).
    pub contended: bool,
    /// A spin of this waiter lost its CPU lately (the wait governor's
    /// back-off after preemption): on a contended CPU no spin is planned,
    /// lean ones included.
    pub spin_preempted: bool,
    /// The lean-spin trial bars lean spins on this thread now: its
    /// verdict found that they cost the thread more than sleeping, or its
    /// trial runs a period without them ([`crate::adaptive::trials`]). On
    /// a contended CPU no spin is planned, as after a preempted spin.
    pub lean_barred: bool,
    /// A live dispatcher serves this CPU, shared by this many waiters;
    /// `None` when there is none (or dispatch is not built in).
    pub dispatch_waiters: Option<u32>,
    /// The longest spin the CPU cap affords now, ns (`u64::MAX`: no cap).
    /// The cap's allowance is kept by the caller (the wait governor owns
    /// the one CPU cap of every spinning mode); the learner only reads it,
    /// so a model that is wrong about the waits still cannot spin past it.
    pub allowance_ns: u64,
    /// The caller can sleep on the source until a time and then spin
    /// ([`Plan::Prewake`]); when it cannot, the best other plan is taken.
    pub prewake: bool,
    /// The waiter fell behind lately (a long run of completions taken
    /// without waiting; the wait governor's backlog rule): no spinning.
    pub behind: bool,
    /// The longest spin the caller does (`u64::MAX`: none; the shim's
    /// `FASTWAKE_BUDGET_US`). A spin plan is cut to it, which still
    /// catches the completions that come early in the spin. A pre-wake's
    /// spin is cut to it counted from the thread's wake-up
    /// ([`crate::wait::Decision::Prewake`]), and every pre-wake plan is
    /// weighed with its spin so cut, once the margin is learned from the
    /// timers ([`crate::adaptive::prewake::Costs::spin_max_ns`]): a
    /// completion past the wake-up plus the ceiling counts as a miss.
    pub spin_ceiling_ns: u64,
}

impl Default for Env {
    fn default() -> Self {
        Env::FREE
    }
}

impl Env {
    /// Nothing known: no constraint from the environment.
    pub const FREE: Env = Env {
        same_cpu: false,
        siblings: false,
        contended: false,
        spin_preempted: false,
        lean_barred: false,
        dispatch_waiters: None,
        allowance_ns: u64::MAX,
        prewake: true,
        behind: false,
        spin_ceiling_ns: u64::MAX,
    };
}

/// How to do one wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Spin for at most this many ns, then block. 0 = interrupt mode.
    Spin(u64),
    /// Register with the core's dispatcher and sleep until it hands off.
    Dispatch,
    /// Sleep on the source until `sleep_ns` after the start of the wait
    /// (a completion before then wakes the thread as in interrupt mode),
    /// then spin until `spin_end_ns` after the start, then block: sleep,
    /// then poll ([`super::prewake`]).
    Prewake { sleep_ns: u64, spin_end_ns: u64 },
}

impl Plan {
    fn prewake(c: Candidate) -> Plan {
        Plan::Prewake {
            sleep_ns: c.sleep_ns,
            spin_end_ns: c.spin_end_ns,
        }
    }
}

/// How one wait went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// From the start of the wait to the completion (or the deadline).
    pub waited_ns: u64,
    /// Of which spinning.
    pub spun_ns: u64,
    /// The thread slept (the completion came after the spin, if any).
    pub slept: bool,
    /// This wait's wake-up latency, when the source dated its ring
    /// ([`crate::source::BlockReport::wake_ns`]); learning then takes the
    /// wait's true length from it instead of from the model's figure.
    pub wake_ns: Option<u64>,
    /// A pre-wake: where its completion arrived (`slept` is then true for
    /// [`Arrival::Early`] and [`Arrival::Late`], false for a catch).
    pub arrival: Option<Arrival>,
    /// A pre-wake whose timer fired: how late the thread ran after the
    /// time it asked for, ns (the margin of later pre-wakes is a high
    /// quantile of these).
    pub late_ns: Option<u64>,
}

/// The plan the model prefers, and its predicted figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub plan: Plan,
    /// Objective J, ns.
    pub cost: f64,
    /// Predicted probability that a wait is caught while spinning.
    pub p_hit: f64,
    /// Predicted fraction of a core spent spinning.
    pub spin_frac: f64,
    /// Predicted CPU per wait, ns (spin plus sleeps).
    pub cpu: f64,
}

/// The learning controller, with time passed in (see the module docs).
#[derive(Debug, Clone)]
pub struct Learner {
    cfg: Config,
    model: Model,
    hist: Hist,
    plan: Plan,
    choice: Option<Choice>,
    since: u32,
    last_recompute: u64,
    /// EWMA of ns between waits (for the predicted spin fraction).
    cycle_ns: f64,
    last_wait: Option<u64>,
    pending: Option<(Plan, Reason)>,
    /// The last recompute rejected the current plan.
    rejected: bool,
    /// The plan under the CPU-only objective (worth = 1), for a contended
    /// CPU: spin only through gaps shorter than a sleep costs.
    lean: Plan,
    /// Long-run share of a core the lean plan spins.
    lean_frac: f64,
    /// Long-run share of a core the plan spins (with the catch limit).
    full_frac: f64,
    /// The same without the catch limit: the model's own budget, which a
    /// contended CPU spins while this share is small (see `apply_env`).
    model_frac: f64,
    /// The best plan other than a pre-wake, for callers that cannot sleep
    /// until a time ([`Env::prewake`]) while the plan is one.
    fallback: Plan,
    /// What the pre-wake plan learns: exact recent waits, timer lateness.
    prewake: Prewake,
    /// Long-run share of a core the pre-wake plan spins.
    prewake_frac: f64,
    /// Share of recent pre-wakes whose completion came early (a moving
    /// average over about 8), how many it has seen, and no pre-wake plans
    /// before this time (see [`PREWAKE_PAUSE_NS`]).
    pw_early: f64,
    pw_seen: u32,
    pw_off_until: u64,
    /// The caller's longest spin ([`Env::spin_ceiling_ns`]), weighed in
    /// every pre-wake plan's figures.
    spin_ceiling_ns: u64,
    /// Waits and ns in a window decaying over [`SHARE_WINDOW_NS`] of time
    /// (updated at each recompute), for the spin's share of the core: a
    /// window of waits would span only the last burst of a bursty stream.
    win_waits: f64,
    win_ns: f64,
    win_last: Option<u64>,
    win_pending: u32,
    /// Of `win_ns`, the ns the waiter slept in its waits (and those slept
    /// since the last recompute): what is left is the time it wanted the
    /// CPU ([`Learner::busy_share`]).
    win_asleep: f64,
    asleep_pending: f64,
    /// Longest budget [`Config::catch_pct`] allows (u64::MAX: no limit).
    catch_ns: u64,
    /// Sleep CPU costs observed so far (the first replaces the default).
    sleep_samples: u32,
    /// Wake-up latencies observed so far, and their moving average.
    wake_samples: u32,
    measured_wake_ns: f64,
    /// Long-run mean ns between waits: the running mean of the first
    /// [`RATE_MEMORY`] gaps, then an EWMA with that memory. Unlike
    /// `cycle_ns` (a few dozen waits) it spans many bursts and the idle
    /// gaps between them.
    long_gap_ns: f64,
    gaps: u32,
    /// Waits since the last plan that found their completion ready at the
    /// first look and so were never planned ([`Learner::note_found_ready`]).
    found: u64,
    stats: AdaptiveStats,
}

/// Memory of the long-run rate, in waits: at 1,000 waits/s half a second,
/// so a rare bursty stream is judged on many bursts, and at 100,000/s
/// 5 ms, so a stream that speeds up leaves the idle rule quickly.
pub const RATE_MEMORY: u32 = 512;
/// Gaps count at most this much towards the long-run rate.
pub const MAX_RATE_GAP_NS: u64 = 50_000_000;
/// Waits that found their completion ready count towards the long-run
/// rate when at least this many came between two plans: a waiter behind
/// its stream. Fewer are the completions that arrived while a sleeping
/// waiter woke up; counted, they made a 1,000/s ON/OFF waiter spin
/// through more of its bursts, at 1.5-1.6x interrupt mode's CPU against
/// 1.0-1.1x, for the same p50 (two alternated pairs of `bench load`).
pub const RATE_RUN: u64 = 8;

/// The long-run mean gap `mean` of `seen` gaps after `k` more of `g` each:
/// the running mean up to [`RATE_MEMORY`] gaps, then an EWMA with that
/// memory, as `k` single updates would make it.
fn long_run_mean(mean: f64, seen: u32, g: f64, k: u64) -> f64 {
    let m = seen.min(RATE_MEMORY) as u64;
    // Running-mean slots left, then EWMA steps.
    let j = k.min(RATE_MEMORY as u64 - m);
    let mean = if j > 0 {
        (m as f64 * mean + j as f64 * g) / (m + j) as f64
    } else {
        mean
    };
    let rest = (k - j).min(i32::MAX as u64) as i32;
    g + (mean - g) * (1.0 - 1.0 / RATE_MEMORY as f64).powi(rest)
}

impl Learner {
    /// A `const fn`, so a `Learner` can live in a const-initialised
    /// thread-local (the preload shim's: no lazy initialisation and no
    /// destructor on a hook path).
    pub const fn new(cfg: Config, model: Model) -> Self {
        Learner {
            cfg,
            model,
            hist: Hist::new(),
            plan: Plan::Spin(0),
            choice: None,
            since: 0,
            last_recompute: 0,
            cycle_ns: 0.0,
            last_wait: None,
            pending: None,
            rejected: false,
            lean: Plan::Spin(0),
            lean_frac: 1.0,
            full_frac: 1.0,
            model_frac: 1.0,
            fallback: Plan::Spin(0),
            prewake: Prewake::new(),
            prewake_frac: 1.0,
            pw_early: 0.0,
            pw_seen: 0,
            pw_off_until: 0,
            spin_ceiling_ns: u64::MAX,
            win_waits: 0.0,
            win_ns: 0.0,
            win_last: None,
            win_pending: 0,
            win_asleep: 0.0,
            asleep_pending: 0.0,
            catch_ns: u64::MAX,
            sleep_samples: 0,
            wake_samples: 0,
            measured_wake_ns: 0.0,
            long_gap_ns: 0.0,
            gaps: 0,
            found: 0,
            stats: AdaptiveStats::ZERO,
        }
    }

    pub fn config(&self) -> Config {
        self.cfg
    }

    pub fn model(&self) -> Model {
        self.model
    }

    pub fn stats(&self) -> AdaptiveStats {
        self.stats
    }

    /// Waits planned so far.
    #[inline]
    pub fn decisions(&self) -> u64 {
        self.stats.decisions
    }

    pub fn hist(&self) -> &Hist {
        &self.hist
    }

    /// Spin budget under the CPU-only objective (used on a contended CPU).
    pub fn lean_budget(&self) -> u64 {
        match self.lean {
            Plan::Spin(b) => b,
            Plan::Dispatch | Plan::Prewake { .. } => 0,
        }
    }

    /// The current plan (before the environment and the cap).
    pub fn current_plan(&self) -> Plan {
        self.plan
    }

    /// What the pre-wake plan learned (margin, lateness samples).
    pub fn prewake(&self) -> &Prewake {
        &self.prewake
    }

    /// Longest budget the catch rule allows now (u64::MAX: no limit).
    pub fn catch_budget(&self) -> u64 {
        self.catch_ns
    }

    /// Learn what one sleep costs in CPU (arm, block, wake-up, re-check),
    /// as measured by the caller; the model's default is replaced by the
    /// first observation and then follows a moving average (1/8 weight).
    /// Clamped to 0.5-100 µs: one sleep that was preempted or charged a
    /// page fault must not swing every budget.
    pub fn observe_sleep_cpu(&mut self, ns: u64) {
        let x = (ns as f64).clamp(500.0, 100_000.0);
        self.sleep_samples = self.sleep_samples.saturating_add(1);
        self.model.sleep_cpu_ns = if self.sleep_samples == 1 {
            x
        } else {
            self.model.sleep_cpu_ns + (x - self.model.sleep_cpu_ns) / 8.0
        };
    }

    /// Sleep CPU costs observed (0: the model's default is in use).
    pub fn sleep_samples(&self) -> u32 {
        self.sleep_samples
    }

    /// Fold one measured wake-up latency (ring to running) into the
    /// average, and into the model with [`Config::learn_wake`]. Why
    /// measure: the default is one figure from another day's host, and a
    /// wake-up is what every spin budget is weighed against (the cost of a
    /// miss, the ski-rental budget), while the real one moves with the
    /// host's state and the IRQ/IPI path of the source. Clamped so one
    /// preempted wake-up cannot swing the average.
    pub fn observe_wake(&mut self, ns: u64) {
        let x = (ns as f64).clamp(200.0, 1_000_000.0);
        self.wake_samples = self.wake_samples.saturating_add(1);
        self.measured_wake_ns = if self.wake_samples == 1 {
            x
        } else {
            // At most 4x the current estimate per sample, then the EWMA.
            let x = x.min(4.0 * self.measured_wake_ns);
            self.measured_wake_ns + (x - self.measured_wake_ns) / 8.0
        };
        if self.cfg.learn_wake {
            self.model.wake_ns = self.measured_wake_ns;
        }
    }

    /// Wake-up latencies observed.
    pub fn wake_samples(&self) -> u32 {
        self.wake_samples
    }

    /// Moving average of the observed wake-up latencies, ns (0: none).
    pub fn measured_wake_ns(&self) -> f64 {
        self.measured_wake_ns
    }

    /// Long-run waits per second (0 before the second wait).
    pub fn rate(&self) -> f64 {
        if self.long_gap_ns > 0.0 {
            1e9 / self.long_gap_ns
        } else {
            0.0
        }
    }

    /// Share of the time the waiter wanted its CPU (running or runnable:
    /// not asleep in a wait), over the window the spin's share is judged
    /// over ([`SHARE_WINDOW_NS`]); 1 before the window holds a few waits.
    /// A waiter that sleeps through most of it, between the bursts of a
    /// bursty stream, is below its fair share of a contended CPU whatever
    /// it does inside the bursts (see `wait::backlog`).
    pub fn busy_share(&self) -> f64 {
        if self.win_waits < MIN_WEIGHT as f64 || self.win_ns <= 0.0 {
            return 1.0;
        }
        (1.0 - self.win_asleep / self.win_ns).clamp(0.0, 1.0)
    }

    /// Below the idle rate (see [`Config::idle_rate`])? Judged once the
    /// learning phase has seen a few gaps.
    fn idle(&self) -> bool {
        self.cfg.idle_rate > 0
            && self.gaps as f32 >= MIN_WEIGHT
            && self.rate() < self.cfg.idle_rate as f64
    }

    /// The last choice of the model (before the environment and the cap).
    pub fn choice(&self) -> Option<Choice> {
        self.choice
    }

    fn cap(&self) -> f64 {
        self.cfg.cap_pct as f64 / 100.0
    }

    fn capped(&self) -> bool {
        self.cfg.cap_pct < 100
    }

    /// Decide how to do the wait that starts at `now` (ns, any epoch).
    pub fn plan(&mut self, now: u64, env: Env) -> Plan {
        if let Some(prev) = self.last_wait {
            let gap = now.saturating_sub(prev) as f64;
            self.cycle_ns = if self.cycle_ns == 0.0 {
                gap
            } else {
                // ~1/16 weight per wait: close to the histogram's memory.
                self.cycle_ns + (gap - self.cycle_ns) / 16.0
            };
            // The gap held this wait's predecessor and the waits that
            // found their completion ready since: a waiter that is behind
            // takes most of its completions that way, and counting only
            // the waits that waited made it look idle, which put it in
            // interrupt mode and further behind. A run shorter than
            // RATE_RUN is not counted: one or two completions that came
            // while a sleeping waiter woke up are how it sees a short gap.
            let found = std::mem::take(&mut self.found);
            let k = 1 + if found >= RATE_RUN { found } else { 0 };
            // One long pause (seconds) would otherwise hold a busy stream
            // in the idle rule for a thousand waits after it resumes: the
            // gap counts at most that much, however many waits it held.
            let g = gap.min(MAX_RATE_GAP_NS as f64) / k as f64;
            self.long_gap_ns = long_run_mean(self.long_gap_ns, self.gaps, g, k);
            self.gaps = self.gaps.saturating_add(k.min(u32::MAX as u64) as u32);
        }
        self.last_wait = Some(now);
        if env.spin_ceiling_ns != self.spin_ceiling_ns {
            // The caller's longest spin weighs every pre-wake plan: a new
            // one is a new model.
            self.spin_ceiling_ns = env.spin_ceiling_ns;
            self.choice = None;
        }
        if self.since >= RECOMPUTE_EVERY
            || now.saturating_sub(self.last_recompute) >= RECOMPUTE_NS
            || self.choice.is_none()
        {
            self.recompute(now, env);
        }
        self.stats.decisions += 1;
        self.win_pending += 1;
        let (plan, reason) = self.apply_env(env);
        self.stats.count(reason);
        self.pending = Some((plan, reason));
        plan
    }

    fn apply_env(&self, env: Env) -> (Plan, Reason) {
        if self.hist.total() < MIN_WEIGHT {
            return (Plan::Spin(0), Reason::Learning);
        }
        let plan = match self.plan {
            Plan::Prewake { .. } if !env.prewake => self.fallback,
            p => p,
        };
        // Fell behind: every spinning plan is what loses the CPU then.
        // (A producer on this CPU rules spinning out first, and is the
        // better reason: its completions queue while this thread runs.)
        if env.behind && !env.same_cpu && !matches!(plan, Plan::Spin(0)) {
            return match (plan, env.dispatch_waiters) {
                (Plan::Dispatch, Some(_)) => (Plan::Dispatch, Reason::Dispatch),
                _ => (Plan::Spin(0), Reason::Behind),
            };
        }
        // A pre-wake spins only the end of each wait, so the idle rule's
        // reason (spinning through bursts costs many times the CPU of
        // interrupt mode) does not hold for it: its CPU is in its cost.
        if self.idle() && !matches!(plan, Plan::Prewake { .. }) {
            return (Plan::Spin(0), Reason::IdleRate);
        }
        if let Plan::Prewake {
            sleep_ns,
            spin_end_ns,
        } = plan
        {
            return if env.same_cpu {
                (Plan::Spin(0), Reason::SameCpu)
            } else if env.siblings {
                match env.dispatch_waiters {
                    Some(_) => (Plan::Dispatch, Reason::Dispatch),
                    None => (Plan::Spin(0), Reason::Siblings),
                }
            } else if env.contended
                && (env.spin_preempted || env.lean_barred || self.prewake_frac > SHARED_MAX_FRAC)
            {
                (Plan::Spin(0), Reason::Contended)
            } else if spin_end_ns.saturating_sub(sleep_ns) > env.allowance_ns {
                (Plan::Spin(0), Reason::Cap)
            } else {
                (plan, Reason::Prewake)
            };
        }
        match plan {
            Plan::Dispatch if env.dispatch_waiters.is_some() => (Plan::Dispatch, Reason::Dispatch),
            Plan::Dispatch | Plan::Spin(0) | Plan::Prewake { .. } => {
                (Plan::Spin(0), Reason::LongWaits)
            }
            Plan::Spin(b) => {
                if env.same_cpu {
                    (Plan::Spin(0), Reason::SameCpu)
                } else if env.siblings {
                    // Many waiters on one core: what a dispatcher is for.
                    match env.dispatch_waiters {
                        Some(_) => (Plan::Dispatch, Reason::Dispatch),
                        None => (Plan::Spin(0), Reason::Siblings),
                    }
                } else if env.contended {
                    // Other threads want this CPU. What decides is the
                    // spin's share of the CPU over the long run: a waiter
                    // that spins most of the time has used up its fair
                    // share, so the scheduler runs the other threads'
                    // whole slices before it and it loses the wake-up
                    // preemption a sleeper gets (measured next to a CPU
                    // hog: a 100k/s Poisson stream spinning, p50 15 µs vs
                    // 12 µs in interrupt mode at more CPU), while a waiter
                    // that spins through short bursts keeps its priority
                    // and its latency (a 10k/s ON/OFF stream, 10 % duty:
                    // spinning 3.9 µs vs 11.6 µs, for 2 % of a core).
                    // So: the model's budget while its share is small,
                    // without the catch limit: on a free CPU a miss costs
                    // one wake-up and the limit trades that tail for CPU,
                    // but here a miss gives the CPU to the others, the
                    // wake-up waits for the scheduler to preempt them, and
                    // the rest of the burst queues behind it (measured
                    // beside two busy processes, a 10k/s ON/OFF stream:
                    // the 90 % catch limit, 33-57 µs, missed 3-7 times a
                    // burst, p50 12-168 µs; without it 1.2-1.6 times, the
                    // burst's end, p50 0.2-0.7 µs; a 50 µs hybrid had
                    // 0.2-18 µs in the same runs).
                    // Else the catch-limited budget if its share is small;
                    // else only the CPU-only budget (spinning that costs
                    // less than a sleep and wake-up, which take the
                    // others' CPU too), if that share is small; else
                    // interrupt mode.
                    // But not while a spin lost the CPU lately: the
                    // waiter did not keep its priority then, and whatever
                    // it was to catch waited out the others' turns (beside
                    // a hog and two busy processes, a 10k/s Poisson stream
                    // that spun 60-67 % of its waits lean had a p50 of
                    // 1.46-1.48 ms against interrupt mode's 0.24-0.47 ms).
                    let full = b.min(self.catch_ns);
                    let afford = |x: u64| x <= env.allowance_ns;
                    if env.spin_preempted || env.lean_barred {
                        (Plan::Spin(0), Reason::Contended)
                    } else if self.model_frac <= SHARED_MAX_FRAC && afford(b) {
                        (Plan::Spin(b), Reason::LeanSpin)
                    } else if self.full_frac <= SHARED_MAX_FRAC && afford(full) {
                        (Plan::Spin(full), Reason::LeanSpin)
                    } else {
                        match self.lean {
                            Plan::Spin(l)
                                if l > 0 && self.lean_frac <= SHARED_MAX_FRAC && afford(l) =>
                            {
                                (Plan::Spin(l.min(b)), Reason::LeanSpin)
                            }
                            _ => (Plan::Spin(0), Reason::Contended),
                        }
                    }
                } else {
                    let b = b.min(self.catch_ns);
                    if b > env.allowance_ns {
                        (Plan::Spin(0), Reason::Cap)
                    } else {
                        (Plan::Spin(b), Reason::Spin)
                    }
                }
            }
        }
    }

    /// `n` waits found their completion ready at the first look, without
    /// a plan: they count towards the long-run rate the idle rule reads
    /// (see [`crate::adaptive::Config::idle_rate`]), as the waits they are,
    /// when at least [`RATE_RUN`] came before the next plan.
    pub fn note_found_ready(&mut self, n: u64) {
        self.found = self.found.saturating_add(n);
    }

    /// The caller saw a backlog (see [`Env::behind`]): counted.
    pub fn note_backlog(&mut self) {
        self.stats.backlogs += 1;
    }

    /// The caller slept under a short slice (see
    /// [`crate::adaptive::Config::sleep_slice_us`]): counted.
    pub fn note_short_slice(&mut self) {
        self.stats.short_slice_sleeps += 1;
    }

    /// A short slice was given back in `ns`: counted as lost when that
    /// took over [`SLOW_GIVE_BACK_NS`].
    pub fn note_give_back(&mut self, ns: u64) {
        if ns > SLOW_GIVE_BACK_NS {
            self.stats.slow_give_backs += 1;
            self.stats.slow_give_back_ns += ns;
        }
    }

    /// Why the wait planned last was planned that way.
    pub fn last_reason(&self) -> Reason {
        self.pending.map_or(Reason::Learning, |(_, r)| r)
    }

    /// Forget the wait planned last (it failed: its length says nothing).
    pub fn forget_pending(&mut self) {
        self.pending = None;
    }

    /// Record how the wait planned last went, finishing at `now`.
    pub fn record(&mut self, outcome: Outcome) {
        let (plan, _) = self.pending.take().unwrap_or((Plan::Spin(0), Reason::Spin));
        self.stats.spin_ns += outcome.spun_ns;
        if let Plan::Spin(b) = plan
            && b > 0
        {
            if outcome.slept {
                self.stats.spin_misses += 1;
            } else {
                self.stats.spin_hits += 1;
            }
        }
        if let Some(l) = outcome.late_ns {
            self.prewake.record_lateness(l);
        }
        if let Some(a) = outcome.arrival {
            let early = if a == Arrival::Early { 1.0 } else { 0.0 };
            self.pw_early += (early - self.pw_early) / 8.0;
            self.pw_seen = self.pw_seen.saturating_add(1);
        }
        match outcome.arrival {
            Some(Arrival::Early) => self.stats.prewake_early += 1,
            Some(Arrival::Caught) => self.stats.prewake_caught += 1,
            Some(Arrival::Late) => self.stats.prewake_late += 1,
            None => {}
        }
        // What the wait would have been with an infinite spin: exact when
        // caught spinning; after a sleep the wake-up latency is in the
        // measurement, so subtract the model's figure (never below what
        // was already spun).
        let w = if outcome.slept {
            let est = match (plan, outcome.wake_ns) {
                (Plan::Dispatch, _) => outcome.waited_ns as f64 - self.model.dispatch_ns,
                (_, Some(w)) => outcome.waited_ns as f64 - w as f64,
                (_, None) => outcome.waited_ns as f64 - self.model.wake_ns,
            };
            (est.max(0.0) as u64).max(outcome.spun_ns)
        } else {
            outcome.waited_ns
        };
        // A completion that came before a pre-wake's timer came before the
        // time the plan slept to, whatever the wake-up cost: where it was
        // not measured (the model's 4.3 µs against 15-40 µs on this VM),
        // the estimate above would put the wait after the timer, the
        // shortest recent wait would stay late, and the next pre-wakes
        // would sleep past their completions again (measured: under the
        // shim, sockperf's epoll server had 2,078 pre-wakes, none caught).
        let w = match (plan, outcome.arrival) {
            (Plan::Prewake { sleep_ns, .. }, Some(Arrival::Early)) => w.min(sleep_ns),
            _ => w,
        };
        self.hist.add(w);
        self.prewake.record_wait(w);
        self.since += 1;
        if outcome.slept {
            // Until the completion: from there to running again (the
            // wake-up, a wait on the run queue behind the others) the
            // thread wants its CPU.
            let asleep = w.saturating_sub(outcome.spun_ns);
            self.asleep_pending += asleep.min(MAX_SHARE_GAP_NS) as f64;
        }
    }

    /// Re-run the model over the histogram.
    fn recompute(&mut self, now: u64, env: Env) {
        if let Some(t) = self.win_last {
            // A long pause counts as a short one: a scheduler does not
            // bank the credit of a long sleep either (a thread waking from
            // one is placed near the others, not far ahead of them), and
            // a waiter idle for seconds must not then spin for hundreds of
            // ms as if that were its share.
            let dt = now.saturating_sub(t).min(MAX_SHARE_GAP_NS) as f64;
            let f = (-dt / SHARE_WINDOW_NS as f64).exp();
            self.win_waits = self.win_waits * f + self.win_pending as f64;
            self.win_ns = self.win_ns * f + dt;
            self.win_asleep = self.win_asleep * f + self.asleep_pending.min(dt);
        }
        self.win_last = Some(now);
        self.win_pending = 0;
        self.asleep_pending = 0.0;
        self.since = 0;
        self.last_recompute = now;
        self.stats.recomputes += 1;
        if self.pw_seen >= 8 && self.pw_early > 0.5 {
            self.pw_off_until = now.saturating_add(PREWAKE_PAUSE_NS);
            self.pw_seen = 0;
            self.pw_early = 0.0;
            self.stats.prewake_pauses += 1;
        }
        if let Some(lean) = self.best_spin(1.0) {
            self.lean = lean.plan;
            self.lean_frac = self.long_run_share(self.lean_budget());
        }
        self.catch_ns = if self.cfg.catch_pct >= 100 {
            u64::MAX
        } else {
            // Never below the ski-rental budget either: a spin no longer
            // than what a sleep itself costs (wake-up plus its CPU) is
            // within 2x of the best choice whatever the waits are, and a
            // tiny quantile (a burst of back-to-back completions) would
            // otherwise put every hiccup inside a burst to sleep.
            let ski = (self.model.wake_ns + self.model.sleep_cpu_ns) as u64;
            self.hist
                .quantile_upper(self.cfg.catch_pct as f32 / 100.0)
                .max(self.lean_budget())
                .max(ski)
                .max(MIN_BUDGET_NS)
        };
        let Some((best, j_min, fallback)) = self.evaluate(env, now >= self.pw_off_until) else {
            return;
        };
        self.fallback = fallback;
        // Keep the current plan while it is still near-optimal: estimates
        // wobble with every few waits, and a plan that flips on noise is
        // worse than either. Leaving interrupt mode needs the wider
        // REGIME_MARGIN; falling back to it happens as soon as it is
        // near-optimal (`best` is then interrupt mode).
        // A pre-wake's timer and spin end follow the recent waits and the
        // measured lateness at every recompute: they are one plan whose
        // parameters track the load, not a new plan each time. A paused
        // pre-wake is left at once.
        if regime(self.plan) == 3 && (regime(best.plan) == 3 || now < self.pw_off_until) {
            if regime(best.plan) != 3 {
                self.stats.plan_changes += 1;
                self.choice = Some(best);
            }
            self.plan = best.plan;
        }
        let keep = self.figures(self.plan, env).filter(|c| {
            if c.plan == best.plan {
                return true;
            }
            match (regime(c.plan), regime(best.plan)) {
                (_, 0) => false,
                (0, _) => c.cost <= j_min * (1.0 + REGIME_MARGIN) + SWITCH_FLOOR_NS,
                _ => self.near_optimal(c, j_min),
            }
        });
        // Debounce: a plan is replaced only when two recomputes in a row
        // (≥ 2 × RECOMPUTE_EVERY waits apart) reject it.
        let rejected_before = std::mem::replace(&mut self.rejected, keep.is_none());
        match keep {
            Some(c) => self.choice = Some(c),
            None if !rejected_before && self.choice.is_some() => {}
            None => {
                self.rejected = false;
                if best.plan != self.plan {
                    self.stats.plan_changes += 1;
                    self.plan = best.plan;
                }
                self.choice = Some(best);
            }
        }
        if let Plan::Spin(b) = self.plan {
            self.stats.budget_ns = b;
        }
        (self.full_frac, self.model_frac) = match self.plan {
            Plan::Spin(b) if b > 0 => (
                self.long_run_share(b.min(self.catch_ns)),
                self.long_run_share(b),
            ),
            _ => (1.0, 1.0),
        };
        // The margin in force: how far before the shortest recent wait the
        // plan's timer is set.
        self.stats.margin_ns = match self.plan {
            Plan::Prewake { sleep_ns, .. } => {
                self.prewake.shortest_wait_ns().saturating_sub(sleep_ns)
            }
            _ => 0,
        };
        self.prewake_frac = self
            .prewake_figures(self.plan)
            .map_or(1.0, |f| self.share_of(f.spin));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `k` gaps at once make the mean that `k` single updates make, across
    /// the running mean's end.
    #[test]
    fn k_gaps_at_once_are_k_single_updates() {
        for (mean, seen, g, k) in [
            (0.0, 0, 5.0, 1),
            (100.0, 3, 10.0, 7),
            (100.0, 500, 10.0, 30),
            (100.0, 512, 10.0, 1),
            (100.0, 4_000, 1e6, 300),
            (7.0, 0, 7.0, 10_000),
        ] {
            let (mut m, mut n) = (mean, seen);
            for _ in 0..k {
                n += 1;
                m += (g - m) / n.min(RATE_MEMORY) as f64;
            }
            let at_once = long_run_mean(mean, seen, g, k);
            assert!(
                (at_once - m).abs() <= 1e-6 * m.abs().max(1.0),
                "{mean} {seen} {g} {k}: {at_once} against {m}"
            );
        }
    }
}
