//! `fastwake run [--mode M | --profile P] [--budget D] [--cpu-cap S] [--verbose] [--pollers sleep] [--slice D] -- CMD ARGS...`:
//! run an unmodified program under the preload shim.
//!
//! It only prepares the environment (LD_PRELOAD plus the FASTWAKE_*
//! variables documented in docs/reference/environment.md) and execs the command, so the
//! command's exit status, signals and pid are its own.

use fastwake::{Fail, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

const SO_NAME: &str = "libfastwake_preload.so";

/// The end of `fastwake run --help` and of fastwake-run(1).
pub const ENVIRONMENT: &str = "\
Environment: run sets LD_PRELOAD and the shim's variables from its options: \
FASTWAKE_MODE, FASTWAKE_PROFILE, FASTWAKE_BUDGET_US, FASTWAKE_CPU_CAP, \
FASTWAKE_VERBOSE, FASTWAKE_POLLERS, FASTWAKE_SLICE (the same variables work with LD_PRELOAD alone; see \
docs/reference/environment.md). FASTWAKE_PRELOAD names the shim to use instead of the one \
found next to this binary or in PREFIX/lib/fastwake/. \
An unknown FASTWAKE_* variable gets one line on stderr; a bad value one \
line, and the program runs with every call passed through.";

/// `--profile`: named settings, as OpenOnload's `--profile=latency`.
/// The shim owns what each stands for (`FASTWAKE_PROFILE`, docs/reference/grammar.md
/// "Profiles"); a test checks both lists of names agree.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// hybrid:1ms with the CPU cap at 100 %: lowest latency, a waiting
    /// thread may keep its CPU busy.
    Latency,
    /// adaptive, ceiling 50 µs, cap 75 %: spin where it pays.
    Balanced,
    /// adaptive with the CPU cap at 10 % per thread.
    Power,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Wait mode: off, interrupt, poll, hybrid, adaptive or dispatch
    ///
    /// Wait mode for the program's waits, in the one grammar (docs/reference/grammar.md):
    /// off (every call passes through), interrupt (the kernel's blocking waits,
    /// no spinning), poll (spin up to the call's timeout), hybrid[:DURATION]
    /// (spin, then block; e.g. hybrid:30us), adaptive[:OPTIONS] (spin for a
    /// learned budget, at most --budget; e.g. adaptive:cap=20%), dispatch
    /// (epoll_wait, poll and select of any size, their forms without a signal
    /// mask, and blocking ibv_get_cq_event sleep until a per-CPU dispatcher
    /// hands off, also in workers forked without exec; waits with a signal mask
    /// as hybrid). Default: hybrid, or the --profile's mode.
    #[arg(long, value_parser = parse_run_mode)]
    pub mode: Option<String>,
    /// Named settings; --mode, --budget and --cpu-cap given beside it win.
    #[arg(long, value_enum)]
    pub profile: Option<Profile>,
    /// Spin budget, e.g. 50us (default 50us)
    ///
    /// Spin budget (hybrid: fixed; adaptive: ceiling), a duration in the one
    /// grammar: 50 (µs), 50us, 0.5ms; the shim's default is 50us.
    #[arg(long, value_parser = crate::values::duration)]
    pub budget: Option<std::time::Duration>,
    /// Share of one CPU spinning may use per thread (default 75%)
    ///
    /// Share of one CPU spinning may use per thread: 20%, 0.2 (or 20); the
    /// shim's default is 75%.
    #[arg(long, value_parser = parse_cap)]
    pub cpu_cap: Option<f64>,
    /// Let the shim print its configuration and counters on stderr.
    #[arg(long)]
    pub verbose: bool,
    /// What to do with threads that busy-poll
    ///
    /// What to do with threads that busy-poll (zero-timeout epoll_wait, poll or
    /// select, EAGAIN from non-blocking sockets, empty ibv_poll_cq): off
    /// (default: left as they are) or sleep (after a learned window of empty
    /// polls, the next empty poll waits for the polled set through the mode's
    /// engine, for at most a bound; a thread found polling something the shim
    /// cannot see is switched off; see docs/design/shim.md, "Busy-polling
    /// programs").
    #[arg(long, value_parser = ["off", "sleep"])]
    pub pollers: Option<String>,
    /// Scheduler slice for each thread that waits, e.g. 100us
    ///
    /// Scheduler slice each thread asks for at its first call to a hooked wait
    /// function (served or passed through), 100us to 100ms (Linux 6.12 or later, no privilege): a thread woken by
    /// its completion then preempts a busy neighbour instead of waiting for
    /// its turn to end. Off by default: it changes how the thread is scheduled
    /// while it computes too (docs/guide/tuning.md, "CPU pressure").
    #[arg(long, value_parser = crate::values::slice)]
    pub slice: Option<std::time::Duration>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<OsString>,
}

