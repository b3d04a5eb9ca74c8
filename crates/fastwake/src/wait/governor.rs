//! The one spin-then-block decision, for every waiter of the process.
//!
//! Whether a wait should spin, for how long, hand itself to the core's
//! dispatcher or go straight to sleep is decided here and nowhere else:
//! the library's [`crate::Waiter`] and every hook of the preload shim
//! (`epoll_wait`, `poll`, `select`, `ibv_get_cq_event`) ask a
//! [`Governor`] and report back how the wait went. The caller keeps only
//! its mechanics (how to look, how to sleep, signal masks, timeout units).
//!
//! What the governor owns, and why each rule exists:
//! - **the mode's budget**: [`DEFAULT_BUDGET`] for `hybrid`, the learned one
//!   for `adaptive` (the [`crate::adaptive::Learner`]), the timeout for
//!   `poll`;
//! - **the same-CPU rule**: no spin while the producer last ran on this CPU;
//!   the spin would only hold the CPU the producer needs, so the wait would
//!   last the whole budget plus a wake-up;
//! - **the sibling rule**: no spin while another thread of the process is
//!   blocked on this CPU in a wait that is due soon, judged by that
//!   thread's own recent waits ([`siblings`](super::siblings));
//! - **back-off after preemption**: a spin that lost the CPU for more than
//!   [`PREEMPTED_NS`] between two looks means other tasks want this CPU;
//!   spinning is then off for [`MIN_BACKOFF_NS`], doubling while it keeps
//!   happening (adaptive waits see this as a contended CPU on which they
//!   plan no spin, lean ones included);
//! - **the CPU cap**: one [`Allowance`] per governor that every spin is paid
//!   from, so no mode can spin more than its share of a core;
//! - **the idle rule** of a thread that busy-polls ([`super::idle`]): when
//!   its empty polls become a wait, how long that wait may last, and when a
//!   thread must not sleep at all.
//!
//! A governor is `const`-constructible and has no destructor, so the shim
//! keeps one in a const-initialised thread-local (no lazy initialisation,
//! no destructor registration on a hook path). It reads no clock and makes
//! no syscall: the caller passes the time and what it knows ([`Facts`]).

use super::WaitMode;
use super::backlog::Backlog;
use super::idle::IdleRule;
use super::siblings;
use crate::adaptive::{self, Env, Learner, Model, Outcome};
use std::time::Duration;

/// Default spin budget of `hybrid`, and the default ceiling of `adaptive`
/// under the shim: the one default of the project. Why 50 µs: it is about
/// two cross-core wake-ups on these VMs with halt polling off (22 µs
/// measured in `bench pingpong`), the ski-rental point at which a spin that
/// missed has cost what the sleep it avoided would have; and it covers a
/// loopback TCP request/response, which leaves a server idle ~10-20 µs
/// between one client's requests (two ~6 µs wake-ups plus the client's
/// work).
pub const DEFAULT_BUDGET: Duration = Duration::from_micros(50);

/// Spins shorter than this are not worth starting (a hook blocks signals
/// for a spin; a look costs up to ~1 µs).
pub const MIN_SPIN_NS: u64 = 1_000;

/// A gap this long between two looks of one spin means the thread lost the
/// CPU (a look is at most a ~1 µs syscall): another task wants this CPU.
pub const PREEMPTED_NS: u64 = 100_000;
/// After a preempted spin, no spinning for this long...
pub const MIN_BACKOFF_NS: u64 = 10_000_000;
/// ...doubling while it keeps happening, up to this.
pub const MAX_BACKOFF_NS: u64 = 1_000_000_000;

/// The CPU cap's allowance holds at most this much time's worth of refill.
/// Why 100 ms: long enough that the short bursts a latency-bound waiter
/// spins through are never cut, short enough that a waiter whose model is
/// wrong is held to its cap within a fraction of a second.
pub const BURST_NS: u64 = 100_000_000;

/// Measure the CPU cost of one sleep in this many (two thread-clock reads,
/// syscalls, on a path that sleeps anyway).
const SLEEP_SAMPLE_EVERY: u32 = 8;

