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

/// The rows' names: each mode as the grammar prints it, and a mode given
/// again as `MODE#2`, `MODE#3`, ...: a control, whose rows wait alike, so
/// how far apart they come out is what this run's noise alone does (see
/// [`control`]). `dispatch` once only: its dispatcher's CPU is charged to
/// one row.
pub(super) fn row_names(modes: &[fastwake::WaitMode]) -> fastwake::Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for m in modes {
        let name = m.to_string();
        let n = names.iter().filter(|x| base(x) == name).count();
        if n > 0 && *m == fastwake::WaitMode::Dispatch {
            return Err(fastwake::Fail::invalid(
                "bench load: dispatch may be given once (its dispatcher's CPU is charged to one row); repeat another mode as the control",
            ));
        }
        names.push(if n == 0 {
            name
        } else {
            format!("{name}#{}", n + 1)
        });
    }
    Ok(names)
}

/// A row name without its `#N`.
fn base(name: &str) -> &str {
    name.split_once('#').map_or(name, |(b, _)| b)
}

/// For each mode given more than once: how far apart its rows' p50s and
/// backlogs came out (largest over smallest). They waited alike, so a
/// difference between modes no larger than this is not the modes'.
fn control(rows: &[&Row]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in rows {
        let b = base(&r.mode);
        if seen.contains(&b) {
            continue;
        }
        seen.push(b);
        let same: Vec<&&Row> = rows.iter().filter(|x| base(&x.mode) == b).collect();
        if same.len() < 2 {
            continue;
        }
        let apart = |v: &dyn Fn(&Row) -> f64| {
            let (lo, hi) = same.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
                let x = v(x);
                (lo.min(x), hi.max(x))
            });
            hi / lo.max(1e-9)
        };
        let p50 = apart(&|x: &Row| x.t_typical);
        let backlog = apart(&|x: &Row| backlog(x));
        let backlog = if backlog.is_finite() {
            format!(", backlog {backlog:.2}x")
        } else {
            String::new()
        };
        out.push(format!(
            "  control: {b} x{}, waiting alike, came out p50 {p50:.2}x{backlog} apart: a difference between modes no larger is this run's noise",
            same.len()
        ));
    }
    out
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
fn print_service(name: &str, rs: &[&Row], cpu: u32) {
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
    let floor = rs
        .first()
        .and_then(|r| super::floor::Floor::from_extra(&r.extra));
    let off = rs.iter().find(|r| r.mode.contains("prewake=off"));
    for a in rs
        .iter()
        .filter(|r| is_adaptive(r) && !r.mode.contains("prewake=off"))
    {
        let mut l = format!("  {}:", a.mode);
        let bare = l.len();
        if let Some(p) = poll {
            l += &format!(
                " wake p50 {:.2}x poll's, cpu/req {:.3}x poll's{};",
                a.t_typical / p.t_typical,
                f(a, "cpu_us_per_req") / f(p, "cpu_us_per_req"),
                floor.map_or(String::new(), |fl| format!(" (floor {:.3}x)", fl.x_poll)),
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
        // Nothing to compare with (no poll, interrupt or prewake=off
        // row): no line.
        if l.len() > bare {
            println!("{l}");
        }
    }
    if let Some(fl) = floor {
        println!("{}", fl.line(cpu));
    }
}

/// The backlog a request found (`backlog_mean`; rows without one, the
/// queue it found).
fn backlog(r: &Row) -> f64 {
    r.extra
        .get("backlog_mean")
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| f(r, "queue_mean"))
}

/// Under a co-located load: does adaptive stay within 2x of the best fixed
/// mode's p50, and keep up (its backlog, counted against the schedule,
/// no deeper than twice the shallowest fixed mode's, plus one request)
/// where a fixed mode does? Where it does not, and the shallowest mode
/// had the consumer's CPU more to itself, say so: a waiter that never
/// sleeps keeps the CPU from ever looking idle, so the scheduler places
/// waking neighbours elsewhere, which no mode that sleeps between bursts
/// can do. Where that mode is `poll`, the backlog is also set against the
/// shallowest of the fixed modes that sleep, as a ratio.
fn keeps_up(rows: &[&Row]) -> Vec<String> {
    let fixed: Vec<&&Row> = rows.iter().filter(|r| !is_adaptive(r)).collect();
    let Some(best) = fixed
        .iter()
        .min_by(|a, b| a.t_typical.total_cmp(&b.t_typical))
    else {
        return vec![];
    };
    let Some(shallowest) = fixed
        .iter()
        .min_by(|a, b| backlog(a).total_cmp(&backlog(b)))
    else {
        return vec![];
    };
    let shallow = backlog(shallowest);
    let sleeper = fixed
        .iter()
        .filter(|r| r.mode != "poll")
        .min_by(|a, b| backlog(a).total_cmp(&backlog(b)))
        .filter(|_| shallowest.mode == "poll");
    let others = |r: &Row| f(r, "others_pct_of_consumer_cpu");
    rows.iter()
        .filter(|r| is_adaptive(r))
        .map(|a| {
            let rp = a.t_typical / best.t_typical;
            let q = backlog(a);
            // No figure (NaN) is no backlog shown.
            let ok_q = q.partial_cmp(&(2.0 * shallow + 1.0)) != Some(std::cmp::Ordering::Greater);
            let (oa, os) = (others(a), others(shallowest));
            let why = if !ok_q && oa > 2.0 * os + 5.0 {
                format!(
                    ": {} kept others off the consumer's CPU ({os:.0}% of it, against {oa:.0}% beside {})",
                    shallowest.mode, a.mode
                )
            } else {
                String::new()
            };
            let sleeping = sleeper.map_or(String::new(), |s| {
                let sq = backlog(s);
                format!(
                    "; {:.2}x the shallowest that sleeps ({} {sq:.1})",
                    q / sq.max(1e-9),
                    s.mode
                )
            });
            format!(
                "  {}: background: p50 {:.2}x best fixed ({}) [{}]; backlog {:.1} against the shallowest fixed {:.1} ({}) [{}]{why}{sleeping}",
                a.mode,
                rp,
                best.mode,
                if rp <= 2.0 { "ok" } else { "FAIL" },
                q,
                shallow,
                shallowest.mode,
                if ok_q { "ok" } else { "BACKLOG" }
            )
        })
        .collect()
}

pub(super) fn print_table(a: &Args, rows: &[Row], scenarios: &[Scenario]) {
    let (psi, running) = fastwake::adaptive::pressure::system();
    println!(
        "fastwake {} bench load — source {} — producer pinned to CPU {}, consumer to CPU {}; {} s per mode and scenario in {} interleaved rounds; latency = consumer got it − scheduled send time; cpu = consumer (+ dispatcher) CPU seconds (CLOCK_THREAD_CPUTIME_ID); hog = a busy thread on the consumer's CPU; queue = requests sent and not yet taken when one is taken, backlog = those due by the schedule and not yet taken (also those a late producer held); others% = share of the consumer's CPU that other threads used in the mode's windows (its /proc/stat busy time less the consumer's and the dispatcher's, 10 ms ticks); dispatcher idle policy {}; consumer slice {}{}",
        env!("CARGO_PKG_VERSION"),
        a.source,
        a.cpus.0,
        a.cpus.1,
        a.secs,
        a.rounds(),
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
    let line = "-".repeat(120);
    let lowest = scenarios.iter().map(|s| s.rate).min().unwrap_or(0);
    for sc in scenarios {
        let name = sc.name();
        let rs: Vec<&Row> = rows
            .iter()
            .filter(|r| r.extra.get("scenario").and_then(|v| v.as_str()) == Some(&name))
            .collect();
        println!("{line}");
        if sc.pattern.closed() {
            print_service(&name, &rs, a.cpus.1);
            continue;
        }
        println!(
            " {:<18} {:<18} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>7} {:>7} {:>7}",
            "scenario",
            "mode",
            "requests",
            "p50[us]",
            "p99[us]",
            "p99.9[us]",
            "cpu[s]",
            "cpu%core",
            "sleeps",
            "queue",
            "backlog",
            "others%"
        );
        for r in &rs {
            println!(
                " {:<18} {:<18} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>9.4} {:>10.2} {:>9} {:>7.1} {:>7.1} {:>7.0}",
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
                backlog(r),
                f(r, "others_pct_of_consumer_cpu"),
            );
        }
        for l in verdict(&rs, sc.rate == lowest) {
            println!("{l}");
        }
        for l in control(&rs) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of one mode: p50, mean backlog and others' share of the CPU
    /// (its queue a tenth of the backlog: the verdict must not read it).
    fn row(mode: &str, p50: f64, backlog: f64, others: f64) -> Row {
        let mut x = serde_json::Map::new();
        x.insert("backlog_mean".into(), backlog.into());
        x.insert("queue_mean".into(), (backlog / 10.0).into());
        x.insert("others_pct_of_consumer_cpu".into(), others.into());
        Row {
            source: "channel".into(),
            mode: mode.into(),
            placement: "cross".into(),
            iters: 1,
            size: 8,
            t_min: p50,
            t_max: p50,
            t_typical: p50,
            t_avg: p50,
            t_stdev: 0.0,
            p99: p50,
            p999: p50,
            cpu_us_per_op: 0.0,
            cpu_us_per_op_ping: 0.0,
            cpu_us_per_op_pong: 0.0,
            extra: x,
        }
    }

    /// The verdict lines for `rows`.
    fn verdicts(rows: &[Row]) -> Vec<String> {
        keeps_up(&rows.iter().collect::<Vec<_>>())
    }

    #[test]
    fn a_backlog_behind_a_mode_that_kept_others_off_its_cpu_says_so() {
        let rows = [
            row("poll", 0.6, 8.3, 6.0),
            row("hybrid", 0.56, 30.9, 48.0),
            row("adaptive", 0.49, 27.6, 44.0),
        ];
        let l = verdicts(&rows);
        assert_eq!(l.len(), 1);
        assert!(
            l[0].contains("backlog 27.6 against the shallowest fixed 8.3 (poll) [BACKLOG]"),
            "{}",
            l[0]
        );
        assert!(
            l[0].contains(
                "poll kept others off the consumer's CPU (6% of it, against 44% beside adaptive)"
            ),
            "{}",
            l[0]
        );
        // Set against the modes that sleep too.
        assert!(
            l[0].ends_with("; 0.89x the shallowest that sleeps (hybrid 30.9)"),
            "{}",
            l[0]
        );
    }

    #[test]
    fn a_backlog_with_the_cpu_shared_alike_gives_no_reason_and_a_kept_pace_no_flag() {
        let rows = [
            row("poll", 0.6, 8.3, 40.0),
            row("adaptive", 0.49, 27.6, 44.0),
        ];
        let l = verdicts(&rows);
        assert!(l[0].ends_with("[BACKLOG]"), "{}", l[0]);
        let rows = [
            row("hybrid", 0.7, 234.3, 49.0),
            row("adaptive", 0.9, 204.1, 44.0),
        ];
        let l = verdicts(&rows);
        assert!(l[0].contains("(hybrid) [ok]"), "{}", l[0]);
        // Not poll's: no second comparison.
        assert!(!l[0].contains("that sleeps"), "{}", l[0]);
        assert!(
            l[0].contains("p50 1.29x best fixed (hybrid) [ok]"),
            "{}",
            l[0]
        );
    }

    #[test]
    fn rows_without_a_backlog_are_judged_by_their_queue() {
        let mut rows = [
            row("poll", 0.6, 0.0, 40.0),
            row("adaptive", 0.49, 0.0, 44.0),
        ];
        for (r, q) in rows.iter_mut().zip([8.3, 27.6]) {
            r.extra.remove("backlog_mean");
            r.extra.insert("queue_mean".into(), q.into());
        }
        let l = verdicts(&rows);
        assert!(
            l[0].contains("backlog 27.6 against the shallowest fixed 8.3 (poll) [BACKLOG]"),
            "{}",
            l[0]
        );
    }

    #[test]
    fn a_mode_given_again_is_a_control_row_of_its_own_and_dispatch_is_not() {
        let m = |s: &str| s.split(',').map(|m| m.parse().unwrap()).collect::<Vec<_>>();
        assert_eq!(
            row_names(&m("interrupt,hybrid,int,event,adaptive")).unwrap(),
            [
                "interrupt",
                "hybrid",
                "interrupt#2",
                "interrupt#3",
                "adaptive"
            ]
        );
        // The grammar's spelling decides what is the same mode.
        assert_eq!(
            row_names(&m("hybrid:20us,hybrid,hybrid:20us")).unwrap(),
            ["hybrid:20us", "hybrid", "hybrid:20us#2"]
        );
        let e = row_names(&m("dispatch,poll,dispatch")).unwrap_err();
        assert!(e.to_string().contains("dispatch may be given once"), "{e}");
    }

    #[test]
    fn the_control_line_gives_how_far_apart_rows_that_wait_alike_came_out() {
        let rows = [
            row("interrupt", 14.0, 8.0, 90.0),
            row("hybrid", 400.0, 11.0, 80.0),
            row("interrupt#2", 42.0, 8.8, 90.0),
            row("interrupt#3", 28.0, 8.4, 90.0),
            row("adaptive", 17.0, 6.7, 90.0),
        ];
        let l = control(&rows.iter().collect::<Vec<_>>());
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains(
                "control: interrupt x3, waiting alike, came out p50 3.00x, backlog 1.10x apart"
            ),
            "{}",
            l[0]
        );
        // No mode given twice: no line.
        assert!(control(&rows[..2].iter().collect::<Vec<_>>()).is_empty());
    }
}
