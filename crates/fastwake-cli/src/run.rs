//! `fastwake run [--mode M] [--budget N] [--cpu-cap F] [--verbose] -- CMD ARGS...`:
//! run an unmodified program under the preload shim.
//!
//! It only prepares the environment (LD_PRELOAD plus the FASTWAKE_*
//! variables documented in docs/preload.md) and execs the command, so the
//! command's exit status, signals and pid are its own.

use fastwake::{Fail, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

const SO_NAME: &str = "libfastwake_preload.so";
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Wait mode for the program's waits: off (every call passes through),
    /// interrupt (the kernel's blocking waits, no spinning), poll (spin up
    /// to the call's timeout), hybrid (spin for --budget, then block),
    /// adaptive (spin for a learned budget, at most --budget), dispatch
    /// (epoll_wait, epoll_pwait without a signal mask, poll and select on
    /// up to 8 fds, and blocking ibv_get_cq_event sleep until a per-CPU
    /// dispatcher hands off; larger fd sets and masked epoll_pwait as
    /// hybrid). Any mode of the library is taken, with its options:
    /// hybrid:30us, adaptive:cap=20%.
    #[arg(long, default_value = "hybrid")]
    pub mode: String,
    /// Spin budget in µs (hybrid: fixed; adaptive: ceiling), e.g. 50 or
    /// 50us; the shim's default is 50.
    #[arg(long)]
    pub budget: Option<String>,
    /// Fraction of one CPU spinning may use per thread, in (0, 1]; the
    /// shim's default is 0.75.
    #[arg(long)]
    pub cpu_cap: Option<f64>,
    /// Let the shim print its configuration and counters on stderr.
    #[arg(long)]
    pub verbose: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<OsString>,
}

/// Where the shim is: `$FASTWAKE_PRELOAD`, else next to this binary.
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
    let p = exe.with_file_name(SO_NAME);
    if p.is_file() {
        return Ok(p);
    }
    Err(Fail::new(
        libc::ENOENT,
        format!(
            "{SO_NAME} not found next to {} (build it with 'cargo build --release -p fastwake-preload' or set FASTWAKE_PRELOAD)",
            exe.display()
        ),
    ))
}

fn check(a: &Args) -> Result<()> {
    // The shim takes any wait mode of the library (FASTWAKE_MODE), so run
    // checks with the library's own parser rather than a list of its own.
    if a.mode != "off"
        && let Err(e) = a.mode.parse::<fastwake::WaitMode>()
    {
        return Err(Fail::invalid(format!(
            "bad --mode '{}' for run: {} (or off)",
            a.mode,
            e.to_string().replace('\n', " ")
        )));
    }
    if let Some(b) = &a.budget {
        let n = b.strip_suffix("us").unwrap_or(b);
        if n.parse::<u32>().map_or(true, |v| v > 1_000_000) {
            return Err(Fail::invalid(format!(
                "bad --budget '{b}': expected µs in 0..=1000000, e.g. 50us"
            )));
        }
    }
    if let Some(c) = a.cpu_cap
        && !(c > 0.0 && c <= 1.0)
    {
        return Err(Fail::invalid(format!(
            "bad --cpu-cap {c}: expected a fraction in (0, 1]"
        )));
    }
    Ok(())
}

/// Exec the command; returns only on failure.
pub fn run(a: Args) -> Result<()> {
    check(&a)?;
    let shim = find_shim()?;
    let mut preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
    if !preload.is_empty() {
        preload.push(":");
    }
    preload.push(shim.as_os_str());
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("FASTWAKE_MODE", &a.mode);
    if let Some(b) = &a.budget {
        cmd.env("FASTWAKE_BUDGET_US", b.strip_suffix("us").unwrap_or(b));
    }
    if let Some(c) = a.cpu_cap {
        cmd.env("FASTWAKE_CPU_CAP", c.to_string());
    }
    if a.verbose {
        cmd.env("FASTWAKE_VERBOSE", "1");
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
