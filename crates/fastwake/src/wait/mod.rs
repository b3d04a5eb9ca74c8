//! Wait modes: how a thread waits for a completion from a [`Source`].
//!
//! | mode | what the thread does | costs | wins when |
//! |---|---|---|---|
//! | [`WaitMode::Poll`] | peeks the source in a loop | a whole core | latency is all that matters and the core is free |
//! | [`WaitMode::Interrupt`] | arms, re-checks, sleeps | a kernel wake-up (~1 µs same core, ~4 µs cross core here) | completions are rare or the core is shared |
//! | [`WaitMode::Hybrid`] | polls for a budget, then interrupt | CPU up to the budget per wait | the peer usually answers within the budget |
//! | [`WaitMode::Dispatch`] | sleeps on a futex; its core's [`crate::dispatch::Dispatcher`] wakes it | a same-core wake-up (~1 µs); the dispatcher uses only idle CPU | many threads share a core |
//! | [`WaitMode::Adaptive`] | learns its waits and picks a spin budget (0 = interrupt) per wait | what the learned distribution and the CPU cap allow | the load changes, or no one knows it in advance |
//!
//! Which of these a wait does, and for how long it spins, is decided by the
//! [`Governor`] alone (the same engine serves the preload shim's hooks); the
//! [`Waiter`] holds the mechanics: peeking, the spin loops, the dispatcher
//! link, and all blocking goes through
//! [`crate::source::block_until_ready`].

mod backlog;
mod governor;
mod hybrid;
pub mod idle;
mod poll;
mod sensors;
mod siblings;

use crate::cpu::monotonic_ns;
use crate::source::{BlockReport, Source, block_until_ready};
use crate::{Fail, Result};
use std::str::FromStr;
use std::time::{Duration, Instant};

pub use backlog::{BACKLOG_RUN, MAX_BEHIND_NS, MIN_BEHIND_NS};
pub use governor::{
    Allowance, BURST_NS, DEFAULT_BUDGET, Decision, Ending, Facts, Governor, MAX_BACKOFF_NS,
    MIN_BACKOFF_NS, MIN_SPIN_NS, PREEMPTED_NS, Why,
};
pub use siblings::Asleep;

/// How to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin on the source (yielding now and then so a shared core still
    /// makes progress).
    Poll,
    /// Arm, re-check, sleep: the classic completion-channel wait.
    Interrupt,
    /// Spin for at most `budget`, then interrupt mode. Never spins when the
    /// source's producer runs on the waiter's own CPU.
    Hybrid {
        /// Longest spin before blocking.
        budget: Duration,
    },
    /// Register with the dispatcher of the current CPU and sleep until it
    /// hands off (see [`crate::dispatch`]). Interrupt mode when no
    /// dispatcher serves this CPU or the source has no peek handle.
    Dispatch,
    /// Learn the wait-time distribution and choose per wait between
    /// spinning (with a learned budget) and interrupt mode, under a CPU cap;
    /// see [`crate::adaptive`].
    Adaptive(crate::adaptive::Config),
}

impl WaitMode {
    /// The mode's short name, as the CLI spells it.
    pub fn name(&self) -> &'static str {
        match self {
            WaitMode::Poll => "poll",
            WaitMode::Interrupt => "interrupt",
            WaitMode::Hybrid { .. } => "hybrid",
            WaitMode::Dispatch => "dispatch",
            WaitMode::Adaptive(_) => "adaptive",
        }
    }
}

impl std::fmt::Display for WaitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // In the grammar's own units, so the text parses back to the
            // same budget (1500ns is not 1us).
            WaitMode::Hybrid { budget } if *budget != DEFAULT_BUDGET => {
                if budget.subsec_nanos() % 1000 == 0 {
                    write!(f, "hybrid:{}us", budget.as_micros())
                } else {
                    write!(f, "hybrid:{}ns", budget.as_nanos())
                }
            }
            WaitMode::Adaptive(c) => write!(f, "{c}"),
            m => f.write_str(m.name()),
        }
    }
}

impl FromStr for WaitMode {
    type Err = Fail;

    /// `poll`, `interrupt`, `hybrid`, `hybrid:<duration>` (see
    /// [`crate::grammar::duration`]: `hybrid:20us`, `hybrid:0.5ms`),
    /// `dispatch`, `adaptive` or `adaptive:<options>` (see
    /// [`crate::adaptive::Config::parse_options`]).
    fn from_str(s: &str) -> Result<Self> {
        WaitMode::parse(s, "")
    }
}

