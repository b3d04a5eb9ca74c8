//! The `fastwake` command as a user meets it: errors are one line with a
//! non-zero exit; benchmarks print the promised columns and JSON keys.

use std::sync::Mutex;

mod common;
use common::{assert_exit_and_one_line, assert_one_line_error, fastwake};

/// Benchmarks spin (poll and hybrid rows); run them one at a time.
static SPIN: Mutex<()> = Mutex::new(());

#[test]
fn unknown_mode_is_one_line() {
    assert_one_line_error(
        &["bench", "pingpong", "--mode", "poll,bogus"],
        "unknown wait mode 'bogus'",
    );
}

#[test]
fn bad_cpus_are_one_line() {
    assert_one_line_error(
        &["bench", "pingpong", "--cpus", "0,99"],
        "CPU 99 does not exist",
    );
    assert_one_line_error(&["bench", "pingpong", "--cpus", "0"], "expected A,B");
}

#[test]
fn bad_numbers_are_one_line() {
    assert_one_line_error(&["bench", "pingpong", "--iters", "ten"], "--iters");
    assert_one_line_error(
        &["bench", "pingpong", "--iters", "0"],
        "--iters must be at least 1",
    );
}

#[test]
fn bench_fetch_bad_arguments_are_one_line() {
    assert_one_line_error(
        &["bench", "fetch", "--paths", "read,carrier-pigeon"],
        "bad fetch path",
    );
    assert_one_line_error(
        &["bench", "fetch", "--paths", "adaptive:cap=0"],
        "bad fetch path",
    );
    assert_one_line_error(&["bench", "fetch", "--sizes", "0"], "--sizes");
    assert_one_line_error(&["bench", "fetch", "--sizes", "70000"], "--sizes");
    assert_one_line_error(
        &["bench", "fetch", "--scenarios", "storm"],
        "unknown scenario",
    );
    assert_one_line_error(&["bench", "fetch", "-n", "2", "--rounds", "3"], "--rounds");
    assert_one_line_error(&["bench", "fetch", "--rpc-nice", "20"], "--rpc-nice");
}

#[test]
fn unknown_source_and_subcommand_are_one_line() {
    assert_one_line_error(
        &["bench", "pingpong", "--source", "carrier-pigeon"],
        "[possible values: channel, verbs, tcp, uring]",
    );
    assert_one_line_error(&["bench", "nope"], "unrecognized subcommand");
    assert_one_line_error(
        &["bench", "ipc", "--only", "smoke-signal"],
        "unknown mechanism",
    );
}

#[test]
fn bad_load_and_share_options_are_one_line() {
    assert_one_line_error(
        &["bench", "load", "--source", "carrier-pigeon"],
        "[possible values: channel, tcp]",
    );
    assert_one_line_error(&["bench", "load", "--dispatcher", "lazy"], "--dispatcher");
    assert_one_line_error(
        &["bench", "load", "--mode", "adaptive:catch=10%"],
        "bad adaptive catch",
    );
    assert_one_line_error(
        &["bench", "share", "--capacity", "3"],
        "must be a power of two",
    );
    assert_one_line_error(
        &["bench", "share", "--conns", "4", "--rotate", "5"],
        "--rotate must be between 1 and --conns",
    );
    assert_one_line_error(
        &["bench", "share", "--load", "throughput", "--rotate", "1"],
        "--rotate applies to --load latency only",
    );
    assert_one_line_error(
        &["bench", "share", "--clients", "0"],
        "--clients must be between 1 and",
    );
    assert_one_line_error(
        &["bench", "share", "--clients", "4096"],
        "--clients must be between 1 and",
    );
}

