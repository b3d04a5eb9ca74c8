//! The idle policy: how long a polling dispatcher keeps polling without a
//! hand-off before it hands its waiters back to interrupt mode and sleeps
//! (fixed, [`Config::idle_after`], or learned, [`Config::learn_idle`]), and
//! the dispatcher's pre-wake: when the gaps between hand-offs are
//! predictable, it sleeps at once and has its waiters come back to it
//! shortly before the next completion is due.
//!
//! # The dispatcher's pre-wake
//!
//! A sleeping dispatcher has handed its waiters back to interrupt mode, so
//! the first completion after an idle period pays a full wake-up (4-20 µs
//! here), and only the *next* wait is served by hand-off again. Where the
//! learned gaps are concentrated (a steady service time, a periodic
//! stream), the learner plans a pre-wake for the stretch ([`Plan::Prewake`],
//! the same plan and margin rules as an adaptive wait's, see
//! [`crate::adaptive::prewake`]): the dispatcher goes to sleep right after
//! the hand-off and publishes a *resume time*; each waiter it pauses sleeps
//! in interrupt mode only until then (a completion before it wakes the
//! waiter as usual: *early*), then announces its wait again, which kicks
//! the dispatcher awake ahead of the completion. The dispatcher then polls
//! until the plan's spin end: a hand-off there is *caught* (the wake-ups
//! were paid before the completion, so they cost no latency); none is
//! *late*, and it sleeps again without a resume time. The timer lives in
//! the waiters because only they can leave their interrupt-mode sleep; the
//! dispatcher alone decides when.
//!
//! The lateness the learner learns is the dispatcher's own: from the
//! resume time to its first pass after it, i.e. the waiter's timer, its
//! announce and the switch to the dispatcher together.

use super::Config;
use crate::adaptive::prewake::Arrival;
use crate::adaptive::{Learner, Model, Outcome, Plan};
use std::time::{Duration, Instant};

/// The stretch in progress: from one hand-off (or wake-up) to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stretch {
    /// Poll for the threshold, then sleep until kicked.
    Plain,
    /// Sleep at once; have the waiters come back at `resume`; poll until
    /// `spin_end`. `resumed`: when the dispatcher ran after `resume`.
    Prewake {
        resume: Instant,
        spin_end: Instant,
        resumed: Option<Instant>,
    },
}

/// The dispatcher's idle threshold and pre-wake plan: fixed, or learned
/// per dispatcher by an adaptive learner that sees each stretch from one
/// hand-off to the next as a wait (see [`Config::learn_idle`]).
pub(super) struct IdleClock {
    fixed: Option<Duration>,
    learn: Option<Learner>,
    /// Where the learner's clock starts.
    epoch: Instant,
    /// Start of the stretch in progress.
    since: Instant,
    stretch: Stretch,
    /// The threshold planned for the stretch in progress.
    now: Option<Duration>,
}

/// `a - b` in ns (0 if `a` is earlier).
fn ns_after(a: Instant, b: Instant) -> u64 {
    a.saturating_duration_since(b).as_nanos() as u64
}

/// A stretch as the learner sees it (the dispatcher never dates a ring,
/// so no wake-up latency is known).
fn outcome(
    waited_ns: u64,
    spun_ns: u64,
    slept: bool,
    arrival: Option<Arrival>,
    late_ns: Option<u64>,
) -> Outcome {
    Outcome {
        waited_ns,
        spun_ns,
        slept,
        wake_ns: None,
        arrival,
        late_ns,
    }
}

impl IdleClock {
    pub(super) fn new(cfg: &Config, start: Instant) -> IdleClock {
        let mut c = IdleClock {
            fixed: cfg.idle_after,
            learn: cfg.learn_idle.map(|a| Learner::new(a, Model::default())),
            epoch: start,
            since: start,
            stretch: Stretch::Plain,
            now: cfg.idle_after,
        };
        c.plan(start);
        c
    }

