//! The `fastwake` command.

// clap turns the doc comments of the arguments into `--help` text, in
// the grammar's own notation (`hybrid[:DURATION]`), which rustdoc would
// read as links: they are help text, not links.
#![allow(rustdoc::broken_intra_doc_links)]

mod bench;
mod doctor;
mod listing;
mod meta;
mod others;
mod run;
mod stats;
mod values;

use clap::{CommandFactory, Parser, Subcommand};

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
    // Boxed: its options are most of the command's size.
    #[command(subcommand)]
    Bench(Box<bench::Bench>),
    /// Run a program under the preload shim, in a wait mode
    ///
    /// Runs an unmodified program under the preload shim (LD_PRELOAD), with a
    /// wait mode for its epoll_wait, epoll_pwait(2), poll, ppoll, select and
    /// pselect calls, its blocking recv, recvfrom, recvmsg, read and accept on
    /// sockets and, on rxe and mlx5 devices, libibverbs' ibv_get_cq_event.
    #[command(after_long_help = run::ENVIRONMENT)]
    Run(run::Args),
    /// Inspect this host and measure how fast a sleeping thread wakes up
    ///
    /// Inspects this host (CPUs, CPU pressure, isolation, IRQ balancing,
    /// idle states, guest halt polling, frequency governor, RDMA devices,
    /// memlock, completion vectors, busy polling, RFS/XPS, io_uring) and
    /// measures how fast a sleeping thread wakes up, what a timed sleep
    /// costs, and how often a thread that never blocks loses its CPU (each
    /// CPU alone, then all at once: --gap-watch). Changes nothing on the
    /// host.
    #[command(
        after_long_help = "Every finding names its section of docs/guide/tuning.md (the tuning guide): how to check it, what fastwake does about it, and what to change. Levels: ok (what fastwake wants), info (a fact), warn (costs latency or CPU), bad (part of fastwake cannot work here)."
    )]
    Doctor(doctor::Args),
    /// Live counters of programs running under the shim
    ///
    /// Live counters of running programs under the shim (like libvma's
    /// vma_stats): without -p, list them; with -p PID, that process's waits per
    /// call (served, or passed through and why), spins, spin hits, blocks,
    /// hand-offs, fallbacks and CPU spent spinning. Read from the shared-memory
    /// segment each shimmed process keeps (/dev/shm/fastwake-PID); the process
    /// is not stopped.
    Stats(stats::Args),
    /// Print a shell completion script
    ///
    /// Prints a completion script for SHELL on stdout (bash: `fastwake
    /// completions bash >
    /// ~/.local/share/bash-completion/completions/fastwake`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (fastwake.1, fastwake-run.1, ...) into DIR
    /// (scripts/install uses it).
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
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
            // One line, as for every other error: clap's rendering spreads
            // the message (a missing argument's name, the possible values,
            // a "did you mean") over several lines, then adds usage.
            let text = e.render().to_string();
            let line = one_line(&text);
            eprintln!("fastwake: error: {line} (see 'fastwake --help')");
            std::process::exit(2);
        }
    };
    let r = match cli.cmd {
        Cmd::Bench(b) => bench::run(*b),
        Cmd::Run(a) => run::run(a),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "fastwake",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Cmd::Man { out } => man_pages(&out),
    };
    if let Err(e) = r {
        eprintln!("fastwake: error: {e}");
        std::process::exit(2);
    }
}

/// One page per command and subcommand, from the same definitions as
/// `--help`, so the pages cannot disagree with the binary.
fn man_pages(dir: &std::path::Path) -> fastwake::Result<()> {
    std::fs::create_dir_all(dir).map_err(fastwake::Fail::from)?;
    // clap's `help` subcommands are not commands of their own: no pages.
    fn without_help(c: clap::Command) -> clap::Command {
        c.disable_help_subcommand(true)
            .mut_subcommands(without_help)
    }
    let mut cmd = without_help(Cli::command());
    cmd.build();
    clap_mangen::generate_to(cmd, dir).map_err(fastwake::Fail::from)
}

/// clap's multi-line error as one line: every line but the usage and the
/// "For more information" hint, joined.
fn one_line(clap_error: &str) -> String {
    let parts: Vec<&str> = clap_error
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .collect();
    let line = parts.join(" ");
    let line = line.trim_start_matches("error: ").trim();
    if line.is_empty() {
        "bad arguments".to_string()
    } else {
        line.to_string()
    }
}
