//! The pre-wake floor of a service-time scenario: the least CPU per
//! request that a pre-wake catching its completions spinning can spend on
//! this host, from figures measured in the same run, printed beside what
//! adaptive spent.
//!
//! A pre-wake (`fastwake::adaptive::prewake`) pays one timed sleep per
//! wait (its arm, the timer, two context switches) and spins from its
//! wake-up to the completion. To be spinning when the completions come,
//! it must be awake before the earliest of them (all but the shortest
//! 1/32 of the waits: adaptive places its timer there, and a completion
//! that comes while the thread sleeps costs a whole wake-up) however late
//! its timer fires (up to the lateness's p90, adaptive's margin). So per
//! request it spends at least:
//!
//! - one timed sleep's CPU, measured on the consumer's CPU between the
//!   windows (a few sleeps after each window, the way a pre-wake sleeps:
//!   `fastwake doctor`'s "timed sleep" check), so it sees the host as the
//!   modes did;
//! - the spin from the earliest completions to the typical one: the mean
//!   wait less its 1/32 quantile, both from polling's end-to-end times
//!   (a poller adds nothing to them);
//! - the spin its margin adds where the timer is not late: the lateness's
//!   p90 less its p50;
//! - the request's own CPU, which every mode pays: polling's CPU per
//!   request less its mean wait.
//!
//! Where this floor is above a CPU target, the target cannot be met on
//! that host by a pre-wake that catches its completions spinning. A plan
//! spends less only by letting completions wake the thread, at a whole
//! wake-up each: the early ones (its timer set later, or a margin below
//! the lateness's p90) or the late ones (its spin cut short).

use crate::bench::stats::Sample;
use std::time::Duration;

/// Timed sleeps after each measured window.
pub const SLEEPS_PER_WINDOW: usize = 16;

/// Timed sleeps the waiting thread took on its CPU between the windows:
/// each one's lateness, ns, and the thread's CPU over them.
#[derive(Debug, Clone, Default)]
pub struct TimerProbe {
    pub late: Vec<u64>,
    pub cpu: Duration,
}

/// Of the waits, the shortest this share is not waited for spinning (see
/// `fastwake::adaptive::prewake::STRAYS`: one stray per 32 recent waits).
const EARLIEST: f64 = 1.0 / fastwake::adaptive::prewake::STRAYS as f64;

/// The floor and what it is made of, µs per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    /// The consumer's CPU per timed sleep.
    pub sleep_cpu_us: f64,
    /// Timed sleeps measured.
    pub sleeps: usize,
    /// Their lateness, p50 and p90.
    pub late_p50_us: f64,
    pub late_p90_us: f64,
    /// Mean wait less its 1/32 quantile.
    pub spread_us: f64,
    /// Lateness p90 less p50.
    pub late_spread_us: f64,
    /// Polling's CPU per request less its mean wait (at least 0).
    pub request_us: f64,
    /// The sum: the least CPU per request of a pre-wake.
    pub cpu_us: f64,
    /// That over polling's CPU per request.
    pub x_poll: f64,
}

/// The floor from the timer probe, polling's end-to-end times and its CPU
/// per request (µs); `None` without sleeps or requests measured.
pub fn floor(probe: &TimerProbe, poll_e2e: &Sample, poll_cpu_us: f64) -> Option<Floor> {
    let n = probe.late.len();
    if n == 0 || poll_cpu_us <= 0.0 || poll_e2e.is_empty() {
        return None;
    }
    let mut late = probe.late.clone();
    late.sort_unstable();
    // The lateness as `fastwake doctor`'s timed-sleep line gives it.
    let l = crate::doctor::WakeStats::of(0.0, &late)?;
    let (late_p50_us, late_p90_us) = (l.p50_us, l.p90_us);
    let sleep_cpu_us = probe.cpu.as_secs_f64() * 1e6 / n as f64;
    let mean = poll_e2e.mean_us();
    let spread_us = (mean - poll_e2e.quantile_us(EARLIEST)).max(0.0);
    let late_spread_us = (late_p90_us - late_p50_us).max(0.0);
    let request_us = (poll_cpu_us - mean).max(0.0);
    let cpu_us = sleep_cpu_us + spread_us + late_spread_us + request_us;
    Some(Floor {
        sleep_cpu_us,
        sleeps: n,
        late_p50_us,
        late_p90_us,
        spread_us,
        late_spread_us,
        request_us,
        cpu_us,
        x_poll: cpu_us / poll_cpu_us,
    })
}

impl Floor {
    /// The `--json` keys, added to each row of the scenario.
    pub fn insert(&self, x: &mut serde_json::Map<String, serde_json::Value>) {
        x.insert("timed_sleep_cpu_us".into(), self.sleep_cpu_us.into());
        x.insert("timed_sleeps".into(), self.sleeps.into());
        x.insert("timer_late_p50_us".into(), self.late_p50_us.into());
        x.insert("timer_late_p90_us".into(), self.late_p90_us.into());
        x.insert("prewake_floor_spread_us".into(), self.spread_us.into());
        x.insert(
            "prewake_floor_late_spread_us".into(),
            self.late_spread_us.into(),
        );
        x.insert("prewake_floor_request_us".into(), self.request_us.into());
        x.insert("prewake_floor_cpu_us_per_req".into(), self.cpu_us.into());
        x.insert("prewake_floor_x_poll".into(), self.x_poll.into());
    }

