//! The tables `bench load` prints: each scenario's rows, the service
//! figures, and the verdict lines that compare the modes.

use super::Args;
use super::arrivals::Scenario;
use crate::bench::stats::Row;

fn f(r: &Row, k: &str) -> f64 {
    r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN)
}

fn is_adaptive(r: &Row) -> bool {
    r.mode.starts_with("adaptive")
}

/// The verdict ratios for one scenario, as printable lines.
fn verdict(rows: &[&Row], lowest_rate: bool) -> Vec<String> {
    let fixed: Vec<&&Row> = rows.iter().filter(|r| !is_adaptive(r)).collect();
    let Some(best) = fixed
        .iter()
        .min_by(|a, b| a.t_typical.total_cmp(&b.t_typical))
    else {
        return vec![];
    };
    let near: Vec<&&&Row> = fixed
        .iter()
        .filter(|r| r.t_typical <= 1.3 * best.t_typical)
        .collect();
    let cheapest = near
        .iter()
        .min_by(|a, b| f(a, "cpu_s").total_cmp(&f(b, "cpu_s")))
        .expect("the best is near itself");
    let interrupt = fixed.iter().find(|r| r.mode == "interrupt");
    let mut out = vec![];
    for a in rows.iter().filter(|r| is_adaptive(r)) {
        let rp = a.t_typical / best.t_typical;
        let rc = f(a, "cpu_s") / f(cheapest, "cpu_s");
        out.push(format!(
            "  {}: p50 {:.2}x best fixed ({} {:.2}us) [{}]; cpu {:.2}x cheapest fixed within 1.3x of best p50 ({} {:.3}s) [{}]",
            a.mode,
            rp,
            best.mode,
            best.t_typical,
            if rp <= 1.3 { "ok" } else { "FAIL" },
            rc,
            cheapest.mode,
            f(cheapest, "cpu_s"),
            if rc <= 1.3 { "ok" } else { "FAIL" },
        ));
        if lowest_rate && let Some(i) = interrupt {
            let ri = f(a, "cpu_s") / f(i, "cpu_s");
            out.push(format!(
                "  {}: lowest rate: cpu {:.2}x interrupt's ({:.3}s) [{}]",
                a.mode,
                ri,
                f(i, "cpu_s"),
                if ri <= 1.3 { "ok" } else { "FAIL" }
            ));
        }
    }
    out
}

/// A service-time scenario's rows: wake latency (reply published →
/// taken), end-to-end latency and CPU per request, and adaptive's ratios
/// to poll and interrupt (and to itself without pre-wakes, when run).
fn print_service(name: &str, rs: &[&Row]) {
    println!(
        " {:<22} {:<18} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>9} {:>8} {:>8}",
        "scenario",
        "mode",
        "requests",
        "wake p50",
        "wake p99",
        "e2e p50",
        "e2e p99",
        "cpu/req[us]",
        "cpu%core",
        "sleeps",
        "prewake"
    );
    for r in rs {
        println!(
            " {:<22} {:<18} {:>8} {:>10.2} {:>10.2} {:>10.1} {:>10.1} {:>11.2} {:>9.2} {:>8} {:>8}",
            name,
            r.mode,
            r.iters,
            r.t_typical,
            r.p99,
            f(r, "e2e_p50_us"),
            f(r, "e2e_p99_us"),
            f(r, "cpu_us_per_req"),
            f(r, "cpu_pct_of_core"),
            r.extra.get("sleeps").and_then(|v| v.as_u64()).unwrap_or(0),
            r.extra
                .get("prewakes")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
        );
    }
    let find = |m: &str| rs.iter().find(|r| r.mode == m);
    let (poll, int) = (find("poll"), find("interrupt"));
    let off = rs.iter().find(|r| r.mode.contains("prewake=off"));
    for a in rs
        .iter()
        .filter(|r| is_adaptive(r) && !r.mode.contains("prewake=off"))
    {
        let mut l = format!("  {}:", a.mode);
        if let Some(p) = poll {
            l += &format!(
                " wake p50 {:.2}x poll's, cpu/req {:.3}x poll's;",
                a.t_typical / p.t_typical,
                f(a, "cpu_us_per_req") / f(p, "cpu_us_per_req")
            );
        }
        if let Some(i) = int {
            l += &format!(" wake p50 {:.2}x interrupt's;", a.t_typical / i.t_typical);
        }
        if let Some(o) = off {
            l += &format!(
                " against {}: wake p50 {:.2}x, cpu/req {:.2}x",
                o.mode,
                a.t_typical / o.t_typical,
                f(a, "cpu_us_per_req") / f(o, "cpu_us_per_req")
            );
        }
        println!("{l}");
    }
}