/// The CPU cap: spin time is paid from an allowance that refills at `cap`
/// × elapsed time, up to `cap` × [`BURST_NS`], and starts full.
#[derive(Debug, Clone)]
pub struct Allowance {
    ppm: u32,
    tokens: f64,
    last: Option<u64>,
}

impl Allowance {
    /// An allowance for `ppm` parts per million of one core (≥ 1,000,000:
    /// no cap).
    pub const fn new(ppm: u32) -> Allowance {
        Allowance {
            ppm,
            tokens: 0.0,
            last: None,
        }
    }

    /// Is there a cap at all?
    #[inline]
    pub fn capped(&self) -> bool {
        self.ppm < 1_000_000
    }

    /// Refill for the time up to `now_ns` and return what may be spun now
    /// (`u64::MAX` without a cap).
    #[inline]
    pub fn refill(&mut self, now_ns: u64) -> u64 {
        if !self.capped() {
            return u64::MAX;
        }
        let cap = self.ppm as f64 / 1e6;
        let burst = cap * BURST_NS as f64;
        self.tokens = match self.last {
            None => burst,
            Some(t) => (self.tokens + cap * now_ns.saturating_sub(t) as f64).min(burst),
        };
        self.last = Some(now_ns);
        self.tokens.max(0.0) as u64
    }

    /// Pay for `ns` of spinning.
    #[inline]
    pub fn charge(&mut self, ns: u64) {
        if self.capped() {
            self.tokens -= ns as f64;
        }
    }
}

/// What the caller knows at the start of a wait that found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Now, [`crate::cpu::monotonic_ns`] time (any monotonic epoch works).
    pub now_ns: u64,
    /// What is left of the caller's timeout, ns (`None`: none).
    pub timeout_ns: Option<u64>,
    /// The CPU the calling thread is on (`None`: unknown; the CPU rules
    /// then do not apply).
    pub cpu: Option<u32>,
    /// The CPU the producer last ran on, when known.
    pub peer_cpu: Option<u32>,
    /// Other threads want this CPU (the pressure sampler, when the caller
    /// runs one).
    pub contended: bool,
    /// The lean-spin trial bars lean spins on this thread now
    /// ([`adaptive::Config::lean_trial`]).
    pub lean_barred: bool,
    /// Waiters of the live dispatcher serving this CPU, if one does.
    pub dispatch_waiters: Option<u32>,
    /// Can this wait be handed to a dispatcher at all? A `dispatch`-mode
    /// wait that cannot is planned as `hybrid`.
    pub dispatchable: bool,
    /// Can the caller sleep on the source until a given time and then spin
    /// ([`Decision::Prewake`])? Adaptive waits that cannot get the best
    /// other plan.
    pub prewake: bool,
}

impl Facts {
    /// Facts with only the time and the timeout known.
    pub const fn at(now_ns: u64, timeout_ns: Option<u64>) -> Facts {
        Facts {
            now_ns,
            timeout_ns,
            cpu: None,
            peer_cpu: None,
            contended: false,
            lean_barred: false,
            dispatch_waiters: None,
            dispatchable: true,
            prewake: false,
        }
    }
}

/// What to do for one wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Look for at most this many ns (`u64::MAX`: until the timeout, or
    /// for ever), then block.
    Spin(u64),
    /// Register with the core's dispatcher and sleep until it hands off.
    Dispatch,
    /// Block now (after the arm → re-check rule).
    Block,
    /// Sleep on the source until `wake_at_ns` (a completion before then
    /// ends the wait as in interrupt mode), then look until
    /// `spin_until_ns` but for at most `spin_max_ns` from when the thread
    /// runs, then block; both times in the clock of [`Facts::now_ns`].
    /// The spin is bounded from the thread's own wake-up, not from the
    /// timer's: a timer's lateness is time asleep, and a ceiling counted
    /// from the timer let a 26 µs lateness eat half of a 50 µs ceiling, so
    /// completions in the tail the plan spins for were missed. Report the
    /// timer's lateness and where the completion arrived in
    /// [`Ending::late_ns`] and [`Ending::arrival`].
    Prewake {
        wake_at_ns: u64,
        spin_until_ns: u64,
        spin_max_ns: u64,
    },
}