impl WaitMode {
    /// A wait mode, or `off` (`None`): what the preload shim's
    /// `FASTWAKE_MODE` and `fastwake run --mode` take, where `off` means
    /// no fastwake at all. An unknown name's message lists `off` too.
    pub fn parse_or_off(s: &str) -> Result<Option<WaitMode>> {
        match s.trim() {
            "off" => Ok(None),
            m => WaitMode::parse(m, " or off").map(Some),
        }
    }

    /// `also`: more names the caller takes, for the unknown-name message.
    fn parse(s: &str, also: &str) -> Result<Self> {
        let s = s.trim();
        match s {
            "poll" => Ok(WaitMode::Poll),
            "interrupt" | "int" | "event" => Ok(WaitMode::Interrupt),
            "dispatch" => Ok(WaitMode::Dispatch),
            "adaptive" => Ok(WaitMode::Adaptive(Default::default())),
            "hybrid" => Ok(WaitMode::Hybrid {
                budget: DEFAULT_BUDGET,
            }),
            _ => {
                if let Some(b) = s.strip_prefix("hybrid:") {
                    let budget = crate::grammar::duration(b)
                        .map_err(|e| Fail::invalid(format!("bad hybrid budget: {e}")))?;
                    return Ok(WaitMode::Hybrid { budget });
                }
                if let Some(o) = s.strip_prefix("adaptive:") {
                    return Ok(WaitMode::Adaptive(crate::adaptive::Config::parse_options(
                        o,
                    )?));
                }
                let (sep, last) = if also.is_empty() {
                    (" or", "")
                } else {
                    (",", also)
                };
                Err(Fail::invalid(format!(
                    "unknown wait mode '{s}': expected poll, interrupt, hybrid[:DURATION], dispatch{sep} adaptive[:OPTIONS]{last} (docs/reference/grammar.md)"
                )))
            }
        }
    }
}

/// Counters a [`Waiter`] keeps; cheap enough to keep always.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WaitStats {
    /// Completions returned.
    pub completions: u64,
    /// Completions found without blocking (already there, or while spinning).
    pub without_sleep: u64,
    /// Times the thread slept.
    pub sleeps: u64,
    /// Times the arm → re-check found a completion.
    pub rechecks_hit: u64,
    /// Wake-ups with nothing to take.
    pub spurious: u64,
    /// Hybrid waits that skipped the spin because the producer shared our CPU.
    pub spin_skipped_same_cpu: u64,
    /// Hybrid waits that skipped the spin because another thread of this
    /// process was waiting on our CPU (see `wait::siblings`).
    pub spin_skipped_siblings: u64,
    /// Waits that skipped the spin while backing off after a spin was
    /// preempted (another task wanted the CPU).
    pub spin_skipped_contended: u64,
    /// Waits whose spin the CPU cap shortened or ruled out.
    pub spins_capped: u64,
    /// Dispatch mode: wake-ups handed off by the dispatcher.
    pub handoffs: u64,
    /// Dispatch mode: hand-offs this thread made to another thread of its
    /// core while relaying before its own sleep.
    pub relays: u64,
    /// Dispatch mode: waits done in interrupt mode because no live
    /// dispatcher served the CPU, the source has no peek handle, or the
    /// dispatcher was starved of CPU (not seen running for 500 µs, unless
    /// it was running when this thread last woke from a wait on its core:
    /// then the silence is this thread's own computing).
    pub dispatch_fallbacks: u64,
    /// Dispatch mode: waits handed back to interrupt mode by an idle
    /// dispatcher.
    pub dispatch_paused: u64,
    /// Dispatch mode: of the paused waits, those that came back to the
    /// dispatcher at its pre-wake's resume time (before their completion).
    pub dispatch_resumed: u64,
}

/// Waits for completions in one [`WaitMode`], keeping [`WaitStats`]: the
/// mechanics of peeking, spinning and sleeping on a [`Source`]; every
/// decision is its [`Governor`]'s.
///
/// Line aligned, so whatever embeds it is too: every wait writes its
/// counters, and a waiter sharing a cache line with the other end of a
/// connection (two ends allocated one after the other, as `bench pingpong`
/// does) pulls that line across cores on every completion (measured: the
/// one-engine change moved fields across such a line and cost hybrid
/// pingpong 10-15 ns one-way until this).
#[derive(Debug, Clone)]
#[repr(align(64))]
pub struct Waiter {
    stats: WaitStats,
    link: crate::dispatch::Link,
    governor: Box<Governor>,
    sensors: sensors::Sensors,
}