/// Under a co-located load: does adaptive stay within 2x of the best fixed
/// mode's p50, and keep up (its queue no deeper than twice the
/// shallowest fixed mode's, plus one request) where a fixed mode does?
fn keeps_up(rows: &[&Row]) -> Vec<String> {
    let fixed: Vec<&&Row> = rows.iter().filter(|r| !is_adaptive(r)).collect();
    let Some(best) = fixed
        .iter()
        .min_by(|a, b| a.t_typical.total_cmp(&b.t_typical))
    else {
        return vec![];
    };
    let shallow = fixed
        .iter()
        .map(|r| f(r, "queue_mean"))
        .fold(f64::INFINITY, f64::min);
    rows.iter()
        .filter(|r| is_adaptive(r))
        .map(|a| {
            let rp = a.t_typical / best.t_typical;
            let q = f(a, "queue_mean");
            // No figure (NaN) is no backlog shown.
            let ok_q = q.partial_cmp(&(2.0 * shallow + 1.0)) != Some(std::cmp::Ordering::Greater);
            format!(
                "  {}: background: p50 {:.2}x best fixed ({}) [{}]; queue {:.1} against the shallowest fixed {:.1} [{}]",
                a.mode,
                rp,
                best.mode,
                if rp <= 2.0 { "ok" } else { "FAIL" },
                q,
                shallow,
                if ok_q { "ok" } else { "BACKLOG" }
            )
        })
        .collect()
}

pub(super) fn print_table(a: &Args, rows: &[Row], scenarios: &[Scenario]) {
    let (psi, running) = fastwake::adaptive::pressure::system();
    println!(
        "fastwake {} bench load — source {} — producer pinned to CPU {}, consumer to CPU {}; {} s per mode and scenario in {} interleaved rounds; latency = consumer got it − scheduled send time; cpu = consumer (+ dispatcher) CPU seconds (CLOCK_THREAD_CPUTIME_ID); hog = a busy thread on the consumer's CPU; dispatcher idle policy {}; consumer slice {}{}",
        env!("CARGO_PKG_VERSION"),
        a.source,
        a.cpus.0,
        a.cpus.1,
        a.secs,
        a.rounds,
        a.dispatcher,
        a.slice
            .map_or("the kernel's".to_string(), |s| format!("{s:?} (asked)")),
        crate::bench::idle_note()
    );
    println!(
        "machine at the end: load average {}, PSI cpu some avg10 {}, procs_running {}",
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "?".into()),
        psi.map_or("?".into(), |v| format!("{v:.1}%")),
        running.map_or("?".into(), |v| v.to_string()),
    );
    let line = "-".repeat(112);
    let lowest = scenarios.iter().map(|s| s.rate).min().unwrap_or(0);
    for sc in scenarios {
        let name = sc.name();
        let rs: Vec<&Row> = rows
            .iter()
            .filter(|r| r.extra.get("scenario").and_then(|v| v.as_str()) == Some(&name))
            .collect();
        println!("{line}");
        if sc.pattern.closed() {
            print_service(&name, &rs);
            continue;
        }
        println!(
            " {:<18} {:<18} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>7}",
            "scenario",
            "mode",
            "requests",
            "p50[us]",
            "p99[us]",
            "p99.9[us]",
            "cpu[s]",
            "cpu%core",
            "sleeps",
            "queue"
        );
        for r in &rs {
            println!(
                " {:<18} {:<18} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>9.4} {:>10.2} {:>9} {:>7.1}",
                name,
                r.mode,
                r.iters,
                r.t_typical,
                r.p99,
                r.p999,
                f(r, "cpu_s"),
                f(r, "cpu_pct_of_core"),
                r.extra.get("sleeps").and_then(|v| v.as_u64()).unwrap_or(0),
                f(r, "queue_mean"),
            );
        }
        for l in verdict(&rs, sc.rate == lowest) {
            println!("{l}");
        }
        if sc.bg.is_some() {
            for l in keeps_up(&rs) {
                println!("{l}");
            }
        }
    }
    println!("{line}");
}
