//! `fastwake bench load`: a short run's JSON has the documented keys, the
//! plots are written, and bad flags fail with one line.

use std::process::Command;

fn fastwake() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastwake"))
}

#[test]
fn short_run_reports_every_mode_with_the_documented_keys_and_plots() {
    let dir = std::env::temp_dir().join(format!("fw-load-plot-{}", std::process::id()));
    let out = fastwake()
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
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 6, "2 scenarios x 3 modes");
    for r in rows {
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
