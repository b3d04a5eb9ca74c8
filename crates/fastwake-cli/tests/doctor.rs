//! `fastwake doctor` as a program reads it: `--json` is one JSON document
//! with the promised keys, and every finding, in JSON and in text, points
//! at a section that exists in docs/guide/tuning.md.

use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;

/// Each run measures wake-ups with two pinned threads; one at a time.
static RUN: Mutex<()> = Mutex::new(());

fn doctor(args: &[&str]) -> (String, String) {
    let _g = RUN.lock().unwrap_or_else(|p| p.into_inner());
    // The gap measurement spins on every CPU: 10 ms of it (the least)
    // keeps these tests short and out of other tests' way.
    let o = Command::new(env!("CARGO_BIN_EXE_fastwake"))
        .arg("doctor")
        .args(["--gap-watch", "10ms"])
        .args(args)
        .output()
        .expect("run fastwake doctor");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "doctor {args:?} failed: {err}");
    (String::from_utf8(o.stdout).expect("UTF-8 stdout"), err)
}

#[path = "../src/doctor/anchors.rs"]
mod anchors;

/// The anchors of the guide's sections.
fn guide_anchors() -> Vec<String> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/guide/tuning.md");
    anchors::github_anchors(&std::fs::read_to_string(p).expect("read docs/guide/tuning.md"))
}