    /// How long after the last hand-off (or wake-up) to go to sleep.
    pub(super) fn threshold(&self) -> Option<Duration> {
        self.now
    }

    /// When the waiters paused now should come back (`None`: when their
    /// completion wakes them).
    pub(super) fn resume_at(&self) -> Option<Instant> {
        match self.stretch {
            Stretch::Prewake {
                resume,
                resumed: None,
                ..
            } => Some(resume),
            _ => None,
        }
    }

    /// The learner's counters (pre-wakes planned and where their
    /// completions arrived), if the threshold is learned.
    pub(super) fn stats(&self) -> Option<crate::adaptive::AdaptiveStats> {
        self.learn.as_ref().map(Learner::stats)
    }

    fn plan(&mut self, at: Instant) {
        self.since = at;
        self.stretch = Stretch::Plain;
        let ns = ns_after(at, self.epoch);
        let Some(learner) = self.learn.as_mut() else {
            return;
        };
        let env = crate::adaptive::Env {
            prewake: learner.config().prewake,
            ..crate::adaptive::Env::FREE
        };
        let b = match learner.plan(ns, env) {
            Plan::Spin(b) => Duration::from_nanos(b),
            Plan::Dispatch => Duration::ZERO,
            Plan::Prewake {
                sleep_ns,
                spin_end_ns,
            } => {
                self.stretch = Stretch::Prewake {
                    resume: at + Duration::from_nanos(sleep_ns),
                    spin_end: at + Duration::from_nanos(spin_end_ns),
                    resumed: None,
                };
                Duration::ZERO
            }
        };
        self.now = Some(self.fixed.map_or(b, |f| b.min(f)));
    }

    /// A hand-off at `now`.
    pub(super) fn busy(&mut self, now: Instant) {
        let waited = ns_after(now, self.since);
        let o = match self.stretch {
            Stretch::Plain => outcome(waited, waited, false, None, None),
            // Polling after the resume: the plan's aim.
            Stretch::Prewake {
                resume,
                resumed: Some(r),
                ..
            } => outcome(
                waited,
                ns_after(now, r),
                false,
                Some(Arrival::Caught),
                Some(ns_after(r, resume)),
            ),
            // Before the dispatcher even went to sleep: early, and cheap.
            Stretch::Prewake { resumed: None, .. } => {
                outcome(waited, waited, false, Some(Arrival::Early), None)
            }
        };
        self.learned(o, now);
    }

    /// Woken from the idle sleep at `now`. Returns whether the stretch
    /// goes on (a pre-wake's resume: poll until its spin end).
    pub(super) fn woke(&mut self, now: Instant) -> bool {
        let waited = ns_after(now, self.since);
        let o = match self.stretch {
            Stretch::Prewake {
                resume,
                spin_end,
                resumed: None,
            } if now >= resume => {
                self.stretch = Stretch::Prewake {
                    resume,
                    spin_end,
                    resumed: Some(now),
                };
                self.now = Some(spin_end.saturating_duration_since(self.since));
                return true;
            }
            // Kicked before the resume time: a waiter's completion woke
            // it (or a new wait came).
            Stretch::Prewake { resumed: None, .. } => {
                outcome(waited, 0, true, Some(Arrival::Early), None)
            }
            // Polled after the resume until the spin end, then slept.
            Stretch::Prewake {
                resume,
                spin_end,
                resumed: Some(r),
            } => outcome(
                waited,
                ns_after(spin_end, r),
                true,
                Some(Arrival::Late),
                Some(ns_after(r, resume)),
            ),
            Stretch::Plain => outcome(
                waited,
                (self.now.unwrap_or_default().as_nanos() as u64).min(waited),
                true,
                None,
                None,
            ),
        };
        self.learned(o, now);
        false
    }

    fn learned(&mut self, o: Outcome, now: Instant) {
        if let Some(learner) = self.learn.as_mut() {
            learner.record(o);
        }
        self.plan(now);
    }
}