/// Why a wait was planned the way it was (for the caller's counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// What the mode asks for.
    Mode,
    /// What the adaptive learner chose, and why.
    Learned(adaptive::Reason),
    /// No spin: the producer last ran on this CPU.
    SameCpu,
    /// No spin: another thread of the process is blocked on this CPU.
    Siblings,
    /// No spin: backing off after a spin was preempted.
    Contended,
    /// The CPU cap shortened the spin or ruled it out.
    Capped,
}

/// How a planned wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// When it ended (a clock reading the caller already had will do: the
    /// last one of its spin loop).
    pub now_ns: u64,
    /// Of the wait, ns spent spinning.
    pub spun_ns: u64,
    /// The thread blocked (after its spin, if any).
    pub slept: bool,
    /// The spin lost the CPU for more than [`PREEMPTED_NS`].
    pub preempted: bool,
    /// The wait failed (an error, not a completion or a timeout): nothing to
    /// learn from its length.
    pub failed: bool,
    /// The measured wake-up latency of its sleep, when the source dates
    /// its rings ([`crate::source::BlockReport::wake_ns`]).
    pub wake_ns: Option<u64>,
    /// A [`Decision::Prewake`]: where the completion arrived. `slept` is
    /// false for a catch (the wait's length is then exact), true otherwise.
    pub arrival: Option<adaptive::prewake::Arrival>,
    /// A [`Decision::Prewake`] whose timer fired: how late the thread ran
    /// after `wake_at_ns`, ns (the margin is learned from these).
    pub late_ns: Option<u64>,
}

impl Ending {
    /// A wait that ended at `now_ns` after spinning `spun_ns`.
    pub const fn at(now_ns: u64, spun_ns: u64, slept: bool) -> Ending {
        Ending {
            now_ns,
            spun_ns,
            slept,
            preempted: false,
            failed: false,
            wake_ns: None,
            arrival: None,
            late_ns: None,
        }
    }
}

/// The wait in progress.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    start_ns: u64,
    learned: Option<adaptive::Plan>,
}

/// Decides each wait of one waiter (a thread's [`crate::Waiter`], or one
/// thread of a program under the shim); see the module docs.
///
/// Line aligned: every wait writes it, and a governor that shared a cache
/// line with whatever the allocator put next to it (the other end's waiter,
/// in a ping-pong) would pull that line across cores on every completion
/// (measured: +15-20 ns one-way in `bench pingpong --mode hybrid` before).
#[derive(Debug, Clone)]
#[repr(align(64))]
pub struct Governor {
    mode: WaitMode,
    /// Longest spin of `adaptive` (the shim's `FASTWAKE_BUDGET_US`).
    ceiling_ns: u64,
    cap: Allowance,
    quiet_until: u64,
    backoff_ns: u64,
    /// Completions taken without waiting since the last planned wait
    /// ([`Governor::found_ready`]).
    run: u32,
    /// Adaptive: the backlog rule.
    backlog: Backlog,
    learner: Learner,
    in_flight: Option<InFlight>,
    /// How the last adaptive wait went, learned at the start of the next
    /// one: the histogram update and its periodic decay would otherwise
    /// run between the completion and the caller getting it.
    deferred: Option<Outcome>,
    sleeps: u32,
    /// Thread CPU time before the sampled sleep in progress, ns.
    sleep_cpu0: Option<u64>,
    /// This thread's typical blocked wait (ns, a moving average; 0: none
    /// yet): whether its own sleeps count for its siblings' spins
    /// ([`siblings`]).
    typical_block_ns: u64,
    /// The idle rule of a thread that busy-polls (the shim's
    /// `FASTWAKE_POLLERS=sleep`): when its empty polls become a wait.
    idle: IdleRule,
}

