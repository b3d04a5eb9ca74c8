//! What `bench share` prints besides the perftest table: rates and
//! counters, the verdict ratios, and the `--sweep` table.

use super::futex_ring::futex_ring;
use super::layout::Layout;
use super::mode::Mode;
use crate::bench::stats::Row;
use fastwake::Result;

pub(super) fn print_rates(rows: &[Row]) {
    println!(
        " {:<16} {:>6} {:>6} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}",
        "mode",
        "conns",
        "cores",
        "rtt/s",
        "handoffs",
        "relays",
        "fallbacks",
        "notices",
        "scan_found",
        "fair_yields"
    );
    let get = |r: &Row, k: &str| r.extra.get(k).map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        println!(
            " {:<16} {:>6} {:>6} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}",
            r.mode,
            get(r, "conns"),
            get(r, "cores"),
            get(r, "rtt_per_s"),
            get(r, "handoffs"),
            get(r, "relays"),
            get(r, "dispatch_fallbacks"),
            get(r, "notices"),
            get(r, "scan_found"),
            get(r, "fair_yields")
        );
    }
}

/// `rows` with each mode's round trips per second per server core, and
/// the scaling against the same mode on one core (`base`, measured in the
/// same run with one client and N/K connections): per-core rate over the
/// one core's rate, 1.0 for linear.
pub(super) fn with_scaling(mut rows: Vec<Row>, base: &[Row], cores: usize) -> Vec<Row> {
    let rate = |r: &Row| r.extra.get("rtt_per_s").and_then(|v| v.as_f64());
    for r in rows.iter_mut() {
        let Some(k) = rate(r) else { continue };
        let per_core = k / cores as f64;
        r.extra
            .insert("rtt_per_s_per_core".into(), per_core.round().into());
        if let Some(one) = base.iter().find(|b| b.mode == r.mode).and_then(rate)
            && one > 0.0
        {
            r.extra
                .insert("rtt_per_s_one_core".into(), one.round().into());
            r.extra.insert(
                "scaling".into(),
                ((per_core / one * 1000.0).round() / 1000.0).into(),
            );
        }
    }
    rows
}

/// The scaling table (see [`with_scaling`]).
pub(super) fn print_scaling(rows: &[Row], cores: usize) {
    println!(
        " {:<16} {:>14} {:>14} {:>14} {:>10}",
        "mode", "rtt/s", "rtt/s per core", "rtt/s 1 core", "scaling"
    );
    let get = |r: &Row, k: &str| r.extra.get(k).map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        println!(
            " {:<16} {:>14} {:>14} {:>14} {:>10}",
            r.mode,
            get(r, "rtt_per_s"),
            get(r, "rtt_per_s_per_core"),
            get(r, "rtt_per_s_one_core"),
            get(r, "scaling"),
        );
    }
    println!(
        " scaling = (rtt/s on {cores} cores / {cores}) / rtt/s on 1 core with 1 client and 1/{cores} of the connections, measured after the main run; 1.0 = linear"
    );
}