/// Run `fastwake <cmd> --json` (words split on spaces), which must
/// succeed; its rows.
fn json_rows(cmd: &str) -> Vec<serde_json::Value> {
    let args: Vec<&str> = cmd.split_whitespace().chain(["--json"]).collect();
    let o = fastwake(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    v.as_array().expect("an array of rows").clone()
}

/// The perftest-style keys every `bench` row carries in `--json`.
const PINGPONG_KEYS: [&str; 13] = [
    "source",
    "mode",
    "placement",
    "iters",
    "size",
    "t_min",
    "t_max",
    "t_typical",
    "t_avg",
    "t_stdev",
    "p99",
    "p999",
    "cpu_us_per_op",
];

#[test]
fn pingpong_json_has_every_key_per_mode() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let rows =
        json_rows("bench pingpong --mode poll,interrupt,hybrid --iters 300 --warmup 50 --rounds 3");
    assert_eq!(rows.len(), 3);
    for (row, mode) in rows.iter().zip(["poll", "interrupt", "hybrid"]) {
        assert_eq!(row["mode"], mode);
        assert_eq!(row["iters"], 300);
        for k in PINGPONG_KEYS {
            assert!(row.get(k).is_some(), "row lacks {k}: {row}");
        }
        let min = row["t_min"].as_f64().unwrap();
        let p50 = row["t_typical"].as_f64().unwrap();
        let max = row["t_max"].as_f64().unwrap();
        assert!(min > 0.0 && min <= p50 && p50 <= max, "{row}");
        assert!(row["cpu_us_per_op"].as_f64().unwrap() > 0.0);
    }
}

/// Every mode `bench pingpong --help` names runs, and the rows come back
/// in the order asked (the rounds rotate their start, the report does not).
#[test]
fn pingpong_runs_every_mode_its_help_names() {
    let help = String::from_utf8(fastwake(&["bench", "pingpong", "--help"]).stdout).unwrap();
    let modes = ["poll", "interrupt", "hybrid:5us", "adaptive", "dispatch"];
    for m in [
        "poll",
        "interrupt",
        "hybrid[:DURATION]",
        "adaptive[:OPTIONS]",
        "dispatch",
    ] {
        assert!(help.contains(m), "help does not name {m}: {help}");
    }
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let rows = json_rows(&format!(
        "bench pingpong --mode {} --iters 60 --warmup 10 --rounds 3",
        modes.join(",")
    ));
    let got: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(got, modes);
    assert!(rows.iter().all(|r| r["iters"] == 60), "{rows:?}");
    // Dispatch ran with dispatchers: their CPU is in its row, and each
    // end's waits went through one (hand-offs, relays or waits caught in
    // the relay; a fallback is a wait no dispatcher served).
    let d = &rows[4];
    assert!(d["dispatcher_cpu_us_per_op"].as_f64().unwrap() > 0.0, "{d}");
    for end in ["ping", "pong"] {
        assert!(d.get(format!("{end}_handoffs")).is_some(), "{d}");
        assert!(
            d.get(format!(
                "dispatcher{}_handoffs",
                if end == "ping" { 0 } else { 1 }
            ))
            .is_some(),
            "{d}"
        );
    }
    assert!(
        rows[..4]
            .iter()
            .all(|r| r.get("dispatcher_cpu_us_per_op").is_none()),
        "{rows:?}"
    );
}

/// `bench share --json` carries pingpong's keys plus the sharing ones,
/// and a p50 per round that the pooled p50 lies within.
#[test]
fn share_json_has_pingpong_keys_plus_sharing_keys() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let rows = json_rows(
        "bench share --conns 3 --mode tasks,threads,reference --iters 600 --warmup 50 --rounds 3",
    );
    assert_eq!(rows.len(), 3);
    for (row, (mode, conns)) in rows
        .iter()
        .zip([("tasks", 3), ("threads", 3), ("reference", 1)])
    {
        assert_eq!(row["mode"], mode);
        assert_eq!(row["conns"], conns, "{row}");
        assert_eq!(row["cores"], 1);
        assert_eq!(row["load"], "latency");
        let sharing = ["rtt_per_s", "handoffs", "relays", "dispatch_fallbacks"];
        for k in PINGPONG_KEYS.iter().chain(&sharing) {
            assert!(row.get(k).is_some(), "row lacks {k}: {row}");
        }
        assert!(row["rtt_per_s"].as_f64().unwrap() > 0.0, "{row}");
        let rounds: Vec<f64> = row["round_p50"]
            .as_array()
            .expect("round_p50 is an array")
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(rounds.len(), 3, "{row}");
        let p50 = row["t_typical"].as_f64().unwrap();
        let lo = rounds.iter().cloned().fold(f64::MAX, f64::min);
        let hi = rounds.iter().cloned().fold(0.0, f64::max);
        assert!(
            lo <= p50 && p50 <= hi,
            "pooled p50 {p50} outside rounds {rounds:?}"
        );
    }
    // Every request of the dispatcher modes went through a hand-off or a
    // relay: none fell back.
    assert_eq!(rows[0]["dispatch_fallbacks"], 0);
}

