//! The waiting side of [`crate::WaitMode::Dispatch`] for kernel threads.
//!
//! A wait registers the source with the dispatcher of the CPU the thread
//! runs on (once per source; the registration lives in the [`Waiter`]),
//! announces itself in its slot, re-checks the source, and sleeps on the
//! slot's futex until the dispatcher hands off. Without a live dispatcher
//! for this CPU, or for a source without a [`crate::source::Peek`] handle,
//! it waits in interrupt mode instead.
//!
//! # The relay
//!
//! Before it sleeps, a thread spends a short budget doing the dispatcher's
//! job itself: it peeks its own source and the other waiting sources of
//! its core, and hands off to the first owner whose source is ready. Why:
//! with the dispatcher alone, a chain of requests to different threads on
//! one core costs two same-core switches per hand-off (the finished thread
//! → the `SCHED_IDLE` dispatcher, then the dispatcher → the next thread),
//! because the next request usually arrives while the finished thread is
//! still on its way to sleep. Relaying, the finished thread sees that
//! request itself, rings the next thread, and its own sleep is the one
//! switch, straight into the woken thread. A completion for the thread
//! itself during the relay costs no switch at all. The relay backs off
//! when it keeps finding nothing, and never spins against a producer on
//! the same CPU.
//!
//! [`Waiter`]: crate::Waiter

use super::slot::{DEAD, HANDED, PAUSED, RUNNING};
use super::threads::{Hub, lookup};
use crate::Result;
use crate::source::{BlockReport, Peek, Source, block_until_ready};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one dispatch-mode wait did, for the caller's counters (the wait
/// layer folds it into [`crate::wait::WaitStats`]; this layer knows
/// nothing of wait modes).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DispatchReport {
    /// Times the thread slept (on its slot, or in an interrupt-mode
    /// fallback).
    pub sleeps: u64,
    /// Interrupt-mode fallbacks: times the arm → re-check found a
    /// completion.
    pub rechecks_hit: u64,
    /// Interrupt-mode fallbacks: wake-ups with nothing to take.
    pub spurious: u64,
    /// Wake-ups handed off by the dispatcher.
    pub handoffs: u64,
    /// Hand-offs this thread made to another thread of its core while
    /// relaying before its own sleep.
    pub relays: u64,
    /// Waits done in interrupt mode because no live dispatcher served the
    /// CPU, the source has no peek handle, or the dispatcher was starved.
    pub fallbacks: u64,
    /// Waits handed back to interrupt mode by an idle dispatcher.
    pub paused: u64,
    /// Of those, waits that came back to the dispatcher at its pre-wake's
    /// resume time, before their completion.
    pub resumed: u64,
}

struct Registration {
    hub: Arc<Hub>,
    index: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.unregister(self.index);
    }
}

/// A waiter's link to its dispatcher. Cloning a [`crate::Waiter`] gives the
/// clone a fresh, unregistered link (a slot serves one thread).
#[derive(Default)]
pub struct Link {
    reg: Option<Registration>,
    /// The handle of the source registered last.
    peek: Option<Arc<dyn Peek>>,
    relay: RelayHistory,
    /// The dispatcher was seen running when this thread last woke from a
    /// wait on its core. Its silence since then is then this thread's own
    /// doing (a `SCHED_IDLE` dispatcher cannot run while the threads of its
    /// core compute), not starvation, and is no reason to fall back: a
    /// program that computed over 500 µs between waits had every wait
    /// fall back to interrupt mode. If a busy thread did take the core
    /// meanwhile, the watchdog serves the one wait that trusted it, and
    /// that wait ends untrusted.
    trusted: bool,
    /// A signal ends the wait with `EINTR` (see
    /// [`crate::Waiter::set_interruptible`]).
    pub(crate) interruptible: bool,
    /// Waits in a row that ended without a sleep (the source was ready),
    /// and when the first of them was counted: see [`FAIR_AFTER`].
    unslept: u32,
    unslept_since: Option<Instant>,
}

/// A thread whose waits keep ending without a sleep holds its core; after
/// this long it takes a fair turn ([`Hub::fair_turn`]): the core's other
/// ready waiters are handed off and given the core. Long enough that a
/// thread serving a burst of its own requests is not interrupted after a
/// few (a yield is a switch, 1-2 µs here), a small fraction of the 0.75-3
/// ms scheduler slice the others would otherwise wait.
pub const FAIR_AFTER: Duration = Duration::from_micros(20);
/// The clock is read on one such wait in this many (a read is 20-30 ns in
/// a VM; a wait that finds its source ready costs little more).
const FAIR_CHECK_EVERY: u32 = 4;

/// Relays that found nothing in a row before the relay backs off.
const RELAY_MISSES: u32 = 16;
/// While backed off, relay on one wait in this many (to notice when
/// relaying pays again).
const RELAY_PROBE: u32 = 32;

