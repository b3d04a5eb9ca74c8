//! The second measurement: what a pre-wake's timed sleep costs here, in
//! lateness and in CPU. Adaptive mode's pre-wake
//! (`fastwake::adaptive::prewake`) sleeps on the source until shortly
//! before a predictable completion and spins from there; the margin it
//! must leave is the timer's lateness (it learns it), and each pre-wake
//! pays one timed sleep's CPU. Both are the host's: on a VM whose idle
//! vCPUs halt through the host they are tens of µs, and a pre-wake saves
//! that much less of polling's CPU. Measured the way a pre-wake sleeps:
//! on an idle channel, armed, with a deadline, timer slack 1 ns.

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
    /// Why there are no figures (`null` when there are).
    pub error: Option<String>,
}

/// Sorted lateness (ns) of `n` sleeps of `asked`, the CPU per sleep, and
/// the CPU slept on: `cpu` if given and the thread could be pinned there
/// (an affinity mask without it leaves the thread where it may run).
type Sleeps = (Vec<u64>, f64, Option<u32>);

fn timed_sleeps(n: usize, asked: Duration, cpu: Option<u32>) -> Result<Sleeps, String> {
    use fastwake::source::channel::{self, Config};
    use fastwake::source::{BlockReport, block_until_ready};
    let (tx, mut rx) = channel::channel(Config::default()).map_err(|e| e.to_string())?;
    let t = std::thread::spawn(move || {
        let cpu = cpu.filter(|&c| fastwake::cpu::pin(c).is_ok());
        let _slack = fastwake::cpu::FineTimerSlack::set();
        let mut late = Vec::with_capacity(n);
        let cpu0 = fastwake::cpu::thread_cpu_time();
        for _ in 0..n {
            let deadline = Instant::now() + asked;
            let mut rep = BlockReport::default();
            match block_until_ready(&mut rx, Some(deadline), &mut rep) {
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
        let used = (fastwake::cpu::thread_cpu_time() - cpu0).as_nanos() as f64 / n as f64;
        Ok((late, used, cpu))
    });
    let r = t.join().map_err(|_| "sleeping thread failed".to_string());
    // Kept open until the sleeps are done: a closed channel is ready.
    drop(tx);
    let (mut late, used, cpu) = r??;
    late.sort_unstable();
    Ok((late, used, cpu))
}

pub(super) fn timed_sleep() -> (TimedSleep, Finding) {
    let mut t = TimedSleep::default();
    let d = match timed_sleeps(SLEEPS, ASKED, (fastwake::cpu::online() >= 2).then_some(1)) {
        Ok((late, cpu_ns, cpu)) => {
            t.cpu = cpu;
            t.lateness = WakeStats::of(ASKED.as_secs_f64() * 1e6, &late);
            t.cpu_per_sleep_us = Some(cpu_ns / 1000.0);
            let l = t.lateness.as_ref().expect("SLEEPS > 0");
            format!(
                "late by p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs; {:.1} µs of CPU per sleep ({SLEEPS} sleeps of {} µs on an idle channel, timer slack 1 ns{}): adaptive's pre-wake leaves about this lateness as its margin before a predictable completion, and pays one such sleep per wait",
                l.p50_us,
                l.p90_us,
                l.p99_us,
                cpu_ns / 1000.0,
                ASKED.as_micros(),
                cpu.map_or(String::new(), |c| format!(", CPU {c}")),
            )
        }
        Err(e) => {
            t.error = Some(e.clone());
            format!("not measured: {e}")
        }
    };
    (t, check::TIMED_SLEEP.found(Level::Info, d))
}
