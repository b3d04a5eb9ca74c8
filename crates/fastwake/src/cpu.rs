//! CPU placement: which CPU a thread is on, and pinning it.
//!
//! The current CPU is read on hot paths (a hybrid waiter must not spin against
//! a producer on its own CPU), so it must cost nanoseconds: glibc's
//! `sched_getcpu` reads the kernel-maintained rseq area, no syscall.

use crate::{Fail, Result};

/// The CPU the calling thread runs on right now (may change at any moment).
pub fn current() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c as u32)
}

/// Pin the calling thread to one CPU.
pub fn pin(cpu: u32) -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    if cpu as usize >= rustix::thread::CpuSet::MAX_CPU {
        return Err(Fail::invalid(format!("cpu {cpu} is out of range")));
    }
    set.set(cpu as usize);
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| Fail::os(&format!("pin to cpu {cpu}"), e))
}

/// Let the calling thread run anywhere it is allowed to.
pub fn unpin() -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for c in 0..online().max(1) {
        set.set(c as usize);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| Fail::os("unpin", e))
}

/// Number of CPUs this process may run on.
pub fn online() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// `CLOCK_MONOTONIC` in ns: one clock for every process on the host, so
/// a time stamped by a producer in another process can be subtracted from
/// the consumer's.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID).
///
/// `getrusage` reports ~0 for threads that never sleep, so spinning modes
/// must be accounted with this clock.
pub fn thread_cpu_time() -> std::time::Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The calling thread's scheduler statistics since it started, from
/// `/proc/thread-self/schedstat`: time on a CPU, time runnable but
/// waiting for one (the run-queue delay), and the times it was scheduled.
/// `None` where the kernel does not keep them (`CONFIG_SCHED_INFO`) or
/// /proc is not mounted. One `open`, `read` and `close`: cold path only.
pub fn thread_schedstat() -> Option<SchedStat> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    SchedStat::parse(&s)
}

/// One thread's scheduler statistics ([`thread_schedstat`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time on a CPU, ns.
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub delay_ns: u64,
    /// Times it was given a CPU.
    pub scheduled: u64,
}

impl SchedStat {
    /// The three fields of a `schedstat` file.
    pub fn parse(s: &str) -> Option<SchedStat> {
        let mut f = s.split_ascii_whitespace().map(|t| t.parse::<u64>().ok());
        Some(SchedStat {
            run_ns: f.next()??,
            delay_ns: f.next()??,
            scheduled: f.next()??,
        })
    }
}

/// While alive, the calling thread's timer slack is 1 ns; the slack it had
/// comes back on drop.
///
/// Why: a timed sleep (a futex, `poll` or `epoll` timeout) may end as late
/// as the thread's timer slack allows, 50 µs by default for a thread of
/// normal priority, so the kernel can batch timer interrupts. A pre-wake
/// ([`crate::adaptive::prewake`]) must wake within a few µs of the time it
/// asked for, and must not change the slack of the program's own sleeps
/// afterwards. Three prctl calls (~0.1 µs each) on a path that sleeps.
pub struct FineTimerSlack {
    old: libc::c_ulong,
}

impl FineTimerSlack {
    pub fn set() -> FineTimerSlack {
        // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the
        // calling thread's slack in ns (or -1 on an old kernel).
        let old = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK) };
        let old = if old > 0 {
            old as libc::c_ulong
        } else {
            // 0 would mean "the default" to PR_SET_TIMERSLACK; keep it so.
            0
        };
        // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this
        // thread's slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        FineTimerSlack { old }
    }
}

impl Drop for FineTimerSlack {
    fn drop(&mut self) {
        // SAFETY: as in `set`; `old` is what PR_GET_TIMERSLACK returned.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, self.old) };
    }
}
