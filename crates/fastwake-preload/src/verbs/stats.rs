//! Counters of the verbs hooks, kept only with FASTWAKE_VERBOSE=1 and
//! printed at exit.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Stats {
    pub ctx_wrapped: AtomicU64,
    pub ctx_passed: AtomicU64,
    pub cqs: AtomicU64,
    pub waits: AtomicU64,
    pub synthetic: AtomicU64,
    pub real: AtomicU64,
    pub swallowed: AtomicU64,
    pub blocked: AtomicU64,
    pub arms_skipped: AtomicU64,
    pub stash_delivered: AtomicU64,
    pub acks_absorbed: AtomicU64,
}

pub static STATS: Stats = Stats {
    ctx_wrapped: AtomicU64::new(0),
    ctx_passed: AtomicU64::new(0),
    cqs: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    synthetic: AtomicU64::new(0),
    real: AtomicU64::new(0),
    swallowed: AtomicU64::new(0),
    blocked: AtomicU64::new(0),
    arms_skipped: AtomicU64::new(0),
    stash_delivered: AtomicU64::new(0),
    acks_absorbed: AtomicU64::new(0),
};

#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    if crate::config::verbose() {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// One line of counters, if verbs was used at all.
pub fn report() {
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = &STATS;
    if l(&s.ctx_wrapped) + l(&s.ctx_passed) == 0 {
        return;
    }
    crate::diag(&format!(
        "verbs pid={} contexts wrapped={} passed={} cqs={} waits={} events synthetic={} real={} swallowed={} blocked={} arms_skipped={} stashed_cqes_delivered={} acks_absorbed={}",
        std::process::id(),
        l(&s.ctx_wrapped),
        l(&s.ctx_passed),
        l(&s.cqs),
        l(&s.waits),
        l(&s.synthetic),
        l(&s.real),
        l(&s.swallowed),
        l(&s.blocked),
        l(&s.arms_skipped),
        l(&s.stash_delivered),
        l(&s.acks_absorbed),
    ));
}