/// The floors of N connections: the event loop, and the oracle that waits
/// on the rotation's next connection only. The oracle serves a rotation
/// over some of the connections (the idle ones stay open but unserved)
/// and the throughput load (every connection keeps one request out, so
/// its order stays the client's): a wrong guess of the next connection
/// would hang the run, not slow it.
#[test]
fn share_oracle_serves_rotations_and_throughput() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    for cmd in [
        "bench share --conns 4 --rotate 3 --mode oracle,evloop --iters 600 --warmup 50 --rounds 3",
        "bench share --conns 4 --load throughput --mode oracle --iters 600 --warmup 50 --rounds 3",
    ] {
        let rows = json_rows(cmd);
        for r in &rows {
            assert_eq!(r["conns"], 4, "{cmd}: {r}");
            assert!(r["rtt_per_s"].as_f64().unwrap() > 0.0, "{cmd}: {r}");
        }
        let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
        assert_eq!(modes[0], "oracle", "{cmd}");
    }
}

/// `--source socket` (loopback TCP) and `--source unix`: the same modes
/// over socket connections, the server end the library's socket source.
/// The client checks every reply's tag (a wrong one fails the run); the
/// task runtime finds its waits on its kernel ready list and peeks the
/// sockets only as they come (not one by one every pass, as tasks:scan
/// does).
#[test]
fn share_over_sockets_serves_the_modes_and_reports_the_kernel_list() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let cmd = "bench share --source socket --conns 4 --rotate 2 --mode tasks,threads,evloop,oracle,reference,tasks:scan --iters 600 --warmup 50 --rounds 3";
    let rows = json_rows(cmd);
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(
        modes,
        [
            "tasks",
            "threads",
            "evloop",
            "oracle",
            "reference",
            "tasks:scan"
        ]
    );
    for r in &rows {
        assert_eq!(r["source"], "socket", "{r}");
        let conns = if r["mode"] == "reference" { 1 } else { 4 };
        assert_eq!(r["conns"], conns, "{r}");
        assert!(r["rtt_per_s"].as_f64().unwrap() > 0.0, "{r}");
        for k in ["epoll_waits", "kernel_found", "peeks", "relay_epoll_waits"] {
            assert!(r[k].is_u64(), "row lacks {k}: {r}");
        }
    }
    let (tasks, scan) = (&rows[0], &rows[5]);
    // 750 round trips (600 measured, 50 warm-up per slice), nearly all
    // waits the list found.
    assert!(tasks["kernel_found"].as_u64().unwrap() >= 600, "{tasks}");
    assert!(tasks["epoll_waits"].as_u64().unwrap() > 0, "{tasks}");
    // Peeked once as each is inserted, 4 sockets in each of 3 slices.
    assert!(tasks["peeks"].as_u64().unwrap() <= 3 * 4, "{tasks}");
    assert_eq!(scan["epoll_waits"], 0, "tasks:scan used the list: {scan}");
    assert!(scan["peeks"].as_u64().unwrap() >= 600, "{scan}");
    let threads = &rows[1];
    assert!(
        threads["handoffs"].as_u64().unwrap() + threads["relays"].as_u64().unwrap() > 0,
        "{threads}"
    );
    let rows = json_rows(
        "bench share --source unix --conns 3 --load throughput --mode tasks,oracle --iters 600 --warmup 50 --rounds 3",
    );
    for r in &rows {
        assert_eq!(r["source"], "unix", "{r}");
        assert_eq!(r["conns"], 3, "{r}");
        assert!(r["rtt_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// `fastwake ARGS` under a file-descriptor limit (`ulimit` in `sh`).
fn fastwake_with_fd_limit(ulimit: &str, args: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" {args}"))
        .arg(common::exe())
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run sh")
}

/// Sockets need file descriptors (6 per connection): a low soft limit is
/// raised to the hard one, saying so in one line; a hard limit too low
/// for the run is one line and exit 2; a sweep stops where the limit
/// does, saying so in one line.
#[test]
fn share_over_sockets_fits_the_file_descriptor_limit() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let run = "bench share --source unix --mode tasks --iters 200 --warmup 10 --rounds 1 --json";
    let o = fastwake_with_fd_limit("-S -n 100", &format!("{run} --conns 64"));
    assert_exit_and_one_line(&o, 0, "raised the soft file-descriptor limit");
    let o = fastwake_with_fd_limit("-n 200", &format!("{run} --conns 64"));
    assert_exit_and_one_line(&o, 2, "allows 22 socket connections, not 64");
    let o = fastwake_with_fd_limit(
        "-n 200",
        &format!("{run} --sweep --sweep-max 64 --rotate 1"),
    );
    assert_exit_and_one_line(&o, 0, "the sweep stops at 16");
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let conns: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["conns"].as_u64().unwrap())
        .collect();
    assert_eq!(conns, [1, 4, 16]);
}

