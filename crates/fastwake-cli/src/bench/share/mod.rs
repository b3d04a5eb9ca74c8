//! `fastwake bench share`: N connections whose server ends share K cores.
//!
//! Every connection is a pair of channels (request, response), or with
//! `--source socket|unix` a stream socket (loopback TCP, or an AF_UNIX
//! socketpair) whose server end is the library's socket source. The server
//! ends run on the last K CPUs, in one of several arrangements (the
//! *modes*); one busy-polling client thread on the first remaining CPU
//! drives them:
//!
//! - `latency` load: one request outstanding in the whole system, rotating
//!   over the N connections, so a round trip includes the server side's
//!   whole wake-up path (for a dispatcher: the scan of N sources too).
//! - `throughput` load: every connection closed-loop with one request
//!   outstanding; round trips per second is the figure of merit.
//!
//! Modes are measured interleaved in one run (each round gives every mode a
//! slice, see [`super::rounds`]; servers are set up and torn down per slice
//! so an idle mode never steals CPU from the measured one).
//!
//! One file per concern: [`mode`] (what `--load` and `--mode` mean),
//! [`layout`] (which CPUs), [`conn`] (what a connection is: the channel's,
//! and [`sockets`]), [`servers`] and [`client`] (the two sides of a
//! slice), [`measure`](mod@measure) (the interleaved loop), [`report`] (what is printed
//! besides the table), and the two probes, [`futex_ring`] and
//! [`idle_probe`].

mod client;
mod conn;
mod futex_ring;
mod idle_probe;
mod layout;
mod measure;
mod mode;
mod report;
mod servers;
mod sockets;

use super::stats::{self, Row};
use conn::{Channels, Wire};
use fastwake::source::channel::{Config as ChanConfig, Doorbell};
use fastwake::{Fail, Result, WaitMode};
use layout::Layout;
use measure::{Plan, measure};
use mode::{Load, Mode};
use sockets::{Family, Sockets};
use std::time::Duration;

const DEFAULT_MODES: &str = "interrupt,poll,tasks,threads,reference";

/// Numbers of connections `--sweep` measures.
const SWEEP: [usize; 6] = [1, 4, 16, 64, 256, 1024];