fn is_rfc3339_utc(s: &str) -> bool {
    // 2026-11-24T04:05:06Z
    let b = s.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

fn check_stats(v: &Value, what: &str) {
    for k in [
        "idle_us", "sleeps", "min_us", "p50_us", "p90_us", "p99_us", "max_us", "mean_us",
    ] {
        assert!(v[k].is_number(), "wake_up.{what}.{k} is not a number: {v}");
    }
    let (min, p50, p99, max) = (
        v["min_us"].as_f64().unwrap(),
        v["p50_us"].as_f64().unwrap(),
        v["p99_us"].as_f64().unwrap(),
        v["max_us"].as_f64().unwrap(),
    );
    assert!(
        0.0 < min && min <= p50 && p50 <= p99 && p99 <= max,
        "{what}: {v}"
    );
}

#[test]
fn json_is_one_document_with_the_schema_and_anchors_that_exist() {
    let (out, err) = doctor(&["--json"]);
    let j: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {out}\nstderr: {err}"));
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    for k in ["host", "kernel", "date"] {
        assert!(
            j[k].as_str().is_some_and(|s| !s.is_empty()),
            "{k} missing: {j}"
        );
    }
    assert!(is_rfc3339_utc(j["date"].as_str().unwrap()), "{}", j["date"]);
    let anchors = guide_anchors();
    let findings = j["findings"].as_array().expect("findings is a list");
    assert!(findings.len() >= 10, "only {} findings", findings.len());
    let (mut warn, mut bad) = (0, 0);
    let mut ids = Vec::new();
    for f in findings {
        for k in ["id", "area", "name", "level", "detail", "anchor", "doc"] {
            assert!(
                f[k].as_str().is_some_and(|s| !s.is_empty()),
                "finding lacks {k}: {f}"
            );
        }
        let level = f["level"].as_str().unwrap();
        assert!(
            ["ok", "info", "warn", "bad"].contains(&level),
            "level {level}: {f}"
        );
        assert!(
            ["cpu", "rdma", "network"].contains(&f["area"].as_str().unwrap()),
            "{f}"
        );
        match level {
            "warn" => warn += 1,
            "bad" => bad += 1,
            _ => {}
        }
        if matches!(level, "warn" | "bad") {
            assert!(
                f["advice"].as_str().is_some_and(|s| !s.is_empty()),
                "a {level} finding without advice: {f}"
            );
        } else {
            assert!(f["advice"].is_null() || f["advice"].is_string(), "{f}");
        }
        let a = f["anchor"].as_str().unwrap();
        assert!(
            anchors.iter().any(|h| h == a),
            "#{a} is not a heading of docs/guide/tuning.md ({anchors:?})"
        );
        assert_eq!(f["doc"], format!("docs/guide/tuning.md#{a}"));
        ids.push(f["id"].as_str().unwrap().to_string());
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "duplicate ids: {ids:?}");
    for id in [
        "cpu_pressure",
        "irqbalance",
        "isolated_cpus",
        "idle_states",
        "guest_halt_polling",
        "frequency_governor",
        "memlock",
        "completion_vectors",
        "busy_polling",
        "rfs",
        "xps",
        "io_uring",
        "wake_up_latency",
        "timed_sleep",
        "cpu_gaps",
    ] {
        assert!(ids.iter().any(|i| i == id), "no {id} finding: {ids:?}");
    }
    assert_eq!(j["warnings"], warn);
    assert_eq!(j["bad"], bad);
    // The measurement: numbers for each series, or why not.
    let w = &j["wake_up"];
    let mut missing = 0;
    for k in ["after_20us_idle", "after_2ms_idle"] {
        if w[k].is_null() {
            missing += 1;
        } else {
            check_stats(&w[k], k);
        }
    }
    assert_eq!(
        w["error"].is_string(),
        missing > 0,
        "an error exactly when a series is missing: {w}"
    );
    // The CPU gaps: counts per CPU watched, or why not.
    let g = &j["cpu_gaps"];
    let cpus = g["cpus"].as_array().expect("cpu_gaps.cpus");
    assert_eq!(g["error"].is_string(), cpus.is_empty(), "{g}");
    let together = g["together"].as_array().expect("cpu_gaps.together");
    assert!(together.len() <= cpus.len(), "{g}");
    for c in cpus.iter().chain(together) {
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
        assert!(
            n("over_50us") >= n("over_200us") && n("over_200us") >= n("over_1ms"),
            "{c}"
        );
        assert!(c["watched_ms"].as_f64().unwrap() >= 10.0, "{c}");
        assert!(c["max_us"].as_f64().unwrap() >= 0.0, "{c}");
    }
    // What ran while every CPU was watched: null, or the other threads'
    // run time, the longest first and each within the total.
    let t = &g["taken"];
    if !t.is_null() {
        let total = t["others_ms"].as_f64().expect("taken.others_ms");
        let top = t["top"].as_array().expect("taken.top");
        assert!(top.len() <= 5, "{t}");
        let ms: Vec<f64> = top.iter().map(|r| r["ms"].as_f64().unwrap()).collect();
        assert!(ms.windows(2).all(|w| w[0] >= w[1]), "longest first: {t}");
        assert!(ms.iter().sum::<f64>() <= total + 1e-6, "{t}");
        assert!(
            top.iter()
                .all(|r| r["comm"].is_string() && r["pid"].as_i64().unwrap() > 0),
            "{t}"
        );
    }
    // The timed sleeps: lateness and CPU, or why not. A sleep ends at
    // or after its deadline and costs some CPU.
    let t = &j["timed_sleep"];
    assert_eq!(t["error"].is_string(), t["lateness"].is_null(), "{t}");
    if !t["lateness"].is_null() {
        let l = &t["lateness"];
        assert_eq!(l["idle_us"], 50.0, "{t}");
        assert_eq!(l["sleeps"], 200, "{t}");
        let (min, p50, p99, max) = (
            l["min_us"].as_f64().unwrap(),
            l["p50_us"].as_f64().unwrap(),
            l["p99_us"].as_f64().unwrap(),
            l["max_us"].as_f64().unwrap(),
        );
        assert!(0.0 <= min && min <= p50 && p50 <= p99 && p99 <= max, "{t}");
        // No more CPU than the time a sleep took (plus the loop's).
        let cpu = t["cpu_per_sleep_us"].as_f64().unwrap();
        assert!(cpu > 0.0 && cpu < 60.0 + max, "{t}");
        // A reprogram is measured with the sleeps: a CPU cost, not a sleep.
        let r = t["reprogram_us"]
            .as_f64()
            .expect("reprogram_us with the lateness");
        assert!((0.0..1000.0).contains(&r), "{t}");
    }
}

#[test]
fn text_warnings_give_advice_and_name_a_section_of_the_guide() {
    let (out, _) = doctor(&[]);
    let anchors = guide_anchors();
    let lines: Vec<&str> = out.lines().collect();
    let mut flagged = 0;
    for (i, l) in lines.iter().enumerate() {
        let level = l.split_whitespace().next().unwrap_or("");
        if !l.starts_with("  ") || !matches!(level, "warn" | "bad") {
            continue;
        }
        flagged += 1;
        let advice = lines.get(i + 1).map(|s| s.trim_start()).unwrap_or("");
        assert!(advice.starts_with("-> "), "no advice after {l:?}:\n{out}");
        let see = lines.get(i + 2).map(|s| s.trim()).unwrap_or("");
        let a = see
            .strip_prefix("see docs/guide/tuning.md#")
            .unwrap_or_else(|| panic!("no guide section after {l:?}:\n{out}"));
        assert!(
            anchors.iter().any(|h| h == a),
            "#{a} is not a heading of docs/guide/tuning.md"
        );
    }
    // The summary ("N warning(s), M bad. ...") counts what was flagged.
    let summary = lines.last().copied().unwrap_or("");
    let (w, rest) = summary
        .split_once(" warning(s), ")
        .unwrap_or_else(|| panic!("no summary: {summary}"));
    let b = rest.split_once(" bad.").map(|(b, _)| b).unwrap_or("?");
    assert_eq!(
        w.parse::<usize>()
            .ok()
            .zip(b.parse::<usize>().ok())
            .map(|(w, b)| w + b),
        Some(flagged),
        "{summary}"
    );
}
