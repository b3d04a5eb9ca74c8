//! The second measurement: what a pre-wake's timed sleep costs here, in
//! lateness and in CPU. Adaptive mode's pre-wake
//! (`fastwake::adaptive::prewake`) sleeps on the source until shortly
//! before a predictable completion and spins from there; the margin it
//! must leave is the timer's lateness (it learns it), and each pre-wake
//! pays one timed sleep's CPU. Both are the host's: on a VM whose idle
//! vCPUs halt through the host they are tens of µs, and a pre-wake saves
//! that much less of polling's CPU. Measured the way a pre-wake sleeps:
//! on an idle channel, armed, with a deadline, timer slack 1 ns.
//!
//! Beside it, what one reprogram of the CPU's timer costs: a timer that
//! becomes the CPU's next event is written to the hardware when armed and
//! again when cancelled, one past the next tick is not. Where a hypervisor
//! traps that write (a KVM guest's TSC-deadline timer) it is µs, and it is
//! most of a timed sleep's CPU: measured apart so a user can tell the two.

use super::finding::*;
use super::wake::WakeStats;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Sleeps measured.
const SLEEPS: usize = 200;
/// Length of each (a pre-wake's sleep before a 50-200 µs wait).
const ASKED: Duration = Duration::from_micros(50);

/// The timed-sleep measurement.
#[derive(Serialize, Debug, Clone, Default)]
pub struct TimedSleep {
    /// CPU of the sleeping thread (`null`: one CPU only).
    pub cpu: Option<u32>,
    /// Woke this long after the time asked (µs); `idle_us` is the sleep.
    pub lateness: Option<WakeStats>,
    /// The sleeping thread's CPU time per sleep (µs): the arm, the timer,
    /// both context switches.
    pub cpu_per_sleep_us: Option<f64>,
    /// CPU of one reprogram of the CPU's timer (µs): half the difference
    /// between arming and cancelling a timer 50 µs ahead and one 1 s ahead.
    pub reprogram_us: Option<f64>,
    /// Why there are no figures (`null` when there are).
    pub error: Option<String>,
}

/// Arm-and-cancel pairs timed per distance.
const REPROGRAMS: u32 = 2000;

/// CPU per arm-and-cancel of a timerfd `ahead` of now, ns, on this thread.
fn arm_and_cancel_ns(fd: &rustix::fd::OwnedFd, ahead: Duration) -> Result<f64, String> {
    use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
    let off = Itimerspec {
        it_interval: Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
    };
    let c0 = fastwake::cpu::thread_cpu_time();
    for _ in 0..REPROGRAMS {
        // Relative: the clock read an absolute time would need is no part
        // of what is measured.
        let on = Itimerspec {
            it_interval: off.it_interval,
            it_value: Timespec {
                tv_sec: ahead.as_secs() as _,
                tv_nsec: ahead.subsec_nanos() as _,
            },
        };
        timerfd_settime(fd, TimerfdTimerFlags::empty(), &on).map_err(|e| e.to_string())?;
        timerfd_settime(fd, TimerfdTimerFlags::empty(), &off).map_err(|e| e.to_string())?;
    }
    Ok((fastwake::cpu::thread_cpu_time() - c0).as_nanos() as f64 / REPROGRAMS as f64)
}

/// CPU of one timer reprogram, ns (see [`TimedSleep::reprogram_us`]), on
/// the calling thread. The near and far runs alternate, twice, and each
/// distance keeps its cheaper run: a preemption inflates one run only.
fn reprogram_ns() -> Result<f64, String> {
    use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
    let fd = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)
        .map_err(|e| e.to_string())?;
    let (mut near, mut far) = (f64::MAX, f64::MAX);
    for _ in 0..2 {
        near = near.min(arm_and_cancel_ns(&fd, Duration::from_micros(50))?);
        far = far.min(arm_and_cancel_ns(&fd, Duration::from_secs(1))?);
    }
    Ok(((near - far) / 2.0).max(0.0))
}