/// Thread-per-connection in the library's spinning modes, and threads
/// waiting in adaptive mode next to a dispatcher: the adaptive controller
/// finds the dispatcher by itself when the connections share a core.
#[test]
fn share_runs_spinning_and_adaptive_thread_modes() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let rows = json_rows(
        "bench share --conns 3 --mode hybrid:10us,adaptive,threads:adaptive --iters 900 --warmup 50 --rounds 3",
    );
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["hybrid", "adaptive", "threads:adaptive"]);
    let dispatched = rows[2]["handoffs"].as_u64().unwrap() + rows[2]["relays"].as_u64().unwrap();
    assert!(
        dispatched > 0,
        "adaptive threads never used the dispatcher: {}",
        rows[2]
    );
}

#[test]
fn pingpong_same_cpu_table_has_perftest_columns() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let o = fastwake(&[
        "bench",
        "pingpong",
        "--mode",
        "interrupt,hybrid",
        "--cpus",
        "0,0",
        "--iters",
        "200",
        "--warmup",
        "20",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    for col in [
        "t_min",
        "t_max",
        "t_typical",
        "t_avg",
        "t_stdev",
        "99%",
        "99.9%",
        "cpu/op",
    ] {
        assert!(out.contains(col), "missing column {col}:\n{out}");
    }
    assert!(out.contains(" same "), "placement column:\n{out}");
    assert!(out.contains("pinned"), "the placement note:\n{out}");
}

#[test]
fn ipc_measures_each_requested_mechanism() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let o = fastwake(&[
        "bench",
        "ipc",
        "--only",
        "futex,pipe,stack-switch",
        "--iters",
        "200",
        "--warmup",
        "20",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let modes: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["mode"].as_str().unwrap(),
                r["placement"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        modes,
        [
            "futex/cross",
            "futex/same",
            "pipe/cross",
            "pipe/same",
            "stack-switch/one-thread"
        ]
    );
}

#[test]
fn doctor_runs_and_reports() {
    // Its wake-up measurement spins a producer for ~4 ms, its gap
    // measurement every CPU for 10 ms.
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let o = fastwake(&["doctor", "--gap-watch", "10ms"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("cpus") && out.contains("rdma") && out.contains("warning(s)"),
        "{out}"
    );
    // The measured wake-up: two positive figures, or a reason.
    let line = out
        .lines()
        .find(|l| l.contains("wake-up latency") && !l.contains("cpuidle"))
        .unwrap_or_else(|| panic!("no wake-up line: {out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let after_short = words
        .windows(2)
        .find(|w| w[0] == "p50")
        .and_then(|w| w[1].parse::<f64>().ok());
    let after_long = words
        .windows(4)
        .find(|w| w[1] == "µs" && w[2] == "after" && w[3] == "2")
        .and_then(|w| w[0].parse::<f64>().ok());
    assert!(
        line.contains("not measured")
            || matches!((after_short, after_long), (Some(a), Some(b)) if a > 0.0 && b > 0.0),
        "{line}"
    );
}

/// What a perftest user types: -n, -s, -d and -e mean what they mean
/// there, and an option given for a source it does not apply to is named
/// in a one-line warning instead of being silently ignored.
#[test]
fn perftest_short_flags_and_unused_option_warnings() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let o = fastwake(&[
        "bench", "pingpong", "-n", "50", "-s", "64", "-e", "-d", "mlx5_0", "--warmup", "5",
        "--rounds", "1", "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(
            "warning: --dev applies to --source verbs only; ignored with --source channel"
        ),
        "{err}"
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["mode"], "interrupt");
    assert_eq!(rows[0]["iters"], 50);
    assert_eq!(rows[0]["size"], 64);
    let run = &rows[0]["run"];
    assert_eq!(run["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        run["command"].as_str().unwrap().contains("pingpong -n 50"),
        "{run}"
    );
    assert!(run["date"].as_str().unwrap().ends_with('Z'), "{run}");
    assert!(!run["host"].as_str().unwrap().is_empty(), "{run}");
    assert_one_line_error(
        &["bench", "pingpong", "-e", "--mode", "poll"],
        "cannot be used with",
    );
}

/// `--stall-ms` takes milliseconds or off, says so in one line
/// otherwise, and is for `--source verbs` only.
#[test]
fn stall_ms_is_checked_and_belongs_to_verbs() {
    assert_one_line_error(
        &[
            "bench",
            "pingpong",
            "--source",
            "verbs",
            "--stall-ms",
            "soon",
        ],
        "expected a number of milliseconds or off",
    );
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let o = fastwake(&[
        "bench",
        "pingpong",
        "-n",
        "20",
        "--warmup",
        "2",
        "--rounds",
        "1",
        "--mode",
        "interrupt",
        "--stall-ms",
        "off",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: --stall-ms applies to --source verbs only"),
        "{err}"
    );
}

/// Every enumerated option lists its values in --help.
#[test]
fn help_lists_the_values_of_every_enumerated_option() {
    for (cmd, values) in [
        ("pingpong", "[possible values: channel, verbs, tcp, uring]"),
        ("pingpong", "[possible values: futex, eventfd]"),
        ("pingpong", "[possible values: report, thread, irq]"),
        ("load", "[possible values: channel, tcp]"),
        ("load", "[possible values: off, on, both]"),
        ("share", "[possible values: latency, throughput]"),
    ] {
        let help = String::from_utf8(fastwake(&["bench", cmd, "--help"]).stdout).unwrap();
        assert!(help.contains(values), "bench {cmd} --help lacks {values}");
    }
    let help = String::from_utf8(fastwake(&["run", "--help"]).stdout).unwrap();
    for p in ["- latency:", "- balanced:", "- power:"] {
        assert!(help.contains(p), "run --help lacks {p}: {help}");
    }
}

/// `-h` is the short help: one phrase per option (clap's `help`), so a
/// command's options fit a screen; `--help` (and the man pages) keep the
/// full text (clap's `long_help`).
#[test]
fn short_help_is_one_phrase_per_option() {
    for cmd in [
        &["run"][..],
        &["doctor"],
        &["stats"],
        &["bench", "pingpong"],
        &["bench", "ipc"],
        &["bench", "share"],
        &["bench", "load"],
        &["bench", "odp"],
        &["bench", "lanes"],
    ] {
        let short = String::from_utf8(fastwake(&[cmd, &["-h"]].concat()).stdout).unwrap();
        let long = String::from_utf8(fastwake(&[cmd, &["--help"]].concat()).stdout).unwrap();
        assert!(
            short.len() < 2_500,
            "{cmd:?} -h is {} characters:\n{short}",
            short.len()
        );
        assert!(long.len() >= short.len(), "{cmd:?}: --help shorter than -h");
        for line in short.lines().filter(|l| l.trim_start().starts_with('-')) {
            // "  -n, --iters <ITERS>   Phrase [default: ...] [possible values: ...]"
            let text = line.trim_start();
            let Some(at) = text.find("  ") else { continue };
            let phrase = text[at..].trim();
            let phrase = phrase.split(" [default:").next().unwrap();
            let phrase = phrase.split(" [possible values:").next().unwrap();
            assert!(
                phrase.chars().count() <= 72,
                "{cmd:?} -h: a phrase of {} characters: {phrase}",
                phrase.chars().count()
            );
        }
    }
}

/// The two-process verbs flags (perftest's -i, -x, -p, -a, -F, --out_json)
/// parse; without an RDMA device both the server and the client form are
/// one line, before any TCP; a HOST needs --source verbs.
#[test]
fn two_process_verbs_flags_and_errors_are_one_line() {
    if std::path::Path::new("/dev/infiniband").exists() {
        eprintln!("SKIPPED two_process_verbs_flags_and_errors_are_one_line: this host has RDMA");
        return;
    }
    let no_rdma = "RDMA";
    assert_one_line_error(&["bench", "pingpong", "--source", "verbs"], no_rdma);
    assert_one_line_error(
        &[
            "bench",
            "pingpong",
            "--source",
            "verbs",
            "-d",
            "rxe0",
            "-i",
            "2",
            "-x",
            "3",
            "-p",
            "18600",
            "-a",
            "-F",
            "-e",
            "--out_json",
            "/dev/null",
            "10.0.0.1",
        ],
        no_rdma,
    );
    assert_one_line_error(
        &["bench", "pingpong", "--source", "verbs", "-i", "0"],
        "--ib-port",
    );
    assert_one_line_error(
        &["bench", "pingpong", "--source", "verbs", "-a", "-s", "8"],
        "'--all' cannot be used with '--size",
    );
    assert_one_line_error(
        &[
            "bench", "pingpong", "--source", "verbs", "--local", "10.0.0.1",
        ],
        "cannot be used with",
    );
    assert_one_line_error(
        &["bench", "pingpong", "--source", "tcp", "10.0.0.1"],
        "a HOST (the client of a two-process run) needs --source verbs",
    );
}

/// `--out-json FILE`: one object with the run metadata and the rows.
#[test]
fn out_json_writes_run_metadata_and_rows() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join(format!("fw-out-json-{}.json", std::process::id()));
    let o = fastwake(&[
        "bench",
        "pingpong",
        "--mode",
        "interrupt",
        "-n",
        "50",
        "--warmup",
        "5",
        "--rounds",
        "1",
        "--out-json",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    for k in ["version", "host", "date", "command"] {
        assert!(doc["run"][k].is_string(), "{k}: {doc}");
    }
    assert_eq!(doc["rows"].as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc["rows"][0]["iters"], 50);
}

/// `bench lanes`: bad parameters are one line; a short run prints every
/// arrangement and batching row with its keys, and the lanes row its
/// ratios.
#[test]
fn lanes_bench_rows_and_bad_parameters() {
    assert_one_line_error(&["bench", "lanes", "--readers", "0"], "--readers");
    assert_one_line_error(
        &["bench", "lanes", "--polite-chunk", "999999"],
        "polite chunk",
    );
    assert_one_line_error(&["bench", "lanes", "--only", "nope"], "unknown arrangement");
    assert_one_line_error(&["bench", "lanes", "--bulk-mode", "poll"], "bulk lane");
    assert_one_line_error(&["bench", "lanes", "--slice", "5us"], "--slice");
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let rows = json_rows(
        "bench lanes --readers 2 --seconds 0.2 --batch-seconds 0.1 --rounds 1 --batch-sizes 16384",
    );
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["arrangement"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert_eq!(&names[..3], ["shared", "lanes", "per-reader"]);
    for r in &rows {
        for k in [
            "read_iops",
            "write_mib_s",
            "cpu_us_per_op",
            "bulk_syscalls_per_mib",
            "others_ms_per_s",
            "run",
            "table",
        ] {
            assert!(r.get(k).is_some(), "{k} missing: {r}");
        }
        // Others' run time per second: a sanity bound of 64 CPUs' worth.
        let o = r["others_ms_per_s"].as_f64().expect("a number");
        assert!((0.0..=2000.0 * 64.0).contains(&o), "{r}");
    }
    assert_eq!(rows[1]["connections"], 2);
    assert_eq!(rows[2]["connections"], 3);
    assert!(
        rows[1].get("ratio_vs_shared_read_IOPS").is_some(),
        "{}",
        rows[1]
    );
    assert!(rows[0]["reads"].as_u64().unwrap() > 0 && rows[1]["reads"].as_u64().unwrap() > 0);
}

/// A mode the host refuses (here `threads:fifo` without CAP_SYS_NICE) is
/// reported in one line and left out; the other modes are measured.
#[test]
fn share_goes_on_past_a_refused_mode() {
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    // SAFETY: geteuid has no preconditions.
    if !setpriv.exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "SKIPPED share_goes_on_past_a_refused_mode: needs root and setpriv to drop CAP_SYS_NICE"
        );
        return;
    }
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let out = std::process::Command::new(setpriv)
        .args([
            "--bounding-set",
            "-sys_nice",
            "--inh-caps",
            "-sys_nice",
            "--",
        ])
        .arg(common::exe())
        .args([
            "bench",
            "share",
            "--conns",
            "4",
            "--mode",
            "threads:fifo,tasks",
        ])
        .args(["--iters", "500", "--rounds", "2", "--json"])
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run fastwake under setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("threads:fifo left out") && l.contains("Operation not permitted")),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let rows = v.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["mode"], "tasks");
}