impl Waiter {
    /// A waiter in `mode`.
    pub fn new(mode: WaitMode) -> Self {
        Waiter {
            stats: WaitStats::default(),
            link: crate::dispatch::Link::default(),
            governor: Box::new(Governor::new(mode)),
            sensors: sensors::Sensors::default(),
        }
    }

    /// Adaptive mode: what the learner decided so far.
    pub fn adaptive_stats(&self) -> Option<crate::adaptive::AdaptiveStats> {
        self.adaptive().map(|g| g.adaptive_stats())
    }

    /// Adaptive mode: the governor (its learner, and
    /// [`Waiter::explain`]).
    pub fn adaptive(&self) -> Option<&Governor> {
        matches!(self.mode(), WaitMode::Adaptive(_)).then_some(&*self.governor)
    }

    /// Adaptive mode: one line on what the learner decided and why, with
    /// the pressure sampler's view of the CPU.
    pub fn explain(&self) -> Option<String> {
        self.adaptive()
            .map(|g| g.explain(self.sensors.pressure.as_deref()))
    }

    /// Dispatch mode: a signal that interrupts the sleep ends the wait
    /// with `EINTR` (the errno of the returned [`crate::Fail`]), as a
    /// blocking syscall does, instead of sleeping on until the hand-off.
    /// For waits that stand in for one (the preload shim's `epoll_wait`).
    /// Off by default. Interrupt-mode waits (and dispatch-mode fallbacks)
    /// report signals as their source's `sleep` does.
    pub fn set_interruptible(&mut self, on: bool) {
        self.link.interruptible = on;
    }

    /// The mode.
    pub fn mode(&self) -> WaitMode {
        self.governor.mode()
    }

    /// Counters so far.
    pub fn stats(&self) -> WaitStats {
        self.stats
    }

    /// Wait for one completion, however long it takes.
    pub fn wait<S: Source + ?Sized>(&mut self, src: &mut S) -> Result<S::Completion> {
        match self.wait_deadline(src, None)? {
            Some(c) => Ok(c),
            None => Err(Fail::timed_out()),
        }
    }

    /// Wait at most `timeout`; `Ok(None)` when it passes with nothing ready.
    pub fn wait_timeout<S: Source + ?Sized>(
        &mut self,
        src: &mut S,
        timeout: Duration,
    ) -> Result<Option<S::Completion>> {
        self.wait_deadline(src, Some(Instant::now() + timeout))
    }