/// Whether relaying has been paying off for this waiter.
#[derive(Default)]
struct RelayHistory {
    misses: u32,
    waits: u32,
}

impl RelayHistory {
    fn worth_trying(&mut self) -> bool {
        self.waits = self.waits.wrapping_add(1);
        self.misses < RELAY_MISSES || self.waits.is_multiple_of(RELAY_PROBE)
    }

    fn record(&mut self, found: bool) {
        self.misses = if found {
            0
        } else {
            self.misses.saturating_add(1)
        };
    }
}

/// What a relay found.
enum Relay {
    /// Our own source became ready.
    Own,
    /// Another waiting thread's source was ready; we rang it.
    Handed,
    /// Nothing within the budget.
    Nothing,
}

/// Spin up to `budget` peeking our own source and relaying for the core
/// (see the module docs).
fn relay<S: Source + ?Sized>(src: &S, hub: &Hub, me: usize, budget: Duration) -> Relay {
    let start = Instant::now();
    // A relay chain can keep the SCHED_IDLE dispatcher off the CPU for
    // long; without this beat every wait would think it starved and fall
    // back to interrupt mode.
    hub.beat(start);
    let mut passes: u32 = 0;
    loop {
        if src.ready() {
            return Relay::Own;
        }
        if hub.relay_pass(me) {
            return Relay::Handed;
        }
        passes = passes.wrapping_add(1);
        // The clock costs more than a pass over a few sources.
        if passes.is_multiple_of(8) {
            let now = Instant::now();
            if now - start >= budget {
                return Relay::Nothing;
            }
            hub.beat(now);
        }
        std::hint::spin_loop();
    }
}

impl Clone for Link {
    fn clone(&self) -> Self {
        Link {
            interruptible: self.interruptible,
            ..Link::default()
        }
    }
}

impl Link {
    /// Count a wait that ended without a sleep (its source was ready at
    /// once, or it caught its completion before sleeping); after
    /// [`FAIR_AFTER`] of them in a row, take a fair turn. Returns the
    /// hand-offs it made. Nothing for a waiter not registered with a
    /// dispatcher.
    pub(crate) fn unslept_wait(&mut self) -> u64 {
        if self.reg.is_none() {
            return 0;
        }
        self.unslept = self.unslept.wrapping_add(1);
        if !self.unslept.is_multiple_of(FAIR_CHECK_EVERY) {
            return 0;
        }
        let now = Instant::now();
        let Some(since) = self.unslept_since else {
            self.unslept_since = Some(now);
            return 0;
        };
        let Some(reg) = self.reg.as_ref().filter(|_| now - since >= FAIR_AFTER) else {
            return 0;
        };
        self.unslept_since = Some(now);
        reg.hub.fair_turn(reg.index)
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
        self.reg.as_ref().is_some_and(|r| !r.hub.is_dead())
    }

