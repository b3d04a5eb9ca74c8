//! The idle policy's threshold: how long a polling dispatcher keeps
//! polling without a hand-off before it hands its waiters back to
//! interrupt mode and sleeps. Fixed ([`Config::idle_after`]) or learned
//! ([`Config::learn_idle`]).

use super::Config;
use std::time::{Duration, Instant};

/// The dispatcher's idle threshold: fixed, or learned per dispatcher by an
/// adaptive learner that sees each stretch from one hand-off to the next as a
/// wait (see [`Config::learn_idle`]).
pub(super) struct IdleClock {
    fixed: Option<Duration>,
    learn: Option<(crate::adaptive::Learner, Instant)>,
    /// The threshold planned for the stretch in progress.
    now: Option<Duration>,
}

impl IdleClock {
    pub(super) fn new(cfg: &Config, start: Instant) -> IdleClock {
        let mut c = IdleClock {
            fixed: cfg.idle_after,
            learn: cfg.learn_idle.map(|a| {
                (
                    crate::adaptive::Learner::new(a, crate::adaptive::Model::default()),
                    start,
                )
            }),
            now: cfg.idle_after,
        };
        c.plan(start);
        c
    }

    pub(super) fn threshold(&self) -> Option<Duration> {
        self.now
    }

    fn plan(&mut self, at: Instant) {
        let Some((learner, epoch)) = self.learn.as_mut() else {
            return;
        };
        let ns = at.saturating_duration_since(*epoch).as_nanos() as u64;
        // An idle threshold is a spin budget: no pre-wakes here (the
        // dispatcher's own pre-wake is not built; docs/adaptive.md).
        let env = crate::adaptive::Env {
            prewake: false,
            ..crate::adaptive::Env::FREE
        };
        let b = match learner.plan(ns, env) {
            crate::adaptive::Plan::Spin(b) => Duration::from_nanos(b),
            crate::adaptive::Plan::Dispatch | crate::adaptive::Plan::Prewake { .. } => {
                Duration::ZERO
            }
        };
        self.now = Some(self.fixed.map_or(b, |f| b.min(f)));
    }

    /// A hand-off at `now`; the previous one (or wake-up) was at `since`.
    pub(super) fn busy(&mut self, since: Instant, now: Instant) {
        self.learned(since, now, None);
    }

    /// Woken from the idle sleep at `now`, having polled from `since`.
    pub(super) fn woke(&mut self, since: Instant, now: Instant) {
        let spun = self.now.unwrap_or_default();
        self.learned(since, now, Some(spun));
    }

    fn learned(&mut self, since: Instant, now: Instant, slept_after: Option<Duration>) {
        let Some((learner, _)) = self.learn.as_mut() else {
            return;
        };
        let waited = now.saturating_duration_since(since).as_nanos() as u64;
        learner.record(crate::adaptive::Outcome {
            arrival: None,
            late_ns: None,
            waited_ns: waited,
            spun_ns: slept_after.map_or(waited, |d| (d.as_nanos() as u64).min(waited)),
            slept: slept_after.is_some(),
            wake_ns: None,
        });
        self.plan(now);
    }
}
