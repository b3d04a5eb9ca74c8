//! Counters of the verbs hooks: the `verbs` block of the process's live
//! counters (`crate::stats`, layout `fastwake::preload_stats::Verbs`),
//! read by `fastwake stats` and printed at exit with FASTWAKE_VERBOSE=1.

use fastwake::preload_stats::Verbs;
use std::sync::atomic::AtomicU64;

/// Add `n` to the verbs counter `f` picks (nothing when not counting).
#[inline]
pub fn add(f: impl FnOnce(&Verbs) -> &AtomicU64, n: u64) {
    crate::stats::add(|s| f(&s.verbs), n);
}
