//! `fastwake run`: prepares LD_PRELOAD and FASTWAKE_* and execs the command,
//! whose exit status becomes its own; bad input is one line.

mod common;

use common::{assert_exit_and_one_line, exe};
use std::path::PathBuf;
use std::process::{Command, Output};

/// The shim next to the binary, as `fastwake run` looks for it.
fn shim() -> Option<PathBuf> {
    let p = exe().with_file_name("libfastwake_preload.so");
    if p.is_file() {
        Some(p)
    } else {
        // Fail, not skip: a skip printed by a passing test is swallowed by
        // the harness (these tests once passed a whole CI run that way).
        panic!(
            "{} not built: run `cargo build --release -p fastwake-preload` first (scripts/test does)",
            p.display()
        )
    }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(exe());
    c.arg("run").args(args).env_remove("LD_PRELOAD");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run fastwake")
}

#[test]
fn exit_status_is_the_commands() {
    if shim().is_none() {
        return;
    }
    let o = run(&["--mode", "hybrid", "--", "sh", "-c", "exit 7"], &[]);
    assert_eq!(o.status.code(), Some(7), "{o:?}");
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn sets_the_environment_and_appends_to_ld_preload() {
    let Some(so) = shim() else { return };
    let so = so.to_str().unwrap();
    let o = run(
        &[
            "--mode",
            "adaptive",
            "--budget",
            "30us",
            "--cpu-cap",
            "0.5",
            "--",
            "sh",
            "-c",
            "echo \"$FASTWAKE_MODE|$FASTWAKE_BUDGET_US|$FASTWAKE_CPU_CAP|$LD_PRELOAD\"",
        ],
        // An existing preload (the shim itself, so the loader accepts it)
        // must be kept, ahead of ours.
        &[("LD_PRELOAD", so)],
    );
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.trim(), format!("adaptive|30us|0.5|{so}:{so}"));
}

#[test]
fn takes_any_library_mode_with_its_options() {
    let Some(_) = shim() else { return };
    for m in ["hybrid:30us", "adaptive:cap=20%"] {
        let o = run(
            &["--mode", m, "--", "sh", "-c", "echo \"$FASTWAKE_MODE\""],
            &[],
        );
        assert!(o.status.success(), "{o:?}");
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), m);
    }
}

#[test]
fn bad_input_is_one_line_with_a_nonzero_exit() {
    for (args, needle) in [
        (
            &["--mode", "turbo", "--", "true"][..],
            "invalid value 'turbo' for '--mode",
        ),
        (
            &["--mode", "hybrid:abc", "--", "true"][..],
            "bad hybrid budget: bad duration 'abc'",
        ),
        (
            &["--budget", "soon", "--", "true"][..],
            "invalid value 'soon' for '--budget",
        ),
        (
            &["--cpu-cap", "150", "--", "true"][..],
            "invalid value '150' for '--cpu-cap",
        ),
        (
            &["--profile", "fast", "--", "true"][..],
            "[possible values: latency, balanced, power]",
        ),
        (&["--"][..], "<CMD>"),
    ] {
        assert_exit_and_one_line(&run(args, &[]), 2, needle);
    }
    let o = run(&["--", "/nonexistent/program"], &[]);
    if shim().is_some() {
        assert_eq!(o.status.code(), Some(127));
    } else {
        assert_eq!(o.status.code(), Some(2));
    }
    assert_eq!(
        String::from_utf8_lossy(&o.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}

/// `--profile` names what the shim's profile table holds (the shim
/// reports the settings it took), and explicit options win over it.
#[test]
fn profiles_reach_the_shim() {
    let Some(_) = shim() else { return };
    for (args, banner) in [
        (
            &["--profile", "latency"][..],
            "mode=hybrid:1000us budget=1000us cpu_cap=1 ",
        ),
        (
            &["--profile", "balanced"][..],
            "mode=adaptive budget=50us cpu_cap=0.75 ",
        ),
        (
            &["--profile", "power"][..],
            "mode=adaptive budget=50us cpu_cap=0.1 ",
        ),
        (
            &["--profile", "power", "--cpu-cap", "30%"][..],
            "mode=adaptive budget=50us cpu_cap=0.3 ",
        ),
        (
            &["--profile", "latency", "--mode", "interrupt"][..],
            "mode=interrupt ",
        ),
    ] {
        let mut a = args.to_vec();
        a.extend(["--verbose", "--", "true"]);
        let o = run(&a, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(err.contains(banner), "{args:?}: {err}");
    }
}

/// A misspelt FASTWAKE_* variable gets one line naming the right one.
#[test]
fn unknown_variables_are_named() {
    let Some(_) = shim() else { return };
    let o = run(&["--", "true"], &[("FASTWAKE_BUDGET", "-5")]);
    assert_exit_and_one_line(
        &o,
        0,
        "unknown variable FASTWAKE_BUDGET ignored (did you mean FASTWAKE_BUDGET_US?)",
    );
}

#[test]
fn a_missing_shim_is_one_line() {
    let o = run(
        &["--", "true"],
        &[("FASTWAKE_PRELOAD", "/nonexistent/libfastwake_preload.so")],
    );
    assert_exit_and_one_line(&o, 2, "FASTWAKE_PRELOAD");
}

/// A program that waits in none of the hooked calls (it computes, reads
/// files and pipes, forks and execs) gives byte-for-byte the same output
/// and exit status under the shim in every mode, and the shim says
/// nothing unless asked; with --verbose its report says that nothing was
/// intercepted and names what the program did call.
#[test]
fn a_program_without_hooked_waits_is_unchanged() {
    let Some(_) = shim() else { return };
    let script = "seq 1 30000 | sort -r | sha256sum; \
                  awk 'BEGIN { s = 0; for (i = 0; i < 200000; i++) s += i * i; print s }'; \
                  cat /proc/self/status | grep -c '^Cpus_allowed'; \
                  printf 'a\\nb\\n' | wc -l; exit 3";
    let plain = Command::new("sh")
        .args(["-c", script])
        .env_remove("LD_PRELOAD")
        .output()
        .expect("sh");
    assert_eq!(plain.status.code(), Some(3));
    for mode in ["poll", "interrupt", "hybrid", "adaptive", "dispatch"] {
        let o = run(&["--mode", mode, "--", "sh", "-c", script], &[]);
        assert_eq!(o.stdout, plain.stdout, "{mode}: output differs");
        assert_eq!(o.status.code(), plain.status.code(), "{mode}: exit differs");
        assert!(
            o.stderr.is_empty(),
            "{mode}: the shim spoke unasked: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = run(
        &["--mode", "hybrid", "--verbose", "--", "sh", "-c", "exit 0"],
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines().any(|l| l.contains("no waits intercepted")),
        "no 'no waits intercepted' in the report:\n{err}"
    );
}
