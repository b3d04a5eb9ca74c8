//! The publish word a producer and its consumer share: `head << 2 |
//! notice << 1 | armed`, and the producer's publish, which adds to the
//! head and clears both request bits in one compare-exchange.
//!
//! The consumer sets a request bit with an atomic OR that returns the head
//! in the same step (`ARMED`: ring my doorbell, I am about to sleep;
//! `NOTICE`: push my dispatcher a ready notice). Two read-modify-writes of
//! one word are totally ordered, so either the publish sees the request
//! or the request sees the new head: no fence, and a producer whose
//! consumer is not waiting pays one compare-exchange. The channel
//! (`source::channel`) and the shared-queue inboxes (`source::demux`) both
//! publish through here.

use crate::sync::{AtomicU64, Ordering};

/// The consumer's doorbell request.
pub(crate) const ARMED: u64 = 1;
/// The consumer's notice request (a dispatch-mode wait).
pub(crate) const NOTICE: u64 = 2;
/// Where the head starts.
pub(crate) const HEAD_SHIFT: u32 = 2;

/// Publish `n` completions after `head` into the publish word `w`,
/// clearing both request bits in the same step; returns the word before.
/// The guess that no bit is set makes it one compare-exchange when the
/// consumer is not waiting (only the producer moves the head).
#[inline]
pub(crate) fn publish(w: &AtomicU64, head: u64, n: u64) -> u64 {
    let mut cur = head << HEAD_SHIFT;
    loop {
        let new = (cur & !(ARMED | NOTICE)) + (n << HEAD_SHIFT);
        match w.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(prev) => return prev,
            Err(now) => cur = now,
        }
    }
}
