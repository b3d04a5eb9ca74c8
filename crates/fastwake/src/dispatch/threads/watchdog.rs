//! The watchdog: does the dispatcher's job while the dispatcher is
//! polling but not getting the CPU.

use super::hub::{Hub, MODE_DEAD, MODE_SLEEPING};
use super::{lock, read, thread_clock};
use crate::dispatch::SchedPolicy;
use crate::dispatch::slot::{HANDED, WAITING};
use crate::sync::Ordering;
use std::time::Duration;

/// How often the watchdog looks at a polling dispatcher.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(1);

/// The watchdog: a normal-priority thread, allowed on every CPU, that does
/// the dispatcher's job when the dispatcher is polling but has not run for
/// a period (a `SCHED_IDLE` thread gets next to no CPU on a busy core). It
/// bounds how long a thread that went to sleep trusting the dispatcher can
/// be left waiting, without a timer on every sleep. It costs one wake-up per
/// period while the dispatcher polls, and nothing while the dispatcher
/// sleeps (it sleeps too) or is dead (it exits).
pub(super) fn watchdog(hub: &Hub) {
    // Not pinned with whoever started the dispatcher: it must be able to
    // run where the dispatcher cannot.
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut set = rustix::thread::CpuSet::new();
    for c in 0..n.min(rustix::thread::CpuSet::MAX_CPU) {
        set.set(c);
    }
    let _ = rustix::thread::sched_setaffinity(None, &set);
    *lock(&hub.wclock) = thread_clock();
    loop {
        let seq = hub.awake.load();
        match hub.mode.load(Ordering::SeqCst) {
            MODE_DEAD => return,
            MODE_SLEEPING => {
                // The dispatcher bumps `awake` when it leaves its idle
                // sleep or dies, so an idle core costs no wake-up here. A
                // FIFO dispatcher's short step-asides are SLEEPING too
                // without a bump: bounded for that policy only.
                let limit =
                    (hub.cfg.policy == SchedPolicy::Fifo).then_some(Duration::from_millis(100));
                hub.awake.wait_private(seq, limit);
                continue;
            }
            _ => {}
        }
        std::thread::sleep(WATCHDOG_PERIOD);
        if hub.heartbeat_age() > WATCHDOG_PERIOD {
            hub.rescue();
        }
    }
}

impl Hub {
    /// µs since the dispatcher last read its clock (it does every few
    /// hundred empty passes and after each hand-off).
    fn heartbeat_age(&self) -> Duration {
        let now = self.epoch.elapsed().as_micros() as u64;
        Duration::from_micros(now.saturating_sub(self.heartbeat.load(Ordering::Relaxed)))
    }

    /// The watchdog's pass, for a dispatcher that is not getting the CPU:
    /// hand off every waiting thread whose source is ready.
    fn rescue(&self) {
        let handles = read(&self.handles);
        let n = self
            .waitset
            .marked()
            .filter(|&i| {
                self.slots[i].state() == WAITING
                    && handles[i].as_ref().is_some_and(|p| p.ready())
                    && self.slots[i].hand(HANDED)
            })
            .count();
        self.rescued.fetch_add(n as u64, Ordering::Relaxed);
    }
}
