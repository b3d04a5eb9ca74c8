//! Hybrid mode's spin phase: poll for a budget before blocking.

use super::WaitStats;
use crate::Result;
use crate::source::Source;
use std::time::{Duration, Instant};

/// Default spin budget. On this project's reference machine a cross-core
/// futex wake-up costs ~4.3 µs and a quick peer answers in ~0.2 µs; 20 µs
/// catches any peer that answers within a few wake-up times while bounding
/// the waste on a slow one to about 5 wake-ups' worth of CPU.
pub const DEFAULT_BUDGET: Duration = Duration::from_micros(20);

const SPINS_PER_CLOCK: u32 = 32;

/// Spin until a completion, the budget, or the deadline. Returns `None` to
/// tell the caller to block.
pub(super) fn spin_phase<S: Source + ?Sized>(
    src: &mut S,
    budget: Duration,
    deadline: Option<Instant>,
    stats: &mut WaitStats,
) -> Result<Option<S::Completion>> {
    // Spinning while the producer shares our CPU only steals the CPU it
    // needs to produce: the wait would last the whole budget plus a
    // wake-up. A same-core futex hand-off (~1 µs) is the fast path there.
    if let (Some(peer), Some(me)) = (src.peer_cpu(), crate::cpu::current())
        && peer == me
    {
        stats.spin_skipped_same_cpu += 1;
        return Ok(None);
    }
    if budget.is_zero() {
        return Ok(None);
    }
    let mut seen = Instant::now();
    spin_from(src, seen, budget, deadline, &mut seen)
}

/// The spin loop alone, from `start`: for callers that already checked the
/// producer's CPU and read the clock (adaptive mode), since each of those
/// costs tens of ns on the latency path. `seen` is set to the last clock
/// reading of the loop (or left alone if it read none): a caller that wants
/// to know how long the spin took uses it instead of reading the clock
/// again after a catch, which would sit between the completion and its
/// return (it is within [`SPINS_PER_CLOCK`] iterations, well under the
/// 1 µs resolution budgets are chosen at).
pub(super) fn spin_from<S: Source + ?Sized>(
    src: &mut S,
    start: Instant,
    budget: Duration,
    deadline: Option<Instant>,
    seen: &mut Instant,
) -> Result<Option<S::Completion>> {
    let mut end = start + budget;
    if let Some(d) = deadline {
        end = end.min(d);
    }
    let mut n: u32 = 0;
    loop {
        if src.ready()
            && let Some(c) = src.try_take()?
        {
            return Ok(Some(c));
        }
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n.is_multiple_of(SPINS_PER_CLOCK) {
            *seen = Instant::now();
            if *seen >= end {
                return Ok(None);
            }
        }
    }
}
