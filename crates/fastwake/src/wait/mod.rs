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
//! The dispatch and adaptive modes build on these (see their modules when
//! present). All blocking goes through [`crate::source::block_until_ready`].

mod hybrid;
mod poll;
mod siblings;

use crate::source::{BlockReport, Source, block_until_ready};
use crate::{Fail, Result};
use std::str::FromStr;
use std::time::{Duration, Instant};

pub use hybrid::DEFAULT_BUDGET;

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
            WaitMode::Hybrid { budget } if *budget != DEFAULT_BUDGET => {
                write!(f, "hybrid:{}us", budget.as_micros())
            }
            WaitMode::Adaptive(c) => write!(f, "{c}"),
            m => f.write_str(m.name()),
        }
    }
}

/// A dispatch-mode wait, counted as asleep on this CPU while it lasts
/// (see `siblings`). Returns (result, slept).
fn dispatch_wait<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    link: &mut crate::dispatch::Link,
    stats: &mut WaitStats,
) -> (Result<Option<S::Completion>>, bool) {
    let _asleep = siblings::Asleep::enter(crate::cpu::current());
    crate::dispatch::wait(src, deadline, link, stats)
}

impl FromStr for WaitMode {
    type Err = Fail;

    /// `poll`, `interrupt`, `hybrid`, `hybrid:<N>us` (budget in µs),
    /// `adaptive` or `adaptive:cap=<N>%[,worth=<N>]`.
    fn from_str(s: &str) -> Result<Self> {
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
                    let us = b.strip_suffix("us").unwrap_or(b);
                    let us: u64 = us.parse().map_err(|_| {
                        Fail::invalid(format!(
                            "bad hybrid budget '{b}': expected e.g. hybrid:20us"
                        ))
                    })?;
                    return Ok(WaitMode::Hybrid {
                        budget: Duration::from_micros(us),
                    });
                }
                if let Some(o) = s.strip_prefix("adaptive:") {
                    return Ok(WaitMode::Adaptive(crate::adaptive::Config::parse_options(
                        o,
                    )?));
                }
                Err(Fail::invalid(format!(
                    "unknown wait mode '{s}': expected poll, interrupt, hybrid[:Nus], dispatch or adaptive[:cap=N%]"
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
    /// Dispatch mode: wake-ups handed off by the dispatcher.
    pub handoffs: u64,
    /// Dispatch mode: hand-offs this thread made to another thread of its
    /// core while relaying before its own sleep.
    pub relays: u64,
    /// Dispatch mode: waits done in interrupt mode because no live
    /// dispatcher served the CPU, the source has no peek handle, or the
    /// dispatcher was starved of CPU (not seen running for 500 µs).
    pub dispatch_fallbacks: u64,
    /// Dispatch mode: waits handed back to interrupt mode by an idle
    /// dispatcher.
    pub dispatch_paused: u64,
}

/// Waits for completions in one [`WaitMode`], keeping [`WaitStats`].
#[derive(Debug, Clone)]
pub struct Waiter {
    mode: WaitMode,
    stats: WaitStats,
    link: crate::dispatch::Link,
    adaptive: Option<Box<crate::adaptive::Controller>>,
}

impl Waiter {
    /// A waiter in `mode`.
    pub fn new(mode: WaitMode) -> Self {
        Waiter {
            mode,
            stats: WaitStats::default(),
            link: crate::dispatch::Link::default(),
            adaptive: match mode {
                WaitMode::Adaptive(c) => Some(Box::new(crate::adaptive::Controller::new(c))),
                _ => None,
            },
        }
    }

    /// Adaptive mode: what the controller decided so far.
    pub fn adaptive_stats(&self) -> Option<crate::adaptive::AdaptiveStats> {
        self.adaptive.as_ref().map(|c| c.stats())
    }

    /// Adaptive mode: the controller (for [`crate::adaptive::Controller::explain`]).
    pub fn adaptive(&self) -> Option<&crate::adaptive::Controller> {
        self.adaptive.as_deref()
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
        self.mode
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
            return Ok(Some(c));
        }
        let spun = match self.mode {
            WaitMode::Poll => return self.count(poll::spin(src, deadline), true),
            WaitMode::Interrupt => None,
            WaitMode::Dispatch => {
                let (r, slept) = dispatch_wait(src, deadline, &mut self.link, &mut self.stats);
                return self.count(r, !slept);
            }
            WaitMode::Hybrid { budget } => {
                if siblings::others_asleep(crate::cpu::current()) {
                    self.stats.spin_skipped_siblings += 1;
                    None
                } else {
                    hybrid::spin_phase(src, budget, deadline, &mut self.stats)?
                }
            }
            WaitMode::Adaptive(_) => {
                let ctl = self
                    .adaptive
                    .as_deref_mut()
                    .expect("adaptive waiter has a controller");
                let asleep = siblings::others_asleep(crate::cpu::current());
                let budget = match ctl.begin(src.peer_cpu(), asleep) {
                    crate::adaptive::Plan::Spin(ns) => ns,
                    crate::adaptive::Plan::Dispatch => {
                        let (r, slept) =
                            dispatch_wait(src, deadline, &mut self.link, &mut self.stats);
                        ctl.end(0, slept);
                        return self.count(r, !slept);
                    }
                };
                // The controller already ruled out a same-CPU producer
                // and read the clock at the start of the wait.
                let mut seen = None;
                let r = match (budget, ctl.started()) {
                    (0, _) => Ok(None),
                    (b, Some(t)) => {
                        let mut last = t;
                        let r =
                            hybrid::spin_from(src, t, Duration::from_nanos(b), deadline, &mut last);
                        seen = Some(last);
                        r
                    }
                    (b, None) => {
                        hybrid::spin_phase(src, Duration::from_nanos(b), deadline, &mut self.stats)
                    }
                };
                match &r {
                    // Caught while spinning: the whole wait was spin, and
                    // the spin loop's last clock reading dates it.
                    Ok(Some(_)) => match seen {
                        Some(t) => ctl.end_at(t, u64::MAX, false),
                        None => ctl.end(u64::MAX, false),
                    },
                    Ok(None) => ctl.set_spun(budget),
                    Err(_) => ctl.end(budget, false),
                }
                r?
            }
        };
        if let Some(c) = spun {
            return self.count(Ok(Some(c)), true);
        }
        if let Some(ctl) = self.adaptive.as_deref_mut() {
            ctl.before_block();
        }
        let mut rep = BlockReport::default();
        let asleep = siblings::Asleep::enter(crate::cpu::current());
        let r = block_until_ready(src, deadline, &mut rep);
        drop(asleep);
        self.stats.sleeps += rep.sleeps as u64;
        self.stats.rechecks_hit += rep.rechecks_hit as u64;
        self.stats.spurious += rep.spurious as u64;
        let no_sleep = rep.sleeps == 0;
        if let Some(ctl) = self.adaptive.as_deref_mut() {
            ctl.finish(!no_sleep, rep.wake_ns);
        }
        self.count(r, no_sleep)
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
