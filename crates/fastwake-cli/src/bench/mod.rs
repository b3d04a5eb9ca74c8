//! `fastwake bench`: benchmarks that print perftest-style tables.

pub mod fetch;
pub mod harness;
pub mod ipc;
pub mod lanes;
pub mod load;
pub mod odp;
pub mod pingpong;
mod pingpong_dispatch;
pub mod plotting;
pub mod remote;
pub mod rounds;
pub mod share;
pub mod sources;
pub mod stats;
pub mod thread_clock;

use clap::{Args, Subcommand};
use fastwake::{Fail, Result};
use harness::Progress;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum Bench {
    /// Ping-pong latency over one source, wait modes interleaved
    ///
    /// Ping-pong latency over one completion source, several wait modes
    /// interleaved in one run.
    Pingpong(pingpong::Args),
    /// Wake-up latency of IPC mechanisms side by side
    ///
    /// Compares spin, futex, eventfd, pipe, socketpair, condvar, semaphore, the
    /// channel in poll, hybrid and interrupt mode, and a user-level switch;
    /// across the two --cpus and, where waiting there makes sense, with both
    /// ends on the first.
    Ipc(IpcArgs),
    /// N connections sharing K cores, per server arrangement
    ///
    /// N connections sharing K cores: thread-per-connection interrupt and
    /// polling against the per-core dispatcher (tasks, kernel threads).
    Share(share::Args),
    /// Open-loop request streams: latency and CPU per wait mode
    ///
    /// Open-loop request streams (Poisson, ON/OFF bursts) at several rates,
    /// with and without a CPU hog or co-located processes: p50/p99
    /// latency, CPU, the mean queue a request found and the share of the
    /// waiter's CPU other threads took, per wait mode.
    Load(load::Args),
    /// RDMA on-demand paging microbenchmarks (damming, flood)
    ///
    /// On-demand paging (ODP) microbenchmarks: two READs an interval apart
    /// (damming) and READs on N QPs at once (flood), pinned vs ODP vs ODP
    /// prefetched (pinned only on a device without ODP).
    Odp(odp::Args),
    /// Readers and a streaming writer: one connection, lanes, or one each.
    ///
    /// Latency and bulk lanes against one shared connection and against
    /// one connection per reader: N synchronous readers and a writer
    /// streaming 1 MiB messages, interleaved; then the bulk lane alone
    /// with batching on and off.
    Lanes(lanes::Args),
    /// Fetch objects by key over RDMA: READ, READ-2, RPC and adaptive
    ///
    /// Objects of 8 B to 64 KiB fetched by key by one READ (address
    /// cached), two dependent READs, an RPC, and adaptive (the path chosen
    /// per fetch from what each costs now), interleaved, with the server
    /// idle, with a CPU hog on its RPC core, and beside a bulk flow. Needs
    /// an RDMA device.
    Fetch(fetch::Args),
    /// The co-located load of `bench load --background` (one process).
    #[command(hide = true)]
    Busy(load::background::BusyArgs),
}

/// Options every benchmark shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Measured round trips per row (perftest's -n).
    #[arg(short = 'n', long, default_value_t = 100_000)]
    pub iters: u64,
    /// Unmeasured round trips per row before measuring.
    #[arg(long, default_value_t = 2_000)]
    pub warmup: u64,
    /// Payload bytes per message (perftest's -s)
    ///
    /// Payload bytes per message, perftest's -s (bench ipc: pipe, socketpair
    /// and channel rows only; the others carry no payload, eventfd its 8-byte
    /// counter).
    #[arg(short = 's', long, default_value_t = 8)]
    pub size: usize,
    /// CPUs of the two ends, `A,B` (same CPU allowed).
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    pub cpus: (u32, u32),
    /// Interleaving rounds
    ///
    /// Interleaving rounds: each row's iterations are split over this many
    /// slices, alternating with the other rows, in an order that puts each
    /// row in every position and right after every other row equally often
    /// (a balanced Latin square).
    #[arg(long, default_value_t = 10)]
    pub rounds: u64,
    /// Print JSON (one object per row) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct IpcArgs {
    #[command(flatten)]
    pub common: Common,
    /// Mechanisms to measure, comma separated (default: all)
    ///
    /// Mechanisms to measure (comma separated): spin, spin-yield, futex,
    /// eventfd, pipe, socketpair, condvar, semaphore, channel-poll,
    /// channel-hybrid, channel-interrupt, stack-switch; default all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// A `--mode` list: the items as given, split by the library's one
/// grammar (`fastwake::grammar::split_modes`, which keeps
/// `adaptive:cap=20%,worth=9` whole).
#[derive(Debug, Clone, PartialEq)]
pub struct ModeList(pub Vec<String>);

impl std::ops::Deref for ModeList {
    type Target = Vec<String>;
    fn deref(&self) -> &Vec<String> {
        &self.0
    }
}

/// A list of wait modes, each checked by the library's own parser while
/// the arguments are parsed, so a typo is one line before anything runs.
pub fn parse_modes(s: &str) -> std::result::Result<ModeList, String> {
    let items = parse_mode_names(s)?;
    for m in items.iter() {
        m.parse::<fastwake::WaitMode>().map_err(|e| e.to_string())?;
    }
    Ok(items)
}

