//! Poll mode: spin on the source's peek.

use crate::Result;
use crate::source::Source;
use std::time::Instant;

/// Spins between yields. Pure spinning on an oversubscribed core burns the
/// rest of the time slice while the producer cannot run; yielding every few
/// tens of µs bounds that damage and costs nothing measurable when the core
/// is ours alone.
const SPINS_PER_YIELD: u32 = 2048;
/// Spins between clock reads for the deadline.
const SPINS_PER_CLOCK: u32 = 64;

pub(super) fn spin<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
) -> Result<Option<S::Completion>> {
    let mut n: u32 = 0;
    loop {
        if src.ready()
            && let Some(c) = src.try_take()?
        {
            return Ok(Some(c));
        }
        n = n.wrapping_add(1);
        if n.is_multiple_of(SPINS_PER_YIELD) {
            // A closed peer shows only through try_take.
            if let Some(c) = src.try_take()? {
                return Ok(Some(c));
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if let Some(d) = deadline
            && n.is_multiple_of(SPINS_PER_CLOCK)
            && Instant::now() >= d
        {
            return Ok(None);
        }
    }
}