fn parse_run_mode(s: &str) -> std::result::Result<String, String> {
    // The shim takes any wait mode of the library (FASTWAKE_MODE), so run
    // checks with the library's own parser rather than a list of its own.
    fastwake::WaitMode::parse_or_off(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string().replace('\n', " "))
}

fn parse_cap(s: &str) -> std::result::Result<f64, String> {
    fastwake::grammar::share(s).map_err(|e| e.to_string())
}

/// Where the shim is, first found of: `$FASTWAKE_PRELOAD`; next to this
/// binary (the build tree: target/release); `../lib/fastwake/` from this
/// binary's directory, which is where `scripts/install` puts it (the
/// private library directory of a prefix, as `PREFIX/bin/fastwake` +
/// `PREFIX/lib/fastwake/`); and the install-time libdir baked in by
/// `FASTWAKE_LIBDIR` when the binary was built for a libdir other than
/// `PREFIX/lib` (Debian's `lib/x86_64-linux-gnu`, say).
fn find_shim() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FASTWAKE_PRELOAD") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Fail::invalid(format!(
                "FASTWAKE_PRELOAD={} is not a file",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(Fail::from)?;
    let mut tried = vec![exe.with_file_name(SO_NAME)];
    if let Some(prefix) = exe.parent().and_then(|bin| bin.parent()) {
        tried.push(prefix.join("lib/fastwake").join(SO_NAME));
    }
    if let Some(dir) = option_env!("FASTWAKE_LIBDIR") {
        tried.push(PathBuf::from(dir).join("fastwake").join(SO_NAME));
    }
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(Fail::new(
        libc::ENOENT,
        format!(
            "{SO_NAME} not found (tried {}); build it with 'cargo build --release -p fastwake-preload', install with scripts/install, or set FASTWAKE_PRELOAD",
            list.join(", ")
        ),
    ))
}

/// Exec the command; returns only on failure.
pub fn run(a: Args) -> Result<()> {
    let shim = find_shim()?;
    let mut preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
    if !preload.is_empty() {
        preload.push(":");
    }
    preload.push(shim.as_os_str());
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]).env("LD_PRELOAD", preload);
    // The command's environment says only what was asked for: a profile
    // leaves its mode to the shim's table, else hybrid is run's default.
    match (&a.mode, a.profile) {
        (Some(m), _) => {
            cmd.env("FASTWAKE_MODE", m);
        }
        (None, Some(_)) => {
            cmd.env_remove("FASTWAKE_MODE");
        }
        (None, None) => {
            cmd.env("FASTWAKE_MODE", "hybrid");
        }
    }
    if let Some(p) = a.profile {
        let name = clap::ValueEnum::to_possible_value(&p).expect("no skipped profiles");
        cmd.env("FASTWAKE_PROFILE", name.get_name());
    }
    if let Some(b) = a.budget {
        let ns = b.as_nanos();
        let v = if ns % 1000 == 0 {
            format!("{}us", ns / 1000)
        } else {
            format!("{ns}ns")
        };
        cmd.env("FASTWAKE_BUDGET_US", v);
    }
    if let Some(c) = a.cpu_cap {
        cmd.env("FASTWAKE_CPU_CAP", c.to_string());
    }
    if a.verbose {
        cmd.env("FASTWAKE_VERBOSE", "1");
    }
    if let Some(p) = &a.pollers {
        cmd.env("FASTWAKE_POLLERS", p);
    }
    if let Some(s) = a.slice {
        cmd.env("FASTWAKE_SLICE", format!("{}ns", s.as_nanos()));
    }
    let e = cmd.exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    eprintln!(
        "fastwake: error: cannot run {}: {e}",
        a.cmd[0].to_string_lossy()
    );
    std::process::exit(code);
}