/// A list of mode names split as [`parse_modes`] does, for benches whose
/// arrangements are more than wait modes (bench share's `tasks`,
/// `threads:…`); they check the names themselves.
pub fn parse_mode_names(s: &str) -> std::result::Result<ModeList, String> {
    let items: Vec<String> = fastwake::grammar::split_modes(s)
        .into_iter()
        .map(String::from)
        .collect();
    if items.is_empty() {
        return Err("expected at least one mode".into());
    }
    Ok(ModeList(items))
}

/// A one-line warning for an option given for a source it does not apply
/// to (it is ignored, as the warning says).
pub fn warn_unused(option: &str, applies_to: &str, source: &str) {
    eprintln!(
        "fastwake: warning: {option} applies to {applies_to} only; ignored with --source {source}"
    );
}

pub fn parse_cpus(s: &str) -> std::result::Result<(u32, u32), String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let n = fastwake::cpu::online();
    let parse = |p: &str| -> std::result::Result<u32, String> {
        let c: u32 = p
            .parse()
            .map_err(|_| format!("'{p}' is not a CPU number"))?;
        if c >= n {
            return Err(format!("CPU {c} does not exist (this host has {n})"));
        }
        Ok(c)
    };
    match parts.as_slice() {
        [a, b] => Ok((parse(a)?, parse(b)?)),
        _ => Err(format!("expected A,B (two CPU numbers), got '{s}'")),
    }
}

impl Common {
    pub fn validate(&self) -> Result<()> {
        if self.iters == 0 {
            return Err(Fail::invalid("--iters must be at least 1"));
        }
        if self.rounds == 0 || self.rounds > self.iters {
            return Err(Fail::invalid("--rounds must be between 1 and --iters"));
        }
        if self.size > 1 << 20 {
            return Err(Fail::invalid("--size must be at most 1048576"));
        }
        Ok(())
    }

    pub fn plan(&self) -> harness::Plan {
        harness::Plan {
            iters: self.iters,
            warmup: self.warmup,
            rounds: self.rounds,
        }
    }

    /// The line every benchmark prints about placement.
    pub fn placement_note(&self) -> String {
        format!(
            "threads pinned: ping end on CPU {}, pong end on CPU {}; one-way latency = RTT/2; cpu/op = CPU µs per round trip (CLOCK_THREAD_CPUTIME_ID){}",
            self.cpus.0,
            self.cpus.1,
            idle_note()
        )
    }
}

/// How this host's idle CPUs wait, when that moves the figures: in a guest
/// with the haltpoll idle driver, `guest_halt_poll_ns` decides whether a
/// sleeping waiter's vCPU halts at once (each wake-up a host round trip)
/// or polls first; interrupt mode's p50 moved 22.7 -> 2.6 µs between 0
/// and 200000 here. Empty elsewhere.
pub fn idle_note() -> String {
    match crate::doctor::guest_halt_poll_ns() {
        Some(0) => "; guest halt polling off (idle vCPUs halt at once)".into(),
        Some(ns) => format!("; guest halt polling up to {ns} ns"),
        None => String::new(),
    }
}

pub fn run(b: Bench) -> Result<()> {
    match b {
        Bench::Pingpong(a) => pingpong::run(a),
        Bench::Ipc(a) => run_ipc(a),
        Bench::Load(a) => load::run(a),
        Bench::Odp(a) => odp::run(a),
        Bench::Busy(a) => load::background::busy(a),
        Bench::Share(a) => share::run(a),
        Bench::Lanes(a) => lanes::run(a),
        Bench::Fetch(a) => fetch::run(a),
    }
}

/// Run `cases` under the harness with a progress bar on stderr that appears
/// only once the run has lasted a second, and never in JSON mode.
pub fn measure(cases: Vec<harness::Case>, common: &Common) -> Result<Vec<stats::Row>> {
    let total = common.iters * cases.len() as u64;
    let progress = Progress::default();
    let show = !common.json && std::io::stderr().is_terminal();
    let plan = common.plan();
    let p2 = progress.clone();
    let worker = std::thread::spawn(move || harness::run(cases, plan, &p2));
    let start = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if show && bar.is_none() && start.elapsed() > Duration::from_secs(1) {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} round trips ({eta} left)",
                )
                .expect("valid template"),
            );
            bar = Some(b);
        }
        if let Some(b) = &bar {
            b.set_position(progress.done.load(Ordering::Relaxed));
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    worker
        .join()
        .map_err(|_| Fail::new(libc::EIO, "benchmark thread panicked"))?
}

fn run_ipc(a: IpcArgs) -> Result<()> {
    a.common.validate()?;
    let mechs: Vec<String> = if a.only.is_empty() {
        ipc::ALL.iter().map(|s| s.to_string()).collect()
    } else {
        for m in &a.only {
            if !ipc::ALL.contains(&m.as_str()) {
                return Err(Fail::invalid(format!(
                    "unknown mechanism '{m}': expected one of {}",
                    ipc::ALL.join(",")
                )));
            }
        }
        a.only.clone()
    };
    let cases = ipc::cases(&mechs, a.common.cpus, a.common.size)?;
    let mut rows = measure(cases, &a.common)?;
    if mechs.iter().any(|m| m == "stack-switch") {
        let cpus = a.common.cpus;
        let iters = a.common.iters;
        let r = std::thread::spawn(move || ipc::stack_switch(iters, cpus.0))
            .join()
            .map_err(|_| Fail::new(libc::EIO, "stack-switch thread panicked"))??;
        rows.push(r);
    }
    if a.common.json {
        stats::print_json(&rows);
    } else {
        stats::print_table(
            &format!("fastwake bench ipc — {}", a.common.placement_note()),
            &rows,
        );
    }
    Ok(())
}