impl Governor {
    /// A governor for `mode`, with the CPU cap of an adaptive mode's
    /// [`adaptive::Config::cap_pct`] (none for the other modes; see
    /// [`Governor::with_cap`]).
    pub const fn new(mode: WaitMode) -> Governor {
        let (cfg, ppm) = match mode {
            WaitMode::Adaptive(c) => (c, c.cap_pct as u32 * 10_000),
            _ => (adaptive::Config::DEFAULT, 1_000_000),
        };
        Governor {
            mode,
            ceiling_ns: u64::MAX,
            cap: Allowance::new(ppm),
            quiet_until: 0,
            backoff_ns: MIN_BACKOFF_NS,
            run: 0,
            backlog: Backlog::new(),
            learner: Learner::new(cfg, Model::DEFAULT),
            in_flight: None,
            deferred: None,
            sleeps: 0,
            sleep_cpu0: None,
            typical_block_ns: 0,
            idle: IdleRule::new(),
        }
    }

    /// The same with a CPU cap of `ppm` parts per million of a core for
    /// every spinning mode.
    pub const fn with_cap(mut self, ppm: u32) -> Governor {
        self.cap = Allowance::new(ppm);
        self
    }

    /// The same with adaptive spins no longer than `ns`.
    pub const fn with_ceiling(mut self, ns: u64) -> Governor {
        self.ceiling_ns = ns;
        self
    }

    /// The idle rule of a thread that busy-polls ([`super::idle`]): the
    /// shim asks it on every empty poll and tells it how its sleeps ended.
    #[inline]
    pub fn idle(&mut self) -> &mut IdleRule {
        &mut self.idle
    }

    /// The mode.
    pub fn mode(&self) -> WaitMode {
        self.mode
    }

    /// Does every wait spin until its deadline, whatever the facts (`poll`
    /// without a CPU cap)? Then a caller need not gather facts or read the
    /// clock, and need not report the wait's end.
    #[inline]
    pub fn spins_regardless(&self) -> bool {
        matches!(self.mode, WaitMode::Poll) && !self.cap.capped()
    }

    /// The adaptive learner (what it learned so far; the last wait may not
    /// be learned yet, see [`Governor::settled`]).
    pub fn learner(&self) -> &Learner {
        &self.learner
    }

