//! The waiting side of [`crate::WaitMode::Dispatch`] for kernel threads.
//!
//! A wait registers the source with the dispatcher of the CPU the thread
//! runs on (once per source; the registration lives in the [`Waiter`]),
//! announces itself in its slot, re-checks the source, and sleeps on the
//! slot's futex until the dispatcher hands off. Without a live dispatcher
//! for this CPU, or for a source without a [`crate::source::Peek`] handle,
//! it waits in interrupt mode instead.
//!
//! [`Waiter`]: crate::Waiter

use super::slot::{DEAD, HANDED, PAUSED, RUNNING, WAITING};
use super::threads::{Core, lookup};
use crate::Result;
use crate::source::{BlockReport, Source, block_until_ready};
use crate::sync::{Ordering, fence};
use crate::wait::WaitStats;
use std::sync::Arc;
use std::time::Instant;

struct Registration {
    core: Arc<Core>,
    index: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.core.unregister(self.index);
    }
}

/// A waiter's link to its dispatcher. Cloning a [`crate::Waiter`] gives the
/// clone a fresh, unregistered link (a slot serves one thread).
#[derive(Default)]
pub struct Link {
    reg: Option<Registration>,
    key: usize,
}

impl Clone for Link {
    fn clone(&self) -> Self {
        Link::default()
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("registered", &self.reg.as_ref().map(|r| r.index))
            .finish()
    }
}

impl Link {
    /// Is this waiter registered with a live dispatcher?
    pub fn registered(&self) -> bool {
        self.reg.as_ref().is_some_and(|r| !r.core.is_dead())
    }

    fn ensure<S: Source + ?Sized>(&mut self, src: &S) -> bool {
        // The handle's address identifies the source: the registration
        // keeps the handle alive, so the address cannot be reused by
        // another source meanwhile (unlike the source's own address).
        let Some(peek) = src.peek_handle() else {
            self.reg = None;
            return false;
        };
        let key = super::handle_id(&peek);
        if self.key == key && self.registered() {
            return true;
        }
        self.reg = None;
        self.key = key;
        let Some(core) = crate::cpu::current().and_then(lookup) else {
            return false;
        };
        match core.register(peek) {
            Some(index) => {
                self.reg = Some(Registration { core, index });
                true
            }
            None => false,
        }
    }
}

/// Interrupt-mode wait, recording into `stats`. Returns (result, slept).
fn interrupt<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    stats: &mut WaitStats,
) -> (Result<Option<S::Completion>>, bool) {
    let mut rep = BlockReport::default();
    let r = block_until_ready(src, deadline, &mut rep);
    stats.sleeps += rep.sleeps as u64;
    stats.rechecks_hit += rep.rechecks_hit as u64;
    stats.spurious += rep.spurious as u64;
    (r, rep.sleeps > 0)
}

/// Wait in dispatch mode. Returns (result, slept).
pub(crate) fn wait<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    link: &mut Link,
    stats: &mut WaitStats,
) -> (Result<Option<S::Completion>>, bool) {
    if !link.ensure(src) {
        stats.dispatch_fallbacks += 1;
        return interrupt(src, deadline, stats);
    }
    let mut slept = false;
    loop {
        match src.try_take() {
            Ok(Some(c)) => return (Ok(Some(c)), slept),
            Ok(None) => {}
            Err(e) => return (Err(e), slept),
        }
        let reg = link.reg.as_ref().expect("registered above");
        let (core, slot) = (&reg.core, &reg.core.slots[reg.index]);
        if core.stale() {
            // The dispatcher is not getting the CPU: do not count on it.
            stats.dispatch_fallbacks += 1;
            let (r, s) = interrupt(src, deadline, stats);
            return (r, slept || s);
        }
        if !slot.announce(&core.waitset, reg.index) {
            // The dispatcher died (DEAD).
            link.reg = None;
            stats.dispatch_fallbacks += 1;
            let (r, s) = interrupt(src, deadline, stats);
            return (r, slept || s);
        }
        // Dekker with the producer (and the summary): our WAITING must be
        // visible before we look at the source, or both sides could miss.
        fence(Ordering::SeqCst);
        core.kick();
        let st = if src.ready() {
            slot.cancel()
        } else {
            // No timeout unless the caller has a deadline: in a VM arming
            // a timer per sleep costs more than a microsecond (measured:
            // docs/dispatch.md). A dispatcher that dies rings every slot;
            // one starved of CPU is only late, and new waits avoid it
            // (`stale` above).
            loop {
                let mut t = None;
                if let Some(d) = deadline {
                    let now = Instant::now();
                    if now >= d {
                        break slot.cancel();
                    }
                    t = Some(d - now);
                }
                stats.sleeps += 1;
                slept = true;
                let s = slot.sleep(t);
                if s != WAITING {
                    break s;
                }
            }
        };
        if st == RUNNING {
            // Withdrawn before any hand-off: take if something is there,
            // report the deadline otherwise.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return match src.try_take() {
                    Ok(c) => (Ok(c), slept),
                    Err(e) => (Err(e), slept),
                };
            }
            continue;
        }
        match slot.reclaim() {
            HANDED => stats.handoffs += 1,
            PAUSED => {
                // The dispatcher went idle: this one wait in interrupt mode,
                // then wake the dispatcher so polling resumes.
                stats.dispatch_paused += 1;
                let core = core.clone();
                let (r, s) = interrupt(src, deadline, stats);
                core.kick();
                return (r, slept || s);
            }
            DEAD => {
                link.reg = None;
                stats.dispatch_fallbacks += 1;
                let (r, s) = interrupt(src, deadline, stats);
                return (r, slept || s);
            }
            _ => {}
        }
    }
}