#[derive(clap::Args, Debug)]
pub struct Args {
    /// What a connection is
    ///
    /// What a connection is: `channel`, a pair of the library's shared-memory
    /// channels; `socket`, a loopback TCP connection (TCP_NODELAY; what a
    /// server's connections are); `unix`, an AF_UNIX stream socketpair (the
    /// same socket path without the TCP stack).
    ///
    /// With sockets the server end is the library's socket source, which
    /// dispatchers and task runtimes serve from one epoll set each (the
    /// kernel's ready list, reported as epoll_waits, kernel_found and peeks); a
    /// message is an 8-byte tag followed by the payload; each connection holds
    /// 6 file descriptors, and the soft RLIMIT_NOFILE is raised to the hard one
    /// when needed.
    #[arg(long, default_value = "channel", value_parser = ["channel", "socket", "unix"])]
    pub source: String,
    /// Connections (server ends) sharing the server cores.
    #[arg(long, default_value_t = 16)]
    pub conns: usize,
    /// Server cores (the last K CPUs); the client runs on the first CPU.
    #[arg(long, default_value_t = 1)]
    pub cores: usize,
    /// Client threads, one per CPU from the first
    ///
    /// Client threads, each pinned to its own CPU from the first on and each
    /// driving every M-th connection (with the `latency` load, one request
    /// outstanding per client thread), so that K server cores can be loaded:
    /// one busy-polling client drives about one server core. With --cores K
    /// above 1 the run then also measures each mode on one core, with one
    /// client and N/K connections, and prints round trips per second per
    /// server core and the scaling against that one core (1.0 = linear).
    #[arg(long, default_value_t = 1, value_name = "M")]
    pub clients: usize,
    /// One request in flight in all (latency) or per connection
    ///
    /// `latency` (one request outstanding in total) or `throughput` (one per
    /// connection).
    #[arg(long, default_value = "latency", value_parser = ["latency", "throughput"])]
    pub load: String,
    /// Server arrangements to compare, comma separated
    ///
    /// interrupt, poll, hybrid[:DURATION], adaptive[:OPTIONS]: a thread per
    /// connection waiting in that mode (docs/reference/grammar.md);
    ///
    /// tasks: a task per connection on a runtime per core. tasks:noprefetch
    /// turns off the prefetch of a ready source's next slot before the switch
    /// into its task (channels only); tasks:scan turns off ready notices and
    /// the kernel ready list: every source is peeked every pass, a socket with
    /// one poll;
    ///
    /// threads[:idle|fifo|yield|normal|cross][:norelay][:adaptive][:scan]: a
    /// thread per connection in dispatch mode, a dispatcher per core scheduled
    /// SCHED_IDLE or as named. cross: the dispatcher runs on the client's CPU;
    /// norelay: waiters do not relay; adaptive: the threads wait in adaptive
    /// mode; scan: no ready notices, no kernel ready list;
    ///
    /// reference: one connection, both ends busy-polling;
    ///
    /// evloop: one thread per core polling all its connections, the floor for N
    /// connections on a core (with sockets it busy-polls one epoll set of them,
    /// as a hand-written epoll server does);
    ///
    /// oracle: one thread per core that waits on the next connection of the
    /// latency client's rotation only, the floor for N rotating connections, as
    /// no server that must find the ready one can beat it.
    #[arg(
        long,
        default_value = DEFAULT_MODES,
        value_parser = crate::bench::parse_mode_names
    )]
    pub mode: crate::bench::ModeList,
    /// Measured round trips per mode.
    #[arg(long, default_value_t = 20_000)]
    pub iters: u64,
    /// Unmeasured round trips at the start of every slice.
    #[arg(long, default_value_t = 300)]
    pub warmup: u64,
    /// Interleaving rounds (slices per mode).
    #[arg(long, default_value_t = 5)]
    pub rounds: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 8)]
    pub size: usize,
    /// Slots per channel ring (a power of two; channels only)
    ///
    /// Slots per channel ring (a power of two, 2 or more; channels only). Both
    /// loads keep at most one request in flight per connection, so a deeper
    /// ring only spreads the same traffic over more cache lines and pages.
    #[arg(long, default_value_t = 8)]
    pub capacity: u32,
    /// latency: rotate the request over the first M connections only
    ///
    /// `latency` load only: rotate the one request over the first M connections
    /// instead of all of them; the others stay open, idle and watched.
    /// Separates what a server pays for *watching* N sources (scan) from what
    /// it pays for requests *landing* on N sources (cache lines and pages that
    /// move between the cores).
    #[arg(long, value_name = "M")]
    pub rotate: Option<usize>,
    /// Idle threshold of dispatchers and task runtimes, µs (0 = never)
    ///
    /// Idle threshold in µs of the dispatchers (threads) and task runtimes
    /// (tasks): they sleep after this long without work (0 = never).
    #[arg(long, default_value_t = 2000)]
    pub idle_after_us: u64,
    /// Print latency against the number of connections
    ///
    /// Instead of one table, prints latency against the number of connections
    /// (1, 4, 16, 64, 256, 1024, up to --sweep-max) for the chosen modes
    /// (`poll` is left out when --mode is the default list: 256 spinning
    /// threads on one core take minutes). With sockets, a second table gives
    /// what each mode asked the kernel per round trip.
    #[arg(long)]
    pub sweep: bool,
    /// The largest number of connections `--sweep` measures.
    #[arg(long, default_value_t = 1024)]
    pub sweep_max: usize,
    /// Also measure the CPU an idle dispatcher and runtime use
    ///
    /// Also measures the CPU an idle dispatcher (threads) and an idle task
    /// runtime use over one second after the idle threshold, with --conns
    /// waiters and no traffic: one more line, after the table or the JSON (not
    /// with --sweep; channel waiters only, not run with sockets).
    #[arg(long)]
    pub idle_probe: bool,
    /// Print JSON (one object per row) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let load = match a.load.as_str() {
        "latency" => Load::Latency,
        "throughput" => Load::Throughput,
        other => {
            return Err(Fail::invalid(format!(
                "unknown load '{other}': expected latency or throughput"
            )));
        }
    };
    if a.conns == 0 || a.conns > 4096 {
        return Err(Fail::invalid("--conns must be between 1 and 4096"));
    }
    if a.iters == 0 || a.rounds == 0 || a.rounds > a.iters {
        return Err(Fail::invalid(
            "--iters must be at least 1 and --rounds between 1 and --iters",
        ));
    }
    if let Some(m) = a.rotate {
        if load != Load::Latency {
            return Err(Fail::invalid("--rotate applies to --load latency only"));
        }
        if m == 0 || (m > a.conns && !a.sweep) {
            return Err(Fail::invalid("--rotate must be between 1 and --conns"));
        }
    }
    if a.size > 1 << 16 {
        return Err(Fail::invalid("--size must be at most 65536"));
    }
    let layout = Layout::new(a.cores, a.clients)?;
    if a.clients > a.conns {
        return Err(Fail::invalid("--clients must be at most --conns"));
    }
    let modes = a
        .mode
        .iter()
        .map(|m| Mode::parse(m.trim()))
        .collect::<Result<Vec<_>>>()?;
    let idle_after = (a.idle_after_us > 0).then(|| Duration::from_micros(a.idle_after_us));
    let plan = Plan {
        load,
        conns: a.conns,
        iters: a.iters,
        warmup: a.warmup,
        rounds: a.rounds,
        size: a.size,
        idle_after,
        rotate: a.rotate,
    };
    let sweep: Vec<usize> = SWEEP.into_iter().filter(|&n| n <= a.sweep_max).collect();
    if a.sweep && sweep.is_empty() {
        return Err(Fail::invalid("--sweep-max must be at least 1"));
    }
    if a.source == "channel" {
        let cfg = ChanConfig {
            capacity: a.capacity,
            slot_size: a.size.max(1) as u32,
            doorbell: Doorbell::Futex,
        };
        let what = format!("rings of {} slots", a.capacity);
        return report_all(Channels(cfg), &what, &a, modes, plan, &layout, sweep);
    }
    let (family, what) = if a.source == "unix" {
        (Family::Unix, "AF_UNIX stream socketpairs")
    } else {
        (Family::Tcp, "loopback TCP connections (TCP_NODELAY)")
    };
    let what = format!("{what}, messages of an 8-byte tag + {} bytes", a.size);
    if modes.contains(&Mode::Tasks {
        prefetch: false,
        notices: true,
    }) {
        eprintln!(
            "note: with --source {}, tasks:noprefetch measures the same as tasks (a socket names no next slot to prefetch)",
            a.source
        );
    }
    let sweep = fit_sockets(&a, sweep)?;
    report_all(
        Sockets::new(family, a.size),
        &what,
        &a,
        modes,
        plan,
        &layout,
        sweep,
    )
}

