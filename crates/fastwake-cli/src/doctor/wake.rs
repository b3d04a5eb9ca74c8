//! The one measurement: how long a thread asleep on a channel takes to
//! wake up, after a short and after a long idle.

use super::finding::*;
use serde::Serialize;

/// One wake-up series.
#[derive(Serialize, Debug, Clone)]
pub struct WakeStats {
    /// Idle time before each wake-up (µs).
    pub idle_us: f64,
    /// Wake-ups measured (sleeps of the consumer).
    pub sleeps: usize,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl WakeStats {
    /// From sorted wake-ups in ns.
    pub(crate) fn of(idle_us: f64, sorted_ns: &[u64]) -> Option<Self> {
        let n = sorted_ns.len();
        if n == 0 {
            return None;
        }
        let q = |p: f64| sorted_ns[((n - 1) as f64 * p).round() as usize] as f64 / 1000.0;
        Some(WakeStats {
            idle_us,
            sleeps: n,
            min_us: sorted_ns[0] as f64 / 1000.0,
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            max_us: sorted_ns[n - 1] as f64 / 1000.0,
            // Whole ns, like the others.
            mean_us: (sorted_ns.iter().sum::<u64>() / n as u64) as f64 / 1000.0,
        })
    }
}

/// The wake-up measurement.
#[derive(Serialize, Debug, Clone, Default)]
pub struct WakeUp {
    pub producer_cpu: Option<u32>,
    pub consumer_cpu: Option<u32>,
    pub after_20us_idle: Option<WakeStats>,
    pub after_2ms_idle: Option<WakeStats>,
    /// Why a series has no figures (`null` when both have).
    pub error: Option<String>,
}

/// Measure what a sleeping waiter pays to be woken here: a producer sends
/// messages to a consumer asleep on a channel, `gap` apart, and the
/// consumer times ring to running (the channel dates its rings). Returns
/// the sorted wake-ups, or why there are none. Why two gaps: after a short
/// idle (20 µs, a request/response turn) a halt-polling vCPU is still
/// polling; after a long one (2 ms) it has halted, whatever the setting.
pub(super) fn wake_ups(gap: std::time::Duration, n: usize) -> Result<Vec<u64>, String> {
    use fastwake::source::channel::{self, Config};
    use fastwake::source::{BlockReport, block_until_ready};
    let (mut tx, mut rx) = channel::channel(Config::default()).map_err(|e| e.to_string())?;
    let two = fastwake::cpu::online() >= 2;
    let prod = std::thread::spawn(move || {
        if two {
            let _ = fastwake::cpu::pin(0);
        }
        for i in 0..n as u64 {
            // Short gaps are spun (a sleep that short would oversleep).
            if gap < std::time::Duration::from_micros(200) {
                let until = std::time::Instant::now() + gap;
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::sleep(gap);
            }
            if tx.send(i, b"").is_err() {
                return;
            }
        }
    });
    let cons = std::thread::spawn(move || {
        if two {
            let _ = fastwake::cpu::pin(1);
        }
        let mut wakes = Vec::with_capacity(n);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for _ in 0..n {
            let mut rep = BlockReport::default();
            match block_until_ready(&mut rx, Some(deadline), &mut rep) {
                Ok(Some(_)) => wakes.extend(rep.wake_ns),
                _ => break,
            }
        }
        wakes
    });
    let _ = prod.join();
    let mut w = cons
        .join()
        .map_err(|_| "consumer thread failed".to_string())?;
    if w.len() < n / 2 {
        return Err(format!("{} of {n} waits slept", w.len()));
    }
    w.sort_unstable();
    Ok(w)
}

pub(super) fn wake_up() -> (WakeUp, Finding) {
    let two = fastwake::cpu::online() >= 2;
    let short = wake_ups(std::time::Duration::from_micros(20), 200);
    let long = wake_ups(std::time::Duration::from_millis(2), 100);
    let mut w = WakeUp {
        producer_cpu: two.then_some(0),
        consumer_cpu: two.then_some(1),
        ..Default::default()
    };
    // Each series stands on its own: one that did not sleep enough (a
    // loaded host: the consumer found messages waiting) does not hide the
    // other.
    let mut errors = Vec::new();
    let mut said = Vec::new();
    for (idle, label, r, slot) in [
        (20.0, "20 µs", short, &mut w.after_20us_idle),
        (2000.0, "2 ms", long, &mut w.after_2ms_idle),
    ] {
        match r {
            Ok(v) => {
                *slot = WakeStats::of(idle, &v);
                let p50 = slot.as_ref().map_or(0.0, |x| x.p50_us);
                said.push(format!(
                    "{p50:.1} µs after {label} idle ({} sleeps)",
                    v.len()
                ));
            }
            Err(e) => {
                said.push(format!("not measured after {label} idle: {e}"));
                errors.push(format!("after {label} idle: {e}"));
            }
        }
    }
    if !errors.is_empty() {
        w.error = Some(errors.join("; "));
    }
    let d = format!(
        "p50 {}: ring to running of a thread asleep on a channel{}; hybrid/adaptive avoid it for waits shorter than their spin",
        said.join(", "),
        if two {
            ", producer on CPU 0, consumer on CPU 1"
        } else {
            ""
        },
    );
    (w, check::WAKE_UP_LATENCY.found(Level::Info, d))
}
