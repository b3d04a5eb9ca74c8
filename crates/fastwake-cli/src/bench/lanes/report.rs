//! `bench lanes`' rows, tables, ratios and JSON.

use super::arrangement::{Plan, ReadSends, Turn};
use fastwake::{Fail, Result};
use hdrhistogram::Histogram;
use std::time::Duration;

/// One arrangement, summed over its turns.
pub struct Row {
    pub name: String,
    pub connections: usize,
    pub bulk_size: usize,
    reads: Histogram<u64>,
    wall: Duration,
    cpu: Duration,
    bulk_bytes: u64,
    sent_bytes: u64,
    syscalls: u64,
    read_sends: ReadSends,
    others: Duration,
}

const MIB: f64 = (1 << 20) as f64;

impl Row {
    pub fn new(plan: &Plan, connections: usize) -> Row {
        Row {
            name: plan.name.clone(),
            connections,
            bulk_size: plan.bulk,
            reads: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
            wall: Duration::ZERO,
            cpu: Duration::ZERO,
            bulk_bytes: 0,
            sent_bytes: 0,
            syscalls: 0,
            read_sends: ReadSends::default(),
            others: Duration::ZERO,
        }
    }

    pub fn add(&mut self, t: &Turn) -> Result<()> {
        self.reads
            .add(&t.reads)
            .map_err(|e| Fail::invalid(format!("histogram: {e}")))?;
        self.wall += t.wall;
        self.cpu += t.cpu;
        self.bulk_bytes += t.bulk_bytes;
        self.sent_bytes += t.bulk_sent_bytes;
        self.syscalls += t.bulk_syscalls;
        self.read_sends += t.read_sends;
        self.others += t.others;
        Ok(())
    }

