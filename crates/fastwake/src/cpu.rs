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