    /// Back from a row's `--json` keys (`None` where they are not there).
    pub fn from_extra(x: &serde_json::Map<String, serde_json::Value>) -> Option<Floor> {
        let f = |k: &str| x.get(k).and_then(|v| v.as_f64());
        Some(Floor {
            sleep_cpu_us: f("timed_sleep_cpu_us")?,
            sleeps: x.get("timed_sleeps")?.as_u64()? as usize,
            late_p50_us: f("timer_late_p50_us")?,
            late_p90_us: f("timer_late_p90_us")?,
            spread_us: f("prewake_floor_spread_us")?,
            late_spread_us: f("prewake_floor_late_spread_us")?,
            request_us: f("prewake_floor_request_us")?,
            cpu_us: f("prewake_floor_cpu_us_per_req")?,
            x_poll: f("prewake_floor_x_poll")?,
        })
    }

    /// The table's line.
    pub fn line(&self, cpu: u32) -> String {
        format!(
            "  pre-wake floor here (spinning before all but the earliest 1/32 of the completions): {:.3}x poll's cpu/req ({:.1} us = a timed sleep's CPU {:.1} us ({} on CPU {cpu} between the windows, late p50 {:.1} us, p90 {:.1} us) + the spin from the earliest completions {:.1} us + the timer's lateness spread {:.1} us + the request's own {:.1} us)",
            self.x_poll,
            self.cpu_us,
            self.sleep_cpu_us,
            self.sleeps,
            self.late_p50_us,
            self.late_p90_us,
            self.spread_us,
            self.late_spread_us,
            self.request_us,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e2e(us: impl Iterator<Item = f64>) -> Sample {
        let mut s = Sample::new();
        for u in us {
            s.record_one_way(Duration::from_nanos((u * 1e3) as u64));
        }
        s
    }

    #[test]
    fn the_floor_adds_the_sleep_the_spread_the_margin_and_the_request() {
        // Waits 45-55 µs, uniform: mean 50, 1/32 quantile ~45.3.
        let poll = e2e((0..1000).map(|i| 45.0 + 10.0 * i as f64 / 1000.0));
        // 100 sleeps of 20 µs CPU, late 20 µs but every tenth 23 µs.
        let probe = TimerProbe {
            late: (0..100)
                .map(|i| if i % 10 == 9 { 23_000 } else { 20_000 })
                .collect(),
            cpu: Duration::from_micros(2_000),
        };
        let f = floor(&probe, &poll, 50.5).expect("a floor");
        assert!((f.sleep_cpu_us - 20.0).abs() < 1e-9, "{f:?}");
        assert_eq!(f.sleeps, 100);
        assert!((f.late_p50_us - 20.0).abs() < 0.01, "{f:?}");
        assert!((f.late_p90_us - 20.0).abs() < 0.01, "{f:?}");
        assert!((4.4..=5.0).contains(&f.spread_us), "{f:?}");
        assert!((0.4..=0.6).contains(&f.request_us), "{f:?}");
        let sum = f.sleep_cpu_us + f.spread_us + f.late_spread_us + f.request_us;
        assert!((f.cpu_us - sum).abs() < 1e-9);
        assert!((f.x_poll - f.cpu_us / 50.5).abs() < 1e-9);
        // A wider lateness raises the floor by its p90 - p50.
        let wide = TimerProbe {
            late: (0..100).map(|i| 15_000 + 100 * i).collect(),
            ..probe.clone()
        };
        let g = floor(&wide, &poll, 50.5).unwrap();
        assert!((g.late_spread_us - 4.0).abs() < 0.2, "{g:?}");
        assert!(g.cpu_us > f.cpu_us + 3.5, "{g:?} against {f:?}");
        let line = g.line(1);
        assert!(line.contains("100 on CPU 1"), "{line}");
        // The JSON keys give the same floor back.
        let mut x = serde_json::Map::new();
        g.insert(&mut x);
        assert_eq!(Floor::from_extra(&x), Some(g));
        x.remove("timed_sleeps");
        assert_eq!(Floor::from_extra(&x), None);
    }

    #[test]
    fn no_sleeps_or_no_requests_give_no_floor() {
        let poll = e2e((0..10).map(|_| 50.0));
        let none = TimerProbe {
            late: vec![],
            cpu: Duration::ZERO,
        };
        assert_eq!(floor(&none, &poll, 50.0), None);
        let probe = TimerProbe {
            late: vec![20_000],
            cpu: Duration::from_micros(20),
        };
        assert_eq!(floor(&probe, &Sample::new(), 50.0), None);
        assert_eq!(floor(&probe, &poll, 0.0), None);
    }
}