    /// Other processes' threads' run time per second measured, ms.
    pub fn others_ms_per_s(&self) -> f64 {
        self.others.as_secs_f64() * 1e3 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn reads(&self) -> u64 {
        self.reads.len()
    }

    pub fn iops(&self) -> f64 {
        self.reads() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Read latency at quantile `q`, µs.
    pub fn read_us(&self, q: f64) -> f64 {
        if self.reads() == 0 {
            return f64::NAN;
        }
        self.reads.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn write_mib_s(&self) -> f64 {
        self.bulk_bytes as f64 / MIB / self.wall.as_secs_f64().max(1e-9)
    }

    /// Process CPU µs per read and per bulk message.
    pub fn cpu_us_per_op(&self) -> f64 {
        let ops = self.reads() as f64 + self.bulk_bytes as f64 / self.bulk_size as f64;
        self.cpu.as_secs_f64() * 1e6 / ops.max(1.0)
    }

    /// The writer's syscalls per MiB it sent.
    pub fn syscalls_per_mib(&self) -> f64 {
        self.syscalls as f64 / (self.sent_bytes as f64 / MIB).max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        let f = |v: f64| {
            if v.is_finite() {
                serde_json::json!(v)
            } else {
                serde_json::Value::Null
            }
        };
        let per_read = |n: u64| n as f64 / self.reads().max(1) as f64;
        serde_json::json!({
            "arrangement": self.name,
            "connections": self.connections,
            "bulk_message_bytes": self.bulk_size,
            "measured_s": self.wall.as_secs_f64(),
            "reads": self.reads(),
            "read_iops": f(self.iops()),
            "read_p50_us": f(self.read_us(0.5)),
            "read_p99_us": f(self.read_us(0.99)),
            "read_p99_9_us": f(self.read_us(0.999)),
            "read_p99_99_us": f(self.read_us(0.9999)),
            "write_mib_s": f(self.write_mib_s()),
            "cpu_us_per_op": f(self.cpu_us_per_op()),
            "bulk_syscalls_per_mib": f(self.syscalls_per_mib()),
            "others_ms_per_s": f(self.others_ms_per_s()),
            "read_turn_waits_per_read": f(per_read(self.read_sends.turn_waits)),
            "read_handed_per_read": f(per_read(self.read_sends.handed)),
            // Null where the writer's sendmsgs share the readers' lane.
            "request_sendmsgs_per_read": if self.read_sends.with_bulk {
                serde_json::Value::Null
            } else {
                f(per_read(self.read_sends.request_sendmsgs))
            },
            "answer_sendmsgs_per_read": f(per_read(self.read_sends.answer_sendmsgs)),
        })
    }
}

/// The ratios the experiment is about: (label, value).
fn ratios(rows: &[Row]) -> Vec<(String, f64)> {
    let find = |n: &str| rows.iter().find(|r| r.name == n);
    let mut out = Vec::new();
    if let (Some(s), Some(l)) = (find("shared"), find("lanes")) {
        out.push(("lanes/shared read IOPS".into(), l.iops() / s.iops()));
        out.push((
            "lanes/shared read p99.99".into(),
            l.read_us(0.9999) / s.read_us(0.9999),
        ));
        out.push((
            "lanes/shared write throughput".into(),
            l.write_mib_s() / s.write_mib_s(),
        ));
    }
    if let (Some(p), Some(l)) = (find("per-reader"), find("lanes")) {
        out.push((
            "lanes/per-reader read p99".into(),
            l.read_us(0.99) / p.read_us(0.99),
        ));
        out.push((
            "lanes/per-reader connections".into(),
            l.connections as f64 / p.connections as f64,
        ));
    }
    out
}

/// Reads that one stall of the whole read CPU delays: every reader has a
/// read in flight. On this project's VM, with both CPUs busy, other
/// threads (the kernel's DAMON monitor, the VM's management agent) take a CPU
/// for 1-5 ms a few times a second (`fastwake doctor`'s cpu gaps names
/// them); each such stall delays every read in flight by that much.
const STALLS: u64 = 3;

/// When a row's p99.99 rests on fewer reads than [`STALLS`] stalls of
/// the read CPU delay (`readers` each), one line saying so and how many
/// measured seconds per arrangement would cover them; `None` otherwise.
/// The slowest 0.01 % of 140,000 reads (2 s at 70k IOPS) are 14: one
/// stall sets that p99.99 alone.
pub fn thin_tail(rows: &[Row], readers: usize) -> Option<String> {
    let need = STALLS * readers as u64;
    let thin = rows
        .iter()
        .filter(|r| r.reads() > 0 && r.reads() / 10_000 < need)
        .min_by_key(|r| r.reads())?;
    let iops = rows.iter().map(Row::iops).fold(f64::INFINITY, f64::min);
    let secs = (need as f64 * 10_000.0 / iops.max(1.0)).ceil();
    Some(format!(
        "fastwake bench lanes: p99.99 of {} rests on its slowest {} of {} reads; one stall of the read CPU (another thread running on it for a few ms, or a host taking the vCPU away) delays all {readers} reads in flight and can set it alone (`fastwake doctor` counts such stalls: cpu gaps): --seconds {secs} or more covers {STALLS} such stalls per arrangement",
        thin.name,
        thin.reads() / 10_000,
        thin.reads(),
    ))
}

pub fn print_tables(rows: &[Row], main: usize, note: &str) {
    println!("fastwake bench lanes — {note}");
    println!(
        "{:<12} {:>5} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>11} {:>9}",
        "arrangement",
        "conns",
        "read IOPS",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "p99.99 us",
        "write MiB/s",
        "cpu us/op",
        "syscalls/MiB",
        "others ms/s"
    );
    for r in &rows[..main] {
        println!(
            "{:<12} {:>5} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>11.0} {:>9.2} {:>12.1} {:>11.1}",
            r.name,
            r.connections,
            r.iops(),
            r.read_us(0.5),
            r.read_us(0.99),
            r.read_us(0.999),
            r.read_us(0.9999),
            r.write_mib_s(),
            r.cpu_us_per_op(),
            r.syscalls_per_mib(),
            r.others_ms_per_s()
        );
    }
    for (k, v) in ratios(&rows[..main]) {
        println!("  {k}: {v:.3}");
    }
    if rows.len() > main {
        println!();
        println!(
            "{:<64} {:>11} {:>12} {:>9}",
            "bulk lane alone", "write MiB/s", "syscalls/MiB", "cpu us/op"
        );
        for r in &rows[main..] {
            println!(
                "{:<64} {:>11.0} {:>12.1} {:>9.2}",
                r.name,
                r.write_mib_s(),
                r.syscalls_per_mib(),
                r.cpu_us_per_op()
            );
        }
    }
}

/// Print every row as one JSON array, each row with its `table`
/// (`arrangements` or `batching`), the ratios that concern it, and `run`
/// (version, host, date, command), as every bench's rows carry.
pub fn print_json(rows: &[Row], main: usize, note: &str) -> Result<()> {
    let run = serde_json::to_value(crate::meta::RunMeta::now())
        .map_err(|e| Fail::new(libc::EIO, e.to_string()))?;
    let ratios = ratios(&rows[..main]);
    let out: Vec<serde_json::Value> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut v = r.json();
            if let Some(o) = v.as_object_mut() {
                let table = if i < main { "arrangements" } else { "batching" };
                o.insert("table".into(), table.into());
                o.insert("placement".into(), note.into());
                if r.name == "lanes" {
                    for (k, x) in &ratios {
                        o.insert(ratio_key(k), serde_json::json!(x));
                    }
                }
                o.insert("run".into(), run.clone());
            }
            v
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&out).map_err(|e| Fail::new(libc::EIO, e.to_string()))?
    );
    Ok(())
}

/// `lanes/shared read p99.99` -> `ratio_vs_shared_read_p99_99`.
fn ratio_key(label: &str) -> String {
    let rest = label.trim_start_matches("lanes/");
    let (other, what) = rest.split_once(' ').unwrap_or((rest, ""));
    format!(
        "ratio_vs_{}_{}",
        other.replace('-', "_"),
        what.replace([' ', '.'], "_")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastwake::lanes::Class;

    fn row(reads: u64, secs: u64) -> Row {
        let plan = Plan {
            name: "lanes".into(),
            readers: Vec::new(),
            writer: 0,
            bulk: 1 << 20,
            bulk_class: Class::Bulk,
            configs: Vec::new(),
        };
        let mut r = Row::new(&plan, 2);
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        h.record_n(200_000, reads).unwrap();
        let t = Turn {
            reads: h,
            wall: Duration::from_secs(secs),
            cpu: Duration::ZERO,
            bulk_bytes: 0,
            bulk_sent_bytes: 0,
            bulk_syscalls: 0,
            read_sends: Default::default(),
            others: Duration::from_millis(3 * secs),
        };
        r.add(&t).unwrap();
        r
    }

    #[test]
    fn others_run_time_is_per_second_measured() {
        // 3 ms a second in each of two turns (2 s and 4 s).
        let mut r = row(140_000, 2);
        let again = row(140_000, 4);
        (r.others, r.wall) = (r.others + again.others, r.wall + again.wall);
        assert!(
            (r.others_ms_per_s() - 3.0).abs() < 1e-9,
            "{}",
            r.others_ms_per_s()
        );
        assert_eq!(r.json()["others_ms_per_s"], 3.0);
    }

    #[test]
    fn a_tail_one_stall_can_set_is_said() {
        // 2 s at 70k IOPS: the slowest 14 reads, fewer than one stall
        // of 16 readers delays.
        let w = thin_tail(&[row(140_000, 2)], 16).expect("a thin tail");
        assert!(w.contains("slowest 14 of 140000"), "{w}");
        assert!(w.contains("--seconds 7 "), "{w}");
        // 15 s: 1,050,000 reads, 105 in the tail, three stalls' worth.
        assert!(thin_tail(&[row(1_050_000, 15)], 16).is_none());
    }
}