/// Sorted lateness (ns) of `n` sleeps of `asked`, the CPU per sleep, the
/// CPU slept on: `cpu` if given and the thread could be pinned there (an
/// affinity mask without it leaves the thread where it may run), and the
/// CPU of one timer reprogram there (ns).
type Sleeps = (Vec<u64>, f64, Option<u32>, f64);

fn timed_sleeps(n: usize, asked: Duration, cpu: Option<u32>) -> Result<Sleeps, String> {
    use fastwake::source::channel::{self, Config};
    let (tx, mut rx) = channel::channel(Config::default()).map_err(|e| e.to_string())?;
    let t = std::thread::spawn(move || {
        let cpu = cpu.filter(|&c| fastwake::cpu::pin(c).is_ok());
        let mut late = Vec::with_capacity(n);
        let used = sleep_on_idle(&mut rx, n, asked, &mut late)?;
        Ok::<_, String>((
            late,
            used.as_nanos() as f64 / n as f64,
            cpu,
            reprogram_ns()?,
        ))
    });
    let r = t.join().map_err(|_| "sleeping thread failed".to_string());
    // Kept open until the sleeps are done: a closed channel is ready.
    drop(tx);
    let (mut late, used, cpu, reprogram) = r??;
    late.sort_unstable();
    Ok((late, used, cpu, reprogram))
}

/// `n` timed sleeps of `asked` on the calling thread, the way a pre-wake
/// sleeps: on `rx` (a channel nobody sends on, whose sender the caller
/// keeps open: a closed channel is ready), armed, with a deadline, timer
/// slack 1 ns. Appends each one's lateness (ns: woke this long after the
/// deadline) to `late` and returns the thread's CPU time over all of them.
/// Shared with `bench load`, which measures the same between its windows.
pub(crate) fn sleep_on_idle(
    rx: &mut fastwake::source::channel::Receiver,
    n: usize,
    asked: Duration,
    late: &mut Vec<u64>,
) -> Result<Duration, String> {
    use fastwake::source::{BlockReport, block_until_ready};
    let _slack = fastwake::cpu::FineTimerSlack::set();
    let cpu0 = fastwake::cpu::thread_cpu_time();
    for _ in 0..n {
        let deadline = Instant::now() + asked;
        let mut rep = BlockReport::default();
        match block_until_ready(rx, Some(deadline), &mut rep) {
            Ok(None) => {}
            Ok(Some(_)) => return Err("a completion on an idle channel".to_string()),
            Err(e) => return Err(e.to_string()),
        }
        late.push(
            Instant::now()
                .saturating_duration_since(deadline)
                .as_nanos() as u64,
        );
    }
    Ok(fastwake::cpu::thread_cpu_time().saturating_sub(cpu0))
}

pub(super) fn timed_sleep() -> (TimedSleep, Finding) {
    let mut t = TimedSleep::default();
    let d = match timed_sleeps(SLEEPS, ASKED, (fastwake::cpu::online() >= 2).then_some(1)) {
        Ok((late, cpu_ns, cpu, reprogram_ns)) => {
            t.cpu = cpu;
            t.reprogram_us = Some(reprogram_ns / 1000.0);
            t.lateness = WakeStats::of(ASKED.as_secs_f64() * 1e6, &late);
            t.cpu_per_sleep_us = Some(cpu_ns / 1000.0);
            let l = t.lateness.as_ref().expect("SLEEPS > 0");
            format!(
                "late by p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs; {:.1} µs of CPU per sleep ({SLEEPS} sleeps of {} µs on an idle channel, timer slack 1 ns{}); one reprogram of the CPU's timer (each sleep arms one, and cancels it when the source ends the sleep first) costs {:.2} µs of it: adaptive's pre-wake leaves about this lateness as its margin before a predictable completion, and pays one such sleep per wait",
                l.p50_us,
                l.p90_us,
                l.p99_us,
                cpu_ns / 1000.0,
                ASKED.as_micros(),
                cpu.map_or(String::new(), |c| format!(", CPU {c}")),
                reprogram_ns / 1000.0,
            )
        }
        Err(e) => {
            t.error = Some(e.clone());
            format!("not measured: {e}")
        }
    };
    (t, check::TIMED_SLEEP.found(Level::Info, d))
}
