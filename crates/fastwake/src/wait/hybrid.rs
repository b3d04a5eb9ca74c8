//! The spin phase of `hybrid` and `adaptive` waits: peek for a budget
//! before blocking. How long, and whether at all, is the
//! [`Governor`](super::Governor)'s decision.

use super::governor::PREEMPTED_NS;
use crate::Result;
use crate::source::Source;
use std::time::{Duration, Instant};

/// Peeks between two clock reads: the clock costs more than a peek.
const SPINS_PER_CLOCK: u32 = 32;

/// How a spin ended.
pub(super) struct SpinEnd<C> {
    /// The completion it caught, if any.
    pub caught: Option<C>,
    /// The loop's last clock reading: a caller that wants to date the end
    /// of the spin uses it instead of reading the clock again after a
    /// catch, which would sit between the completion and its return (it is
    /// within [`SPINS_PER_CLOCK`] peeks, well under the 1 µs resolution
    /// budgets are chosen at).
    pub last: Instant,
    /// Two clock readings were more than [`PREEMPTED_NS`] apart: the
    /// thread lost the CPU while spinning.
    pub preempted: bool,
}

/// Spin from `start` until a completion, `budget`, the deadline, or a
/// preemption.
#[inline]
pub(super) fn spin<S: Source + ?Sized>(
    src: &mut S,
    start: Instant,
    budget: Duration,
    deadline: Option<Instant>,
) -> Result<SpinEnd<S::Completion>> {
    let mut end = start
        .checked_add(budget)
        .unwrap_or(start + Duration::from_secs(1 << 30));
    if let Some(d) = deadline {
        end = end.min(d);
    }
    let mut last = start;
    let mut n: u32 = 0;
    loop {
        if src.ready()
            && let Some(c) = src.try_take()?
        {
            return Ok(SpinEnd {
                caught: Some(c),
                last,
                preempted: false,
            });
        }
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n.is_multiple_of(SPINS_PER_CLOCK) {
            let now = Instant::now();
            let preempted = now.duration_since(last).as_nanos() as u64 > PREEMPTED_NS;
            last = now;
            if preempted || now >= end {
                return Ok(SpinEnd {
                    caught: None,
                    last,
                    preempted,
                });
            }
        }
    }
}