    /// The learner with the last wait learned (for read-only views).
    pub fn settled(&self) -> std::borrow::Cow<'_, Learner> {
        match self.deferred {
            None => std::borrow::Cow::Borrowed(&self.learner),
            Some(o) => {
                let mut l = self.learner.clone();
                l.record(o);
                std::borrow::Cow::Owned(l)
            }
        }
    }

    /// Adaptive mode: what the learner decided so far.
    pub fn adaptive_stats(&self) -> adaptive::AdaptiveStats {
        self.settled().stats()
    }

    /// Is it time to refresh what the caller senses about its CPU (which
    /// CPU, its dispatcher, the pressure sampler)? Every
    /// [`adaptive::learner::RECOMPUTE_EVERY`] adaptive waits: a pinned
    /// thread never moves, an unpinned one rarely within 16 waits, and the
    /// lookups cost tens of ns each.
    #[inline]
    pub fn refresh_due(&self) -> bool {
        matches!(self.mode, WaitMode::Adaptive(_))
            && self
                .learner
                .decisions()
                .is_multiple_of(adaptive::learner::RECOMPUTE_EVERY as u64)
    }

    /// A completion was taken at the first look, without waiting: counts
    /// towards the backlog rule ([`super::BACKLOG_RUN`]) and, in adaptive
    /// mode, towards the idle rule's rate (the next plan hands the count to
    /// [`crate::adaptive::learner::Learner::note_found_ready`]). One
    /// increment; call it on that path only.
    #[inline]
    pub fn found_ready(&mut self) {
        self.run = self.run.saturating_add(1);
    }

    /// Plan one wait that found nothing at its first look.
    #[inline]
    pub fn plan(&mut self, f: &Facts) -> (Decision, Why) {
        let (mut d, mut why) = match self.mode {
            // Started like every wait, so its end teaches the thread's
            // typical blocked wait (the sibling rule reads it).
            WaitMode::Interrupt => return (self.start(f, Decision::Block), Why::Mode),
            WaitMode::Dispatch if f.dispatchable => {
                return (self.start(f, Decision::Dispatch), Why::Mode);
            }
            WaitMode::Poll => (Decision::Spin(u64::MAX), Why::Mode),
            WaitMode::Hybrid { budget } => (
                Decision::Spin(budget.as_nanos().min(u64::MAX as u128) as u64),
                Why::Mode,
            ),
            // What cannot be dispatched is waited for as in `hybrid`, with
            // the ceiling as its budget when one was set (the shim's
            // FASTWAKE_BUDGET_US).
            WaitMode::Dispatch => (
                Decision::Spin(match self.ceiling_ns {
                    u64::MAX => DEFAULT_BUDGET.as_nanos() as u64,
                    c => c,
                }),
                Why::Mode,
            ),
            WaitMode::Adaptive(_) => return self.plan_adaptive(f),
        };
        if !matches!(self.mode, WaitMode::Poll) {
            if same_cpu(f) {
                (d, why) = (Decision::Block, Why::SameCpu);
            } else if siblings::others_asleep(f.cpu, f.now_ns) {
                (d, why) = (Decision::Block, Why::Siblings);
            } else if f.now_ns < self.quiet_until {
                (d, why) = (Decision::Block, Why::Contended);
            }
        }
        if let Decision::Spin(b) = d {
            d = self.afford(f, b, &mut why);
        }
        (self.start(f, d), why)
    }

    #[inline]
    fn plan_adaptive(&mut self, f: &Facts) -> (Decision, Why) {
        if let Some(o) = self.deferred.take() {
            self.learner.record(o);
        }
        let allowance = self.cap.refill(f.now_ns);
        // Behind? (super::backlog: a long run of completions taken
        // without waiting; spinning held off while that helps.)
        let run = std::mem::take(&mut self.run);
        self.learner.note_found_ready(run as u64);
        let (backlog, behind) = if self.learner.config().backlog {
            self.backlog
                .observe(f.now_ns, run, self.learner.busy_share())
        } else {
            (false, false)
        };
        if backlog {
            self.learner.note_backlog();
        }
        let env = Env {
            same_cpu: same_cpu(f),
            siblings: siblings::others_asleep(f.cpu, f.now_ns),
            contended: f.contended || f.now_ns < self.quiet_until,
            spin_preempted: f.now_ns < self.quiet_until,
            lean_barred: f.lean_barred,
            dispatch_waiters: f.dispatch_waiters.filter(|_| f.dispatchable),
            allowance_ns: allowance,
            prewake: f.prewake,
            behind,
            spin_ceiling_ns: self.ceiling_ns,
        };
        let learned = self.learner.plan(f.now_ns, env);
        let why = Why::Learned(self.learner.last_reason());
        let d = match learned {
            adaptive::Plan::Dispatch => Decision::Dispatch,
            adaptive::Plan::Spin(b) => {
                let b = b.min(self.ceiling_ns).min(f.timeout_ns.unwrap_or(u64::MAX));
                if b < MIN_SPIN_NS {
                    Decision::Block
                } else {
                    Decision::Spin(b)
                }
            }
            adaptive::Plan::Prewake {
                sleep_ns,
                spin_end_ns,
            } => {
                let timeout = f.timeout_ns.unwrap_or(u64::MAX);
                if timeout <= sleep_ns {
                    // The timeout comes first: an interrupt-mode wait.
                    Decision::Block
                } else {
                    Decision::Prewake {
                        wake_at_ns: f.now_ns + sleep_ns,
                        spin_until_ns: f.now_ns + spin_end_ns.max(sleep_ns).min(timeout),
                        spin_max_ns: self.ceiling_ns,
                    }
                }
            }
        };
        self.in_flight = Some(InFlight {
            start_ns: f.now_ns,
            learned: Some(learned),
        });
        (d, why)
    }

    /// A spin of at most `b` that the timeout and the cap allow.
    #[inline]
    fn afford(&mut self, f: &Facts, b: u64, why: &mut Why) -> Decision {
        let mut b = b;
        if let Some(t) = f.timeout_ns {
            b = b.min(t);
        }
        if self.cap.capped() {
            let a = self.cap.refill(f.now_ns);
            if a < b {
                *why = Why::Capped;
                b = a;
            }
        }
        if b < MIN_SPIN_NS {
            Decision::Block
        } else {
            Decision::Spin(b)
        }
    }

    #[inline]
    fn start(&mut self, f: &Facts, d: Decision) -> Decision {
        self.in_flight = Some(InFlight {
            start_ns: f.now_ns,
            learned: None,
        });
        d
    }

    /// The planned wait is about to block: count the calling thread as
    /// blocked on `cpu` until the returned guard drops (the sibling rule),
    /// and, for one adaptive sleep in eight, measure what
    /// the sleep costs in CPU. Why measure: the model's figure is a default
    /// from another day's host, and the real cost (arm, sleep, two context
    /// switches, re-check) moves by 4× with the host's state, which moves
    /// the break-even of every budget.
    ///
    /// `now_ns` is a recent [`crate::cpu::monotonic_ns`] reading, which
    /// the caller usually has: the sibling rule's due time counts from it.
    #[inline]
    pub fn blocking(&mut self, cpu: Option<u32>, now_ns: u64) -> siblings::Asleep {
        if matches!(self.mode, WaitMode::Adaptive(_)) {
            self.sleeps = self.sleeps.wrapping_add(1);
            if self.sleeps.is_multiple_of(SLEEP_SAMPLE_EVERY) {
                self.sleep_cpu0 = Some(crate::cpu::thread_cpu_time().as_nanos() as u64);
            }
        }
        siblings::Asleep::enter(cpu, now_ns, self.typical_block_ns)
    }

    /// Adaptive's worth where its lean-spin trial runs
    /// ([`adaptive::Config::lean_trial`]), for a wait on a contended CPU
    /// whose learned plan spins (a budget or a pre-wake's spin): only such
    /// a wait is what the trial's arms tell apart. A waiter whose plan is
    /// interrupt mode would otherwise take its turn for a trial of two
    /// identical arms, and the slice's next trial would wait behind it.
    #[inline]
    pub fn lean_trial_worth(&self) -> Option<u16> {
        match self.mode {
            WaitMode::Adaptive(c)
                if c.lean_trial
                    && matches!(
                        self.learner.current_plan(),
                        adaptive::Plan::Spin(1..) | adaptive::Plan::Prewake { .. }
                    ) =>
            {
                Some(c.worth)
            }
            _ => None,
        }
    }

    /// The slice a sleep of this wait should run under: adaptive's
    /// [`adaptive::Config::sleep_slice_us`] while the CPU is `contended`
    /// (the pressure sampler's verdict), else none; with the worth the
    /// slice trial weighs CPU by where the trial decides it
    /// ([`adaptive::Config::slice_trial`], [`adaptive::Config::worth`]).
    #[inline]
    pub fn sleep_slice(&self, contended: bool) -> Option<(std::time::Duration, Option<u16>)> {
        match self.mode {
            WaitMode::Adaptive(c) if contended && c.sleep_slice_us > 0 => Some((
                std::time::Duration::from_micros(c.sleep_slice_us as u64),
                c.slice_trial.then_some(c.worth),
            )),
            _ => None,
        }
    }

    /// A sleep ran under [`Governor::sleep_slice`]'s slice: counted.
    pub fn note_short_slice(&mut self) {
        self.learner.note_short_slice();
    }

    /// The short slice of a sleep was given back in `ns`.
    pub fn gave_back_slice(&mut self, ns: u64) {
        self.learner.note_give_back(ns);
    }

    /// The planned wait caught its completion while spinning, at `now_ns`
    /// after `spun_ns`: the fast path of [`Governor::end`]. It sits between
    /// a completion and the caller getting it, so when nothing needs to
    /// learn from the catch (no learner, no cap, no back-off to reset) it
    /// only closes the wait; everything else is out of line.
    #[inline(always)]
    pub fn caught(&mut self, now_ns: u64, spun_ns: u64) {
        if matches!(self.in_flight, Some(InFlight { learned: None, .. }))
            && !self.cap.capped()
            && self.backoff_ns == MIN_BACKOFF_NS
        {
            self.in_flight = None;
        } else {
            self.end(Ending::at(now_ns, spun_ns, false));
        }
    }

    /// How long a dispatch-mode waiter alone on its core spins before it
    /// sleeps (`crate::dispatch::wait`): hybrid's budget (the ceiling, when
    /// one is set) in dispatch mode; nothing more than the relay for an
    /// adaptive wait, whose plan already chose not to spin.
    pub fn lone_dispatch_spin(&self) -> Duration {
        match (self.mode, self.ceiling_ns) {
            (WaitMode::Dispatch, u64::MAX) => DEFAULT_BUDGET,
            (WaitMode::Dispatch, c) => Duration::from_nanos(c),
            _ => Duration::ZERO,
        }
    }

    /// Does [`Governor::end`] read the ending's `now_ns` for the wait in
    /// flight? Not for a wait of a fixed mode that neither slept nor spun:
    /// such a caller (a dispatch-mode wait served by its own relay, say)
    /// can leave the clock unread.
    #[inline]
    pub fn end_reads_clock(&self, slept: bool, spun: bool) -> bool {
        slept || spun || self.in_flight.as_ref().is_some_and(|w| w.learned.is_some())
    }

    /// How the planned wait ended.
    #[inline(never)]
    pub fn end(&mut self, e: Ending) {
        let Some(w) = self.in_flight.take() else {
            return;
        };
        if e.slept && !e.failed {
            // A moving average over about the last four blocked waits.
            let d = e.now_ns.saturating_sub(w.start_ns).max(1);
            self.typical_block_ns = match self.typical_block_ns {
                0 => d,
                t => t - t / 4 + d / 4,
            };
        }
        if e.spun_ns > 0 {
            self.cap.charge(e.spun_ns);
            if e.preempted {
                self.quiet_until = e.now_ns.saturating_add(self.backoff_ns);
                self.backoff_ns = (self.backoff_ns * 2).min(MAX_BACKOFF_NS);
            } else if !e.slept {
                self.backoff_ns = MIN_BACKOFF_NS;
            }
        }
        let Some(learned) = w.learned else {
            return;
        };
        if let Some(c0) = self.sleep_cpu0.take()
            && e.slept
        {
            // A pre-wake spun after its sleep: that is not the sleep's cost.
            let used = (crate::cpu::thread_cpu_time().as_nanos() as u64)
                .saturating_sub(c0)
                .saturating_sub(if e.arrival.is_some() { e.spun_ns } else { 0 });
            self.learner.observe_sleep_cpu(used);
        }
        let wake_ns = e.wake_ns.filter(|_| e.slept);
        if let Some(x) = wake_ns {
            self.learner.observe_wake(x);
        }
        if e.failed {
            // The learner expects an outcome for every plan; a failed wait
            // teaches it nothing about wait lengths.
            self.learner.forget_pending();
            return;
        }
        let waited = e.now_ns.saturating_sub(w.start_ns);
        let spun = match learned {
            adaptive::Plan::Dispatch => 0,
            adaptive::Plan::Spin(_) | adaptive::Plan::Prewake { .. } => e.spun_ns.min(waited),
        };
        self.deferred = Some(Outcome {
            waited_ns: waited,
            spun_ns: spun,
            slept: e.slept,
            wake_ns,
            arrival: e.arrival,
            late_ns: e.late_ns,
        });
    }

    /// One line: what the adaptive learner decided and why (with the
    /// pressure sampler's view, when the caller runs one).
    pub fn explain(&self, pressure: Option<&adaptive::pressure::Shared>) -> String {
        adaptive::explain(&self.settled(), pressure)
    }
}

/// Did the producer last run on this CPU?
#[inline]
fn same_cpu(f: &Facts) -> bool {
    f.peer_cpu.is_some() && f.peer_cpu == f.cpu
}
