//! The per-core dispatcher with direct hand-off (FastWake approach 1),
//! on stock Linux.
//!
//! Many connections share a core and still get polling-class latency: one
//! dispatcher per core peeks every source of the waiters on that core
//! (without consuming: [`crate::source::Peek`]) and hands the CPU directly
//! to the waiter whose source is ready. Two kinds of waiters:
//!
//! - **Tasks** ([`tasks`]): stackful coroutines on a [`Runtime`] that is
//!   itself the dispatcher; the hand-off is a user-level switch (a few ns).
//! - **Kernel threads** ([`threads`]): unmodified threads waiting with
//!   [`crate::WaitMode::Dispatch`] sleep on a per-thread futex; a
//!   [`Dispatcher`] thread on their core (`SCHED_IDLE` by default) wakes the
//!   one whose source is ready: a same-core wake-up instead of the
//!   producer's cross-core one, and no syscall for the producer at all.
//!
//! Both scale to hundreds of sources with a readiness summary
//! ([`crate::source::summary`]) and stop burning the core when idle (the
//! idle policy: after `idle_after` without work, sleep until the first
//! event). Measurements: `fastwake bench share` and `docs/design/dispatcher.md`.
//!
//! Layout: `slot` (the lock-free hand-off protocol, loom-checked),
//! `watch` (the watched-source set and one pass over it), [`threads`] (the
//! dispatcher thread), `waiter` (the dispatch-mode wait), [`tasks`] (the
//! task runtime), `sched` (scheduling policies).

mod kernel_list;
#[cfg(all(test, loom))]
mod loom_tests;
mod sched;
pub(crate) mod slot;
pub mod tasks;
pub mod threads;
mod waiter;
mod watch;

use std::time::Duration;

pub use kernel_list::KernelListStats;
pub use sched::SchedPolicy;
pub use tasks::{Runtime, StateCell, TaskConfig, TaskCtx, TaskStats};
pub use threads::{Config, DEFAULT_RELAY, Dispatcher};
pub(crate) use waiter::wait;
pub use waiter::{DispatchReport, Link};

/// Default idle threshold: long enough that a connection answering within
/// a millisecond never sees the slower interrupt-mode path, short enough
/// that an idle core stops spinning almost at once.
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_millis(2);

/// What a dispatcher is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Peeking its sources.
    Polling,
    /// Asleep after the idle threshold; the first event wakes it.
    Sleeping,
    /// Gone: its waiters use interrupt mode.
    Dead,
}

/// Counters of a [`Dispatcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchStats {
    /// Threads woken because their source was ready.
    pub handoffs: u64,
    /// Threads woken by the watchdog because the dispatcher itself was not
    /// getting the CPU.
    pub rescued: u64,
    /// Threads woken by another waiting thread's relay pass instead of by
    /// the dispatcher ([`Config::relay`]).
    pub relayed: u64,
    /// Times a thread that kept finding its own source ready at every
    /// wait gave its core to a thread of the core that was handed its
    /// completion (the fair turn, see `docs/design/dispatcher.md`).
    pub fair_yields: u64,
    /// Passes over the waiting sources (updated every few hundred passes).
    pub passes: u64,
    /// Hand-offs (by the dispatcher or a relay) found through a ready
    /// notice.
    pub notices: u64,
    /// Waits the notices' safety net found ready although no notice named
    /// them yet: each is a lost or a late notice (expected 0; they are
    /// handed off anyway, up to a safety-net round late).
    pub scan_found: u64,
    /// Of `scan_found`, notices the dispatcher popped after all (their
    /// producer was held up between its publish and its notice).
    pub late_notices: u64,
    /// Times it went to sleep under the idle policy.
    pub idle_sleeps: u64,
    /// Waits handed back to interrupt mode when going to sleep.
    pub paused: u64,
    /// Threads registered now.
    pub registered: u64,
    /// The kernel ready list's counters ([`Config::kernel_list`]; updated
    /// every few hundred passes, like `passes`).
    pub kernel_list: KernelListStats,
    /// The idle threshold in force now (learned with
    /// [`Config::learn_idle`]); `None`: never sleeps.
    pub idle_after: Option<std::time::Duration>,
    /// Pre-wakes the learned idle policy planned ([`Config::learn_idle`]
    /// with `prewake=on`): the dispatcher slept at once after a hand-off
    /// and had its waiters come back shortly before the next completion
    /// was due (see `docs/design/dispatcher.md`). Read together with the three
    /// arrival counters below, whose sum never exceeds it (the pre-wake in
    /// progress has no arrival yet).
    pub prewakes: u64,
    /// Of those, the completion came before the waiters came back (served
    /// in interrupt mode).
    pub prewake_early: u64,
    /// The completion came while the dispatcher polled after the resume:
    /// handed off, its wake-ups paid before it.
    pub prewake_caught: u64,
    /// No completion by the plan's spin end: the dispatcher slept again.
    pub prewake_late: u64,
    /// Times the learned idle policy paused its pre-wakes because most
    /// recent ones came early (as an adaptive waiter's,
    /// [`crate::adaptive::AdaptiveStats::prewake_pauses`]).
    pub prewake_pauses: u64,
    /// The pre-wake margin in force, ns: how far before the shortest
    /// recent gap the plan's resume time is set (0: no pre-wake plan, or
    /// no learned idle policy).
    pub margin_ns: u64,
    /// State now.
    pub state: State,
}