/// The verdict ratios, from this run's p50s, and the kernel's floor for
/// waking threads on one core.
pub(super) fn print_ratios(rows: &[Row], layout: &Layout, conns: usize) -> Result<()> {
    let p50 = |m: &str| rows.iter().find(|r| r.mode == m).map(|r| r.t_typical);
    let rounds = |m: &str| -> Vec<f64> {
        rows.iter()
            .find(|r| r.mode == m)
            .and_then(|r| r.extra.get("round_p50"))
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    let line = |a: &str, b: &str| {
        if let (Some(x), Some(y)) = (p50(a), p50(b))
            && y > 0.0
        {
            print!(" p50 {a} / {b} = {:.3} / {:.3} = {:.2}", x, y, x / y);
            let mut per: Vec<f64> = rounds(a)
                .iter()
                .zip(rounds(b))
                .filter(|(_, d)| *d > 0.0)
                .map(|(n, d)| n / d)
                .collect();
            if per.len() >= 2 {
                per.sort_by(f64::total_cmp);
                print!(
                    "  (per round, {} rounds: median {:.2}, range {:.2}-{:.2})",
                    per.len(),
                    per[per.len() / 2],
                    per[0],
                    per[per.len() - 1]
                );
            }
            println!();
        }
    };
    line("tasks", "reference");
    line("tasks", "evloop");
    // The floor for rotating connections, and what is left above it.
    line("oracle", "reference");
    line("tasks", "oracle");
    line("evloop", "oracle");
    line("tasks", "interrupt");
    line("tasks", "tasks:noprefetch");
    line("threads", "interrupt");
    line("threads", "threads:norelay");
    if p50("threads").is_some() && conns >= 2 {
        // What any design that wakes one kernel thread per request pays on
        // this host: the same-core futex hand-off between `conns` threads.
        let cpu = layout.server_cpus[0];
        let hop = futex_ring(conns.min(64), cpu, 20_000)?;
        println!(
            " kernel reference: a futex hand-off in a ring of {} threads on CPU {cpu} takes {:.3} µs (median of 3 rings); threads pays one per round trip, i.e. ~{:.3} µs of one-way latency",
            conns.min(64),
            hop.as_secs_f64() * 1e6,
            hop.as_secs_f64() * 1e6 / 2.0
        );
    }
    Ok(())
}

/// The `--sweep` table: one line per number of connections, one column per
/// mode.
pub(super) fn print_sweep(title: &str, modes: &[Mode], all: &[(usize, Vec<Row>)]) {
    println!("{}", crate::bench::stats::banner(title));
    let mut head = format!(" {:>7}", "sources");
    for m in modes {
        head += &format!(" {:>22}", format!("{} p50/p99", m.label()));
    }
    println!("{head}");
    let count = |r: &Row, k: &str| r.extra.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (mut notices, mut found, mut late) = (0, 0, 0);
    for (conns, rows) in all {
        let mut line = format!(" {:>7}", conns);
        for r in rows {
            line += &format!(" {:>22}", format!("{:.3} / {:.3}", r.t_typical, r.p99));
            notices += count(r, "notices");
            found += count(r, "scan_found");
            late += count(r, "late_notices");
        }
        println!("{line}");
    }
    // The safety net of the ready notices: every wait it found ready had
    // lost its notice.
    println!(
        " over the whole sweep: {notices} hand-offs found through ready notices; the safety-net scan found {found} waits whose notice had not come, of which {late} came later (late, not lost)"
    );
}

/// The keys of a socket row's kernel ready list counters, with their
/// column heads.
const KERNEL_KEYS: [(&str, &str); 7] = [
    ("epoll_waits", "epoll_waits"),
    ("kernel_found", "found"),
    ("peeks", "peeks"),
    ("relay_epoll_waits", "relay_waits"),
    ("relay_found", "relay_found"),
    ("relay_peeks", "relay_peeks"),
    ("stale", "stale"),
];

fn count(r: &Row, k: &str) -> u64 {
    r.extra.get(k).and_then(|v| v.as_u64()).unwrap_or(0)
}

/// Sockets: what the dispatchers or task runtimes (epoll_waits on their
/// set, waits it found, one-by-one peeks) and the relaying threads asked
/// the kernel, in all and per round trip (`round_trips` per mode, warm-up
/// included).
pub(super) fn print_kernel_lists(rows: &[Row], round_trips: u64) {
    println!(
        " kernel ready list (one epoll set per dispatcher or runtime), whole slices (set-up and teardown included): totals, and per round trip of the {round_trips} each mode made"
    );
    let mut head = format!(" {:<16}", "mode");
    for (_, h) in KERNEL_KEYS {
        head += &format!(" {:>20}", h);
    }
    println!("{head}");
    let per = round_trips.max(1) as f64;
    for r in rows {
        let mut line = format!(" {:<16}", r.mode);
        for (k, _) in KERNEL_KEYS {
            let n = count(r, k);
            line += &format!(" {:>20}", format!("{n} ({:.2})", n as f64 / per));
        }
        println!("{line}");
    }
}

/// Sockets, after the `--sweep` table: per round trip, the `epoll_wait`
/// calls and the one-by-one peeks of each mode's dispatchers or runtimes
/// (relays' added), and the waits their set found.
pub(super) fn print_sweep_kernel_lists(
    modes: &[Mode],
    all: &[(usize, Vec<Row>)],
    round_trips: u64,
) {
    println!(
        " per round trip ({round_trips} a mode; whole slices, set-up and teardown included): epoll_wait calls / one-by-one socket peeks / waits found on the kernel ready list, dispatcher or runtime and relays together"
    );
    let mut head = format!(" {:>7}", "sources");
    for m in modes {
        head += &format!(" {:>22}", m.label());
    }
    println!("{head}");
    let per = round_trips.max(1) as f64;
    for (conns, rows) in all {
        let mut line = format!(" {:>7}", conns);
        for r in rows {
            let waits = count(r, "epoll_waits") + count(r, "relay_epoll_waits");
            let peeks = count(r, "peeks") + count(r, "relay_peeks");
            let found = count(r, "kernel_found") + count(r, "relay_found");
            line += &format!(
                " {:>22}",
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    waits as f64 / per,
                    peeks as f64 / per,
                    found as f64 / per
                )
            );
        }
        println!("{line}");
    }
}
