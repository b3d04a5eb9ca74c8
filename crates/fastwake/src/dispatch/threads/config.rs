//! How a dispatcher runs: [`Config`] and its defaults.

use crate::dispatch::SchedPolicy;
use std::time::Duration;

/// How a dispatcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The core whose waiting threads it serves: threads that wait in
    /// dispatch mode on this CPU register with it.
    pub cpu: u32,
    /// Where the dispatcher thread itself runs; `None` = `cpu` (the fast
    /// case: a same-core wake-up).
    pub run_on: Option<u32>,
    /// Scheduling policy of the dispatcher thread.
    pub policy: SchedPolicy,
    /// Sleep after this long without a hand-off; `None` = never. With
    /// [`Config::learn_idle`], the most the learned threshold may be.
    pub idle_after: Option<Duration>,
    /// Learn the idle threshold instead of fixing it: a polling
    /// dispatcher is a spinning waiter whose wait is "the next hand-off",
    /// so the same controller as adaptive waits ([`crate::adaptive`]: cost
    /// model, catch limit, CPU cap) picks how long it keeps polling after
    /// a hand-off before it hands its waiters back to interrupt mode and
    /// sleeps. Why: a fixed 2 ms threshold keeps polling through every gap
    /// of a stream of fewer than 500 waits per second (86 % of a core for
    /// a 1k/s Poisson stream, measured); the learned one stops where the
    /// wake-ups it saves are not worth the CPU. `None`: fixed.
    pub learn_idle: Option<crate::adaptive::Config>,
    /// Most threads it can serve at once.
    pub capacity: usize,
    /// Use readiness summaries where sources support them, once more than
    /// `summary_above` threads are registered.
    pub summary: bool,
    /// See `summary`.
    pub summary_above: usize,
    /// Serve sources that offer ready notices (the channel, shared-queue
    /// inboxes, caller-owned rings made with notices) through the
    /// dispatcher's notice ring instead of peeking them every pass: the
    /// cost of a pass then does not grow with the number of idle sources.
    /// Off only to measure what that saves.
    pub notices: bool,
    /// Serve sources whose readiness only the kernel knows (sockets,
    /// [`crate::source::Peek::kernel_ready_fd`]) from one epoll set of the
    /// dispatcher's: one `epoll_wait` a pass instead of one `poll` per
    /// waiting socket. Off only to measure what that saves.
    pub kernel_list: bool,
    /// Relay: a thread about to wait first peeks the core's other waiting
    /// sources (and its own) for up to this long, and hands off to the
    /// owner of the first ready one itself; `None` = never. See
    /// the `dispatch::waiter` module for why this halves the switches per hand-off.
    pub relay: Option<Duration>,
    /// A waiter alone on this core (the only one registered) relays for
    /// its mode's spin budget (hybrid's 50 µs, or the ceiling) instead of
    /// `relay`: the dispatcher would only poll the same source on the same
    /// core, and its hand-off adds a same-core wake-up. Never with
    /// `learn_idle`, whose dispatcher decides when the core is polled.
    /// Off: every waiter relays for `relay` only (to measure the hand-off
    /// path itself).
    pub lone_spin: bool,
}

/// Default relay spin: about the time a reply takes to come back as the
/// next request over a fast loopback path (one cross-core round trip plus
/// the client's turn-around), so a chain of requests keeps handing off
/// without the dispatcher; short enough to cost little when nothing comes.
pub const DEFAULT_RELAY: Duration = Duration::from_micros(5);

impl Config {
    /// Defaults for `cpu`: same core, `SCHED_IDLE`, sleep after 2 ms idle,
    /// 1024 threads, notices, summaries and the kernel ready list on,
    /// relay 5 µs, a lone waiter's spin on.
    pub fn new(cpu: u32) -> Config {
        Config {
            cpu,
            run_on: None,
            policy: SchedPolicy::Idle,
            idle_after: Some(crate::dispatch::DEFAULT_IDLE_AFTER),
            capacity: 1024,
            summary: true,
            summary_above: crate::dispatch::watch::SUMMARY_ABOVE,
            notices: true,
            kernel_list: true,
            relay: Some(DEFAULT_RELAY),
            lone_spin: true,
            learn_idle: None,
        }
    }
}