    fn ensure<S: Source + ?Sized>(&mut self, src: &S) -> bool {
        // The handle identifies the source: the registration keeps it
        // alive, so its allocation cannot be reused by another source
        // meanwhile (unlike the source's own address).
        let Some(peek) = src.peek() else {
            self.reg = None;
            return false;
        };
        if self.peek.as_ref().is_some_and(|p| Arc::ptr_eq(p, peek)) && self.registered() {
            return true;
        }
        self.reg = None;
        self.trusted = false;
        self.peek = Some(peek.clone());
        let Some(hub) = crate::cpu::current().and_then(lookup) else {
            return false;
        };
        match hub.register(peek.clone()) {
            Some(index) => {
                self.reg = Some(Registration { hub, index });
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
    stats: &mut DispatchReport,
) -> (Result<Option<S::Completion>>, bool) {
    let mut rep = BlockReport::default();
    let r = block_until_ready(src, deadline, &mut rep);
    stats.sleeps += rep.sleeps as u64;
    stats.rechecks_hit += rep.rechecks_hit as u64;
    stats.spurious += rep.spurious as u64;
    (r, rep.sleeps > 0)
}

/// Is the source's producer on our CPU? Then spinning would only delay it.
fn same_cpu_peer<S: Source + ?Sized>(src: &S) -> bool {
    matches!((src.hints().peer_cpu, crate::cpu::current()), (Some(p), Some(me)) if p == me)
}

/// The re-check after announcing a wait. A source that offers notices
/// (`notices`: its registered handle, when the dispatcher takes them) is
/// asked for one here, and the request reads the source in the same
/// atomic step: the producer either sees it (and pushes a notice the
/// dispatcher pops) or this sees the completion.
pub(super) fn recheck<S: Source + ?Sized>(src: &S, notices: Option<&Arc<dyn Peek>>) -> bool {
    match notices.and_then(|p| p.arm_notice()) {
        Some(ready) => ready,
        None => src.ready(),
    }
}

/// Wait in dispatch mode. Returns (result, slept).
///
/// `lone_spin`: how long a waiter alone on its core relays (spins on its
/// own source) before it sleeps, when that is longer than the relay
/// budget. Why: beside no other waiter the dispatcher would only poll the
/// same source on the same core, and its hand-off adds a same-core
/// wake-up (1-3 µs here) that spinning in place does not pay; a lone
/// dispatch-mode server measured a p50 above hybrid mode's for that
/// wake-up alone. `Duration::ZERO`: the relay budget only.
pub(crate) fn wait<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    link: &mut Link,
    stats: &mut DispatchReport,
    lone_spin: Duration,
) -> (Result<Option<S::Completion>>, bool) {
    let (r, slept) = wait_once(src, deadline, link, stats, lone_spin);
    // Only a sleep gives the dispatcher its core: after one, whether it
    // ran says whether it gets the CPU (see `Link::trusted`).
    if slept {
        link.unslept = 0;
        link.unslept_since = None;
        if let Some(reg) = link.reg.as_ref() {
            link.trusted = !reg.hub.stale();
        }
    } else {
        stats.relays += link.unslept_wait();
    }
    (r, slept)
}

fn wait_once<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    link: &mut Link,
    stats: &mut DispatchReport,
    lone_spin: Duration,
) -> (Result<Option<S::Completion>>, bool) {
    if !link.ensure(src) {
        stats.fallbacks += 1;
        return interrupt(src, deadline, stats);
    }
    let mut slept = false;
    let interruptible = link.interruptible;
    loop {
        match src.try_take() {
            Ok(Some(c)) => return (Ok(Some(c)), slept),
            Ok(None) => {}
            Err(e) => return (Err(e), slept),
        }
        let reg = link.reg.as_ref().expect("registered above");
        let hub = &reg.hub;
        // `trusted` first: `stale` reads the clock, and a trusted wait
        // need not (a clock read is 20-30 ns in a VM, on every wait).
        if !link.trusted && hub.stale() {
            // The dispatcher is not getting the CPU: do not count on it.
            stats.fallbacks += 1;
            let (r, s) = interrupt(src, deadline, stats);
            return (r, slept || s);
        }
        if let Some(budget) = hub
            .relay_budget()
            .map(|b| if hub.lone() { b.max(lone_spin) } else { b })
            && deadline.is_none_or(|d| Instant::now() + budget < d)
            && !same_cpu_peer(src)
            && link.relay.worth_trying()
        {
            match relay(src, hub, reg.index, budget) {
                Relay::Own => {
                    link.relay.record(true);
                    continue;
                }
                Relay::Handed => {
                    link.relay.record(true);
                    stats.relays += 1;
                }
                Relay::Nothing => link.relay.record(false),
            }
        }
        let reg = link.reg.as_ref().expect("registered above");
        let (hub, slot) = (&reg.hub, &reg.hub.slots[reg.index]);
        let notices = link.peek.as_ref().filter(|_| hub.takes_notices());
        let Some(end) = slot.wait_hand_off(
            &hub.waitset,
            reg.index,
            || hub.kick(),
            || recheck(src, notices),
            deadline,
            interruptible,
        ) else {
            // The dispatcher died (DEAD).
            link.reg = None;
            stats.fallbacks += 1;
            let (r, s) = interrupt(src, deadline, stats);
            return (r, slept || s);
        };
        stats.sleeps += end.sleeps as u64;
        slept |= end.sleeps > 0;
        if end.state == RUNNING {
            if end.signalled {
                return (
                    Err(crate::Fail::new(
                        libc::EINTR,
                        "wait interrupted by a signal",
                    )),
                    slept,
                );
            }
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
        match end.state {
            HANDED => stats.handoffs += 1,
            PAUSED => {
                // The dispatcher went idle: this one wait in interrupt mode,
                // then wake the dispatcher so polling resumes. With a
                // pre-wake (`threads::idle`), only until its resume time:
                // then announce the wait again, which wakes it ahead of
                // the completion.
                stats.paused += 1;
                let hub = hub.clone();
                let resume = hub.resume_at().filter(|r| deadline.is_none_or(|d| *r < d));
                let (r, s) = match resume {
                    Some(at) => {
                        let _slack = crate::cpu::FineTimerSlack::set();
                        interrupt(src, Some(at), stats)
                    }
                    None => interrupt(src, deadline, stats),
                };
                slept |= s;
                if resume.is_some() && matches!(r, Ok(None)) {
                    stats.resumed += 1;
                    continue;
                }
                hub.returned();
                return (r, slept);
            }
            DEAD => {
                link.reg = None;
                stats.fallbacks += 1;
                let (r, s) = interrupt(src, deadline, stats);
                return (r, slept || s);
            }
            _ => {}
        }
    }
}
