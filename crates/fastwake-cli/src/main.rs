//! The `fastwake` command.

mod bench;
mod doctor;
mod run;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "fastwake",
    version,
    about = "Interrupt-mode I/O with polling-class latency: benchmarks and tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Measure wake-up latency and CPU cost (tables, or JSON with --json).
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Run an unmodified program under the preload shim (LD_PRELOAD), with
    /// a wait mode for its epoll_wait, epoll_pwait, poll and select calls
    /// and, on rxe and mlx5 devices, libibverbs' ibv_get_cq_event.
    Run(run::Args),
    /// Inspect this host (CPUs, CPU pressure, isolation, IRQ balancing,
    /// idle states, guest halt polling, frequency governor, RDMA devices,
    /// memlock, completion vectors, busy polling, RFS/XPS, io_uring) and
    /// measure how fast a sleeping thread wakes up. Read-only.
    #[command(
        after_help = "Every finding names its section of docs/tuning.md (the tuning guide): how to check it, what fastwake does about it, and what to change. Levels: ok (what fastwake wants), info (a fact), warn (costs latency or CPU), bad (part of fastwake cannot work here)."
    )]
    Doctor(doctor::Args),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, as for every other error: clap's own rendering adds
            // usage and a hint on further lines.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!(
                "fastwake: error: {} (see 'fastwake --help')",
                first.trim_start_matches("error: ").trim()
            );
            std::process::exit(2);
        }
    };
    let r = match cli.cmd {
        Cmd::Bench(b) => bench::run(b),
        Cmd::Run(a) => run::run(a),
        Cmd::Doctor(a) => doctor::run(a),
    };
    if let Err(e) = r {
        eprintln!("fastwake: error: {e}");
        std::process::exit(2);
    }
}
