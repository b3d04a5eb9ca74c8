//! Latency statistics and the perftest-style report.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Round-trip samples of one case.
pub struct Sample {
    /// One-way latency in ns (RTT / 2), like perftest's `*_lat`.
    hist: Histogram<u64>,
}

impl Sample {
    pub fn new() -> Self {
        Sample {
            // 1 ns .. 100 s at 3 significant digits: sub-µs rows keep ns
            // resolution, stalls of seconds are still recorded.
            hist: Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds"),
        }
    }

    pub fn record_rtt(&mut self, rtt: Duration) {
        let one_way = (rtt.as_nanos() as u64 / 2).max(1);
        self.hist.saturating_record(one_way);
    }

    pub fn record_one_way(&mut self, d: Duration) {
        self.hist.saturating_record((d.as_nanos() as u64).max(1));
    }

    /// Median one-way latency in µs (0 with no samples).
    pub fn p50_us(&self) -> f64 {
        us(self.hist.value_at_quantile(0.5))
    }

    /// The `q` quantile in µs (0 with no samples).
    pub fn quantile_us(&self, q: f64) -> f64 {
        us(self.hist.value_at_quantile(q))
    }

    /// Mean in µs (0 with no samples).
    pub fn mean_us(&self) -> f64 {
        self.hist.mean() / 1000.0
    }

    /// No samples recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Fold `other`'s samples into this one.
    pub fn merge(&mut self, other: &Sample) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.hist.add(&other.hist);
    }
}

/// One report row: the JSON keys are the public contract of `--json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub source: String,
    pub mode: String,
    pub placement: String,
    pub iters: u64,
    pub size: usize,
    /// One-way latency statistics, µs.
    pub t_min: f64,
    pub t_max: f64,
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p999: f64,
    /// CPU µs per operation (one round trip), both ends together.
    pub cpu_us_per_op: f64,
    /// CPU µs per operation of the ping end (the one that times).
    pub cpu_us_per_op_ping: f64,
    /// CPU µs per operation of the pong end.
    pub cpu_us_per_op_pong: f64,
    /// Extra per-benchmark fields (flattened into the JSON object).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl Row {
    pub fn from_sample(
        source: &str,
        mode: &str,
        placement: &str,
        size: usize,
        s: &Sample,
        ping_cpu: Duration,
        pong_cpu: Duration,
    ) -> Row {
        let h = &s.hist;
        let n = h.len().max(1) as f64;
        let ping = ping_cpu.as_nanos() as f64 / 1000.0 / n;
        let pong = pong_cpu.as_nanos() as f64 / 1000.0 / n;
        Row {
            source: source.into(),
            mode: mode.into(),
            placement: placement.into(),
            iters: h.len(),
            size,
            t_min: us(h.min()),
            t_max: us(h.max()),
            t_typical: us(h.value_at_quantile(0.5)),
            t_avg: h.mean() / 1000.0,
            t_stdev: h.stdev() / 1000.0,
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            cpu_us_per_op: ping + pong,
            cpu_us_per_op_ping: ping,
            cpu_us_per_op_pong: pong,
            extra: serde_json::Map::new(),
        }
    }
}

/// A benchmark's title with the version after the name, as perftest's
/// banner carries its version: "fastwake 0.1.0 bench pingpong — …".
pub fn banner(title: &str) -> String {
    match title.strip_prefix("fastwake ") {
        Some(rest) => format!("fastwake {} {rest}", env!("CARGO_PKG_VERSION")),
        None => title.to_string(),
    }
}

/// Print rows as a perftest-like table.
pub fn print_table(title: &str, rows: &[Row]) {
    println!("{}", banner(title));
    let line = "-".repeat(150);
    println!("{line}");
    println!(
        " {:<10} {:<18} {:<10} {:>7} {:>11} {:>10} {:>10} {:>14} {:>10} {:>12} {:>9} {:>11} {:>9} {:>13}",
        "source",
        "mode",
        "place",
        "#bytes",
        "#iterations",
        "t_min[us]",
        "t_max[us]",
        "t_typical[us]",
        "t_avg[us]",
        "t_stdev[us]",
        "99%[us]",
        "99.9%[us]",
        "cpu/op[us]",
        "(ping+pong)"
    );
    for r in rows {
        println!(
            " {:<10} {:<18} {:<10} {:>7} {:>11} {:>10.3} {:>10.3} {:>14.3} {:>10.3} {:>12.3} {:>9.3} {:>11.3} {:>9.3} {:>6.3}+{:<6.3}",
            r.source,
            r.mode,
            r.placement,
            r.size,
            r.iters,
            r.t_min,
            r.t_max,
            r.t_typical,
            r.t_avg,
            r.t_stdev,
            r.p99,
            r.p999,
            r.cpu_us_per_op,
            r.cpu_us_per_op_ping,
            r.cpu_us_per_op_pong
        );
    }
    println!("{line}");
}

/// Print rows as a JSON array, one object per row.
/// Each row carries `run` (version, host, date, command: see
/// [`crate::meta::RunMeta`]), so a row copied out of the file still says
/// where it was measured.
pub fn print_json(rows: &[Row]) {
    let run = serde_json::to_value(crate::meta::RunMeta::now()).expect("meta serialises");
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).expect("rows serialise");
            if let Some(o) = v.as_object_mut() {
                o.insert("run".into(), run.clone());
            }
            v
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&rows).expect("rows serialise")
    );
}
