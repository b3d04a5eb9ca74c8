//! The spin phase of `hybrid` and `adaptive` waits: peek for a budget
//! before blocking. How long, and whether at all, is the
//! [`Governor`](super::Governor)'s decision.

use super::governor::PREEMPTED_NS;
use crate::Result;
use crate::cpu::monotonic_ns;
use crate::source::Source;

/// Peeks between two clock reads: the clock costs more than a peek.
const SPINS_PER_CLOCK: u32 = 32;

/// How a spin ended.
pub(super) struct SpinEnd<C> {
    /// The completion it caught, if any.
    pub caught: Option<C>,
    /// The loop's last clock reading ([`monotonic_ns`]): a caller that wants
    /// to date the end of the spin uses it instead of reading the clock
    /// again after a catch, which would sit between the completion and its
    /// return (it is within [`SPINS_PER_CLOCK`] peeks, well under the 1 µs
    /// resolution budgets are chosen at).
    pub last_ns: u64,
    /// Two clock readings were more than [`PREEMPTED_NS`] apart: the
    /// thread lost the CPU while spinning.
    pub preempted: bool,
}

/// Spin from `start_ns` until a completion, `start_ns + budget_ns`, or a
/// preemption (times in [`monotonic_ns`]; the caller has cut the budget to
/// its deadline).
///
/// Out of line on purpose: inlined into `Waiter::wait_deadline` the loop
/// cost hybrid `bench pingpong` 5-10 ns one-way (0.090-0.100 against
/// 0.085-0.095 µs out of line, alternating binaries, host in its fast
/// state); a call before the loop costs nothing that matters.
#[inline(never)]
pub(super) fn spin<S: Source + ?Sized>(
    src: &mut S,
    start_ns: u64,
    budget_ns: u64,
) -> Result<SpinEnd<S::Completion>> {
    let end = start_ns.saturating_add(budget_ns);
    let mut last_ns = start_ns;
    let mut n: u32 = 0;
    loop {
        if src.ready()
            && let Some(c) = src.try_take()?
        {
            return Ok(SpinEnd {
                caught: Some(c),
                last_ns,
                preempted: false,
            });
        }
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n.is_multiple_of(SPINS_PER_CLOCK) {
            let now = monotonic_ns();
            let preempted = now.saturating_sub(last_ns) > PREEMPTED_NS;
            last_ns = now;
            if preempted || now >= end {
                return Ok(SpinEnd {
                    caught: None,
                    last_ns,
                    preempted,
                });
            }
        }
    }
}