/// Enough file descriptors for the most socket connections measured:
/// raise the soft limit if needed (one line on stderr when it was), fail
/// a run that cannot have them, and cut a sweep short at what fits (one
/// line saying so). Returns the sweep's points.
fn fit_sockets(a: &Args, sweep: Vec<usize>) -> Result<Vec<usize>> {
    let want = if a.sweep {
        sweep.iter().copied().max().unwrap_or(1)
    } else {
        a.conns
    };
    let (fits, note) = sockets::fit(want);
    let Some(note) = note else { return Ok(sweep) };
    if fits >= want {
        eprintln!("{note}");
        return Ok(sweep);
    }
    if !a.sweep {
        return Err(Fail::invalid(note));
    }
    let sweep: Vec<usize> = sweep.into_iter().filter(|&c| c <= fits).collect();
    if sweep.is_empty() {
        return Err(Fail::invalid(note));
    }
    eprintln!("{note}: the sweep stops at {}", sweep[sweep.len() - 1]);
    Ok(sweep)
}

/// Measure and print, over the connections `wire` makes (`what` says
/// what they are, for the banner).
fn report_all<W: Wire>(
    wire: W,
    what: &str,
    a: &Args,
    modes: Vec<Mode>,
    plan: Plan,
    layout: &Layout,
    sweep: Vec<usize>,
) -> Result<()> {
    let load = plan.load;
    let source = wire.name();
    let sockets = source != "channel";
    let note = format!(
        "{}; server ends on CPU(s) {:?}; {what}; one-way latency = RTT/2; cpu/op = CPU µs per round trip, client+servers (incl. dispatchers){}",
        match layout.client_cpus.as_slice() {
            [one] => format!("client thread pinned to CPU {one} (busy-polling)"),
            many => format!(
                "{} client threads pinned to CPUs {many:?} (busy-polling; thread c drives connections c, c+{}, ...)",
                many.len(),
                many.len()
            ),
        },
        layout.server_cpus,
        super::idle_note()
    );
    let note = match a.rotate {
        Some(m) => format!("{note}; the request rotates over the first {m} connection(s) only"),
        None => note,
    };
    if !a.sweep {
        let rows = measure_apart(wire.clone(), modes.clone(), plan, layout)?;
        // More than one server core: the same modes on one core, with one
        // client and the per-core share of the connections, for scaling.
        let one_core = if layout.server_cpus.len() > 1 {
            let k = layout.server_cpus.len();
            let one = Layout::new(1, 1)?;
            let plan1 = Plan {
                conns: (plan.conns / k).max(1),
                ..plan
            };
            Some(measure_apart(wire, modes, plan1, &one)?)
        } else {
            None
        };
        let rows = match &one_core {
            Some(base) => report::with_scaling(rows, base, layout.server_cpus.len()),
            None => rows,
        };
        if a.json {
            stats::print_json(&rows);
        } else {
            stats::print_table(
                &format!(
                    "fastwake bench share — source {source} — load {} — {} conns on {} core(s) — {note}",
                    load.name(),
                    a.conns,
                    a.cores
                ),
                &rows,
            );
            report::print_rates(&rows);
            if one_core.is_some() {
                report::print_scaling(&rows, layout.server_cpus.len());
            }
            if sockets {
                report::print_kernel_lists(&rows, plan.iters + plan.warmup * plan.rounds);
            }
            if load == Load::Latency {
                report::print_ratios(&rows, layout, a.conns)?;
            }
        }
        if a.idle_probe && sockets {
            eprintln!(
                "note: --idle-probe measures channel waiters only; not run with --source {source}"
            );
        } else if a.idle_probe {
            println!(
                "{}",
                idle_probe::idle_probe(layout, a.conns, plan.idle_after, Duration::from_secs(1))?
            );
        }
        return Ok(());
    }
    // The sweep: latency against the number of sources.
    let mut all = Vec::new();
    let sweep_modes: Vec<Mode> = if a.mode.join(",") == DEFAULT_MODES {
        // See --sweep.
        modes
            .into_iter()
            .filter(|m| *m != Mode::PerThread(WaitMode::Poll))
            .collect()
    } else {
        modes
    };
    for conns in sweep {
        let rows = measure_apart(
            wire.clone(),
            sweep_modes.clone(),
            Plan { conns, ..plan },
            layout,
        )?;
        all.push((conns, rows));
    }
    if a.json {
        let flat: Vec<Row> = all.into_iter().flat_map(|(_, r)| r).collect();
        stats::print_json(&flat);
        return Ok(());
    }
    report::print_sweep(
        &format!(
            "fastwake bench share --sweep — source {source} — load {} — one-way p50 / p99 µs against connections sharing {} core(s) — {note}",
            load.name(),
            a.cores
        ),
        &sweep_modes,
        &all,
    );
    if sockets {
        report::print_sweep_kernel_lists(
            &sweep_modes,
            &all,
            plan.iters + plan.warmup * plan.rounds,
        );
    }
    Ok(())
}

/// Measure on a thread of its own: measuring pins the thread to the
/// client's CPU, which must leave the caller's placement alone.
fn measure_apart<W: Wire>(
    wire: W,
    modes: Vec<Mode>,
    plan: Plan,
    layout: &Layout,
) -> Result<Vec<Row>> {
    let layout = layout.clone();
    std::thread::spawn(move || measure(&wire, &modes, &plan, &layout))
        .join()
        .map_err(|_| Fail::new(libc::EIO, "benchmark thread panicked"))?
}