    fn wait_deadline<S: Source + ?Sized>(
        &mut self,
        src: &mut S,
        deadline: Option<Instant>,
    ) -> Result<Option<S::Completion>> {
        if let Some(c) = src.try_take()? {
            self.stats.completions += 1;
            self.stats.without_sleep += 1;
            self.governor.found_ready();
            // A dispatch-mode thread that keeps finding its source ready
            // holds its core: now and then it lets the core's other
            // ready waiters run (`dispatch::waiter`, the fair turn).
            self.stats.relays += self.link.unslept_wait();
            return Ok(Some(c));
        }
        if self.governor.spins_regardless() {
            // Poll mode without a CPU cap: nothing to decide, and no clock
            // read on the path between a completion and its return.
            return self.count(poll::spin(src, deadline), true);
        }
        let now_ns = monotonic_ns();
        let cpu = crate::cpu::current();
        if self.governor.refresh_due() {
            self.sensors.refresh(cpu);
        }
        let contended = self.sensors.contended();
        let lean_barred = contended
            && self
                .governor
                .lean_trial_worth()
                .is_some_and(|w| self.sensors.lean_barred(w));
        let facts = Facts {
            now_ns,
            timeout_ns: deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_nanos() as u64),
            cpu,
            peer_cpu: src.hints().peer_cpu,
            contended,
            lean_barred,
            dispatch_waiters: self.sensors.dispatch_waiters,
            dispatchable: true,
            prewake: true,
        };
        let (decision, why) = self.governor.plan(&facts);
        match why {
            Why::SameCpu | Why::Learned(crate::adaptive::Reason::SameCpu) => {
                self.stats.spin_skipped_same_cpu += 1
            }
            Why::Siblings | Why::Learned(crate::adaptive::Reason::Siblings) => {
                self.stats.spin_skipped_siblings += 1
            }
            Why::Contended => self.stats.spin_skipped_contended += 1,
            Why::Capped => self.stats.spins_capped += 1,
            _ => {}
        }
        let mut spun_ns = 0;
        let mut preempted = false;
        match decision {
            Decision::Dispatch => return self.dispatch(src, deadline, cpu, now_ns),
            Decision::Prewake {
                wake_at_ns,
                spin_until_ns,
                spin_max_ns,
            } => {
                let at = (wake_at_ns, spin_until_ns, spin_max_ns);
                return self.prewake(src, deadline, cpu, now_ns, at);
            }
            Decision::Spin(_) if matches!(self.mode(), WaitMode::Poll) => {
                let r = poll::spin(src, deadline);
                let now = monotonic_ns();
                self.governor.end(Ending::at(now, now - now_ns, false));
                return self.count(r, true);
            }
            Decision::Spin(b) => {
                let end = match hybrid::spin(src, now_ns, b) {
                    Ok(e) => e,
                    Err(e) => {
                        self.fail(now_ns);
                        return Err(e);
                    }
                };
                spun_ns = end.last_ns - now_ns;
                if let Some(c) = end.caught {
                    self.governor.caught(end.last_ns, spun_ns);
                    return self.count(Ok(Some(c)), true);
                }
                preempted = end.preempted;
            }
            Decision::Block => {}
        }
        let mut rep = BlockReport::default();
        let asleep = self.governor.blocking(cpu, now_ns + spun_ns);
        let short = self.short_slice();
        let r = block_until_ready(src, deadline, &mut rep);
        self.give_back(short);
        drop(asleep);
        self.count_block(&rep);
        let slept = rep.sleeps > 0;
        self.governor.end(Ending {
            now_ns: monotonic_ns(),
            spun_ns,
            slept,
            preempted,
            failed: r.is_err(),
            wake_ns: rep.wake_ns,
            arrival: None,
            late_ns: None,
        });
        self.count(r, !slept)
    }

    /// A dispatch-mode wait, counted as blocked on this CPU while it lasts
    /// (the sibling rule).
    fn dispatch<S: Source + ?Sized>(
        &mut self,
        src: &mut S,
        deadline: Option<Instant>,
        cpu: Option<u32>,
        now_ns: u64,
    ) -> Result<Option<S::Completion>> {
        let mut rep = crate::dispatch::DispatchReport::default();
        let asleep = self.governor.blocking(cpu, now_ns);
        let lone = self.governor.lone_dispatch_spin();
        let (r, slept) = crate::dispatch::wait(src, deadline, &mut self.link, &mut rep, lone);
        drop(asleep);
        let s = &mut self.stats;
        s.sleeps += rep.sleeps;
        s.rechecks_hit += rep.rechecks_hit;
        s.spurious += rep.spurious;
        s.handoffs += rep.handoffs;
        s.relays += rep.relays;
        s.dispatch_fallbacks += rep.fallbacks;
        s.dispatch_paused += rep.paused;
        s.dispatch_resumed += rep.resumed;
        // Most waits of a busy dispatch-mode thread end in its own relay,
        // with nothing to learn from their length: no clock read then.
        let end_ns = if self.governor.end_reads_clock(slept, false) {
            monotonic_ns()
        } else {
            now_ns
        };
        let mut e = Ending::at(end_ns, 0, slept);
        e.failed = r.is_err();
        self.governor.end(e);
        self.count(r, !slept)
    }

    /// A pre-wake: sleep on the source until `wake_at_ns` (with a fine
    /// timer slack, so the timer is late by the host's wake-up only), then
    /// spin until `spin_until_ns`, for at most `spin_max_ns` from the
    /// wake-up ([`Decision::Prewake`]), then block. A completion during the
    /// sleep ends the wait as in interrupt mode.
    fn prewake<S: Source + ?Sized>(
        &mut self,
        src: &mut S,
        deadline: Option<Instant>,
        cpu: Option<u32>,
        start_ns: u64,
        (wake_at_ns, spin_until_ns, spin_max_ns): (u64, u64, u64),
    ) -> Result<Option<S::Completion>> {
        use crate::adaptive::prewake::Arrival;
        let mut e = Ending::at(start_ns, 0, true);
        let now_ns = monotonic_ns();
        let timer = Instant::now() + Duration::from_nanos(wake_at_ns.saturating_sub(now_ns));
        let first = deadline.map_or(timer, |d| d.min(timer));
        let mut rep = BlockReport::default();
        let asleep = self.governor.blocking(cpu, now_ns);
        let r = {
            let _slack = crate::cpu::FineTimerSlack::set();
            let short = self.short_slice();
            let r = block_until_ready(src, Some(first), &mut rep);
            self.give_back(short);
            r
        };
        drop(asleep);
        self.count_block(&rep);
        let t1 = monotonic_ns();
        e.now_ns = t1;
        match r {
            Err(err) => {
                e.failed = true;
                self.governor.end(e);
                return Err(err);
            }
            Ok(Some(c)) => {
                if t1 >= wake_at_ns {
                    // The timer had expired by the time this thread ran:
                    // the completion came after the timer, while the
                    // thread was waking (a source's ring may have ended
                    // the sleep just as well), so the timer's lateness is
                    // at least what it was, and the wait was caught at
                    // the first look after it. Counting it early (a
                    // wake-up by the source) left the lateness unlearned
                    // where it exceeds the sleep.
                    e.late_ns = Some(t1 - wake_at_ns);
                    e.slept = false;
                    e.arrival = Some(Arrival::Caught);
                } else {
                    e.slept = rep.sleeps > 0;
                    e.wake_ns = rep.wake_ns;
                    e.arrival = Some(Arrival::Early);
                }
                self.governor.end(e);
                return self.count(Ok(Some(c)), !e.slept);
            }
            Ok(None) => {}
        }
        e.late_ns = Some(t1.saturating_sub(wake_at_ns));
        if deadline.is_some_and(|d| Instant::now() >= d) {
            self.governor.end(e);
            return Ok(None);
        }
        let spin = spin_until_ns.saturating_sub(t1).min(spin_max_ns);
        let end = match hybrid::spin(src, t1, spin) {
            Ok(end) => end,
            Err(err) => {
                e.failed = true;
                self.governor.end(e);
                return Err(err);
            }
        };
        e.spun_ns = end.last_ns - t1;
        if let Some(c) = end.caught {
            e.now_ns = end.last_ns;
            e.slept = false;
            e.arrival = Some(Arrival::Caught);
            self.governor.end(e);
            return self.count(Ok(Some(c)), true);
        }
        e.preempted = end.preempted;
        let mut rep = BlockReport::default();
        let asleep = self.governor.blocking(cpu, end.last_ns);
        let short = self.short_slice();
        let r = block_until_ready(src, deadline, &mut rep);
        self.give_back(short);
        drop(asleep);
        self.count_block(&rep);
        e.now_ns = monotonic_ns();
        e.wake_ns = rep.wake_ns;
        e.arrival = Some(Arrival::Late);
        e.failed = r.is_err();
        self.governor.end(e);
        self.count(r, false)
    }

    /// A short slice for the sleep to come, where adaptive mode asks for
    /// one ([`crate::adaptive::Config::sleep_slice_us`]: the CPU contended)
    /// and the slice trial gives it now
    /// ([`crate::adaptive::trial`]): the thread's own comes back when
    /// the guard drops, before the wait returns.
    fn short_slice(&mut self) -> Option<crate::slice::ForSleep> {
        let (d, trial) = self.governor.sleep_slice(self.sensors.contended())?;
        if let Some(worth) = trial
            && !self.sensors.trial_slice_on(worth)
        {
            return None;
        }
        let g = crate::slice::for_sleep(d)?;
        self.governor.note_short_slice();
        Some(g)
    }

    /// Give a short slice back, timed: a give-back that took long lost
    /// the CPU on the way (re-placed under its own slice, the thread was
    /// not the kernel's next pick), which the governor counts.
    #[inline]
    fn give_back(&mut self, short: Option<crate::slice::ForSleep>) {
        if let Some(g) = short {
            let t0 = monotonic_ns();
            drop(g);
            self.governor
                .gave_back_slice(monotonic_ns().saturating_sub(t0));
        }
    }

    fn count_block(&mut self, rep: &BlockReport) {
        self.stats.sleeps += rep.sleeps as u64;
        self.stats.rechecks_hit += rep.rechecks_hit as u64;
        self.stats.spurious += rep.spurious as u64;
    }

    #[cold]
    fn fail(&mut self, start_ns: u64) {
        let mut e = Ending::at(monotonic_ns(), 0, false);
        e.spun_ns = e.now_ns.saturating_sub(start_ns);
        e.failed = true;
        self.governor.end(e);
    }

    fn count<C>(&mut self, r: Result<Option<C>>, no_sleep: bool) -> Result<Option<C>> {
        if let Ok(Some(_)) = &r {
            self.stats.completions += 1;
            if no_sleep {
                self.stats.without_sleep += 1;
            }
        }
        r
    }
}
