//! `fastwake bench load`: a short run's JSON has the documented keys, the
//! plots are written, and bad flags fail with one line.

use std::process::Command;
use std::sync::Mutex;

/// The runs spin (poll, hybrid, the service scenarios' server): one at a
/// time.
static SPIN: Mutex<()> = Mutex::new(());

fn fastwake() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastwake"))
}

/// Run `cmd` (a `--json` run), which must succeed; its rows.
fn json_rows(cmd: &mut Command) -> Vec<serde_json::Value> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn short_run_reports_every_mode_with_the_documented_keys_and_plots() {
    let _one = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("fw-load-plot-{}", std::process::id()));
    let rows = json_rows(
        fastwake()
            .args([
                "bench",
                "load",
                "--rates",
                "2000",
                "--patterns",
                "poisson,onoff",
                "--hog",
                "off",
                "--mode",
                "interrupt,hybrid:5us,adaptive",
                "--secs",
                "0.1",
                "--rounds",
                "2",
                "--warmup-ms",
                "20",
                "--json",
                "--plot",
            ])
            .arg(&dir),
    );
    assert_eq!(rows.len(), 6, "2 scenarios x 3 modes");
    for r in &rows {
        for k in [
            "source",
            "mode",
            "placement",
            "iters",
            "size",
            "t_typical",
            "p99",
            "p999",
            "cpu_us_per_op",
            "scenario",
            "rate",
            "cpu_s",
        ] {
            assert!(r.get(k).is_some(), "missing key {k} in {r}");
        }
        assert!(
            r["iters"].as_u64().unwrap() > 0,
            "no requests measured: {r}"
        );
        assert_eq!(r["rate"].as_u64(), Some(2000));
        // /proc/stat is readable here: others' share of the consumer's
        // CPU is a percentage.
        let others = r["others_pct_of_consumer_cpu"].as_f64();
        assert!(
            others.is_some_and(|o| (0.0..=100.0).contains(&o)),
            "others_pct_of_consumer_cpu: {r}"
        );
        // schedstat is readable here: the consumer's run-queue delay per
        // request is a time.
        let delay = r["run_delay_us_per_req"].as_f64();
        assert!(
            delay.is_some_and(|d| d >= 0.0 && d.is_finite()),
            "run_delay_us_per_req: {r}"
        );
        // The backlog counts every request due, the queue only those sent:
        // a request sent is due, so the backlog is not the shallower. (The
        // queue reads the count sent a moment after the take is timed, so
        // a send in between can count in it alone: 0.05 a take lets one
        // take in twenty count one more.)
        let (q, b) = (r["queue_mean"].as_f64(), r["backlog_mean"].as_f64());
        assert!(
            matches!((q, b), (Some(q), Some(b)) if b >= q - 0.05),
            "queue_mean and backlog_mean: {r}"
        );
        assert!(r["backlog_max"].as_u64().is_some(), "backlog_max: {r}");
    }
    for s in ["poisson-2k", "onoff-2k"] {
        for ext in ["svg", "png"] {
            let p = dir.join(format!("{s}.{ext}"));
            let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            assert!(len > 1000, "{} missing or empty", p.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn service_rows(modes: &str) -> Vec<serde_json::Value> {
    let _one = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    json_rows(fastwake().args([
        "bench",
        "load",
        "--patterns",
        "service",
        "--service-us",
        "200",
        "--hog",
        "off",
        "--mode",
        modes,
        "--secs",
        "0.2",
        "--rounds",
        "2",
        "--warmup-ms",
        "20",
        "--json",
    ]))
}

/// The service scenarios measure a timed sleep's CPU between the windows
/// and, beside polling, report the pre-wake floor made of it.
#[test]
fn a_service_run_beside_polling_reports_the_pre_wake_floor() {
    let rows = service_rows("poll,adaptive");
    assert_eq!(rows.len(), 2);
    let f = |r: &serde_json::Value, k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("missing {k} in {r}"))
    };
    for r in &rows {
        // 16 sleeps after each of the 4 measured windows (2 modes, 2 rounds).
        assert_eq!(r["timed_sleeps"].as_u64(), Some(64), "{r}");
        assert!(f(r, "timed_sleep_cpu_us") > 0.0, "{r}");
        assert!(
            f(r, "timer_late_p90_us") >= f(r, "timer_late_p50_us"),
            "{r}"
        );
        let parts = f(r, "timed_sleep_cpu_us")
            + f(r, "prewake_floor_spread_us")
            + f(r, "prewake_floor_late_spread_us")
            + f(r, "prewake_floor_request_us");
        let floor = f(r, "prewake_floor_cpu_us_per_req");
        assert!((floor - parts).abs() < 1e-6, "{r}");
        // ±10 % of 200 µs: the spin from the earliest completions is most
        // of the 20 µs between the shortest and the mean wait.
        let spread = f(r, "prewake_floor_spread_us");
        assert!((5.0..=40.0).contains(&spread), "{r}");
        let x = f(r, "prewake_floor_x_poll");
        assert!(x > 0.0 && x < 1.0, "{r}");
    }
    let poll = rows.iter().find(|r| r["mode"] == "poll").unwrap();
    let x = f(poll, "prewake_floor_x_poll");
    let ratio = f(poll, "prewake_floor_cpu_us_per_req") / f(poll, "cpu_us_per_req");
    assert!((x - ratio).abs() < 1e-6, "{poll}");
}

/// Without polling there is nothing to weigh the floor against.
#[test]
fn a_service_run_without_polling_has_no_floor() {
    for r in service_rows("interrupt,adaptive") {
        assert!(r.get("prewake_floor_x_poll").is_none(), "{r}");
        assert!(r.get("timed_sleep_cpu_us").is_none(), "{r}");
    }
}

#[test]
fn bad_flags_fail_with_one_line() {
    for args in [
        vec!["--rates", "0"],
        vec!["--patterns", "zipf"],
        vec!["--hog", "maybe"],
        vec!["--mode", "adaptive:cap=0%"],
        vec!["--source", "nope"],
        vec!["--cpus", "0,99"],
    ] {
        let out = fastwake()
            .args(["bench", "load"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
