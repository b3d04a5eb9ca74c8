//! `fastwake bench share`: N connections whose server ends share K cores.
//!
//! Every connection is a pair of channels (request, response). The server
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
//! slice; servers are set up and torn down per slice so an idle mode never
//! steals CPU from the measured one).

use super::stats::{self, Row, Sample};
use fastwake::dispatch::{self, Dispatcher, Policy, Runtime, TaskConfig};
use fastwake::source::Source;
use fastwake::source::channel::{self, Config as ChanConfig, Doorbell, Receiver, Sender};
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Connections (server ends) sharing the server cores.
    #[arg(long, default_value_t = 16)]
    pub conns: usize,
    /// Server cores (the last K CPUs); the client runs on the first CPU.
    #[arg(long, default_value_t = 1)]
    pub cores: usize,
    /// `latency` (one request outstanding in total) or `throughput` (one
    /// per connection).
    #[arg(long, default_value = "latency")]
    pub load: String,
    /// Server arrangements to compare, comma separated: interrupt, poll,
    /// tasks, threads, threads:fifo, threads:yield, threads:normal,
    /// threads:cross, reference, evloop (one thread per core polling all
    /// its connections: the floor for N connections on a core). Add
    /// `:norelay` to a threads mode to turn the waiters' relay off;
    /// `tasks:noprefetch` turns off the prefetch of a ready source's next
    /// slot before the switch into its task.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "interrupt,poll,tasks,threads,reference"
    )]
    pub mode: Vec<String>,
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
    /// Slots per channel ring (a power of two, 2 or more). Both loads keep
    /// at most one request in flight per connection, so a deeper ring
    /// only spreads the same traffic over more cache lines and pages
    /// (8 and 64 measured the same at 16 connections, in alternating runs).
    #[arg(long, default_value_t = 8)]
    pub capacity: u32,
    /// `latency` load only: rotate the one request over the first M
    /// connections instead of all of them; the others stay open, idle and
    /// watched. Separates what a server pays for *watching* N sources
    /// (scan) from what it pays for requests *landing* on N sources
    /// (cache lines and pages that move between the cores).
    #[arg(long, value_name = "M")]
    pub rotate: Option<usize>,
    /// Dispatcher idle threshold in µs (0 = never sleep).
    #[arg(long, default_value_t = 2000)]
    pub idle_after_us: u64,
    /// Instead of one table, print latency against the number of
    /// connections (1, 4, 16, 64, 256) for the chosen modes (`poll` is
    /// left out unless named: 256 spinning threads on one core take
    /// minutes).
    #[arg(long)]
    pub sweep: bool,
    /// Also measure the CPU an idle dispatcher (threads) and an idle task
    /// runtime use over one second after the idle threshold, with --conns
    /// waiters and no traffic.
    #[arg(long)]
    pub idle_probe: bool,
    /// Print JSON (one object per row) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Latency,
    Throughput,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Latency => "latency",
            Load::Throughput => "throughput",
        }
    }
}

/// How the server ends are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A thread per connection, `WaitMode` given.
    PerThread(WaitMode),
    /// A thread per connection in dispatch mode, a dispatcher per core.
    Threads {
        policy: Policy,
        cross: bool,
        relay: bool,
        /// The threads wait in `adaptive` mode instead of `dispatch`: the
        /// controller decides per wait whether to use the dispatcher.
        adaptive: bool,
    },
    /// A task per connection on a runtime per core; `prefetch` as
    /// [`TaskConfig::prefetch`] (`tasks:noprefetch` measures what it saves).
    Tasks { prefetch: bool },
    /// One connection, both ends busy-polling: the floor.
    Reference,
    /// One thread per core busy-polling all its connections in a loop (a
    /// hand-written event loop): the floor for N connections on a core.
    EventLoop,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode> {
        let bad = || {
            Fail::invalid(format!(
                "unknown mode '{s}': expected interrupt, poll, hybrid[:BUDGET], adaptive[:OPTS], tasks[:noprefetch], threads[:idle|fifo|yield|normal|cross][:norelay][:adaptive], reference or evloop"
            ))
        };
        Ok(match s {
            "interrupt" => Mode::PerThread(WaitMode::Interrupt),
            "poll" => Mode::PerThread(WaitMode::Poll),
            "tasks" => Mode::Tasks { prefetch: true },
            "tasks:noprefetch" => Mode::Tasks { prefetch: false },
            "reference" => Mode::Reference,
            "evloop" => Mode::EventLoop,
            // Thread per connection in the library's spinning modes: what
            // spinning does when many waiters share a core.
            s if s.starts_with("hybrid") || s.starts_with("adaptive") => {
                Mode::PerThread(s.parse::<WaitMode>()?)
            }
            _ => {
                let mut parts = s.split(':');
                if parts.next() != Some("threads") {
                    return Err(bad());
                }
                let (mut policy, mut cross, mut relay, mut adaptive) =
                    (Policy::Idle, false, true, false);
                for p in parts {
                    match p {
                        "norelay" => relay = false,
                        "adaptive" => adaptive = true,
                        // SCHED_OTHER: on the client's core a SCHED_IDLE
                        // dispatcher would never run next to the
                        // busy-polling client.
                        "cross" => {
                            cross = true;
                            policy = Policy::Normal;
                        }
                        p => policy = Policy::parse(p).map_err(|_| bad())?,
                    }
                }
                Mode::Threads {
                    policy,
                    cross,
                    relay,
                    adaptive,
                }
            }
        })
    }

    fn label(&self) -> String {
        match self {
            Mode::PerThread(m) => m.name().to_string(),
            Mode::Threads {
                policy,
                cross,
                relay,
                adaptive,
            } => {
                let mut l = String::from("threads");
                if *adaptive {
                    l.push_str(":adaptive");
                }
                if *cross {
                    l.push_str(":cross");
                } else if *policy != Policy::Idle {
                    l.push(':');
                    l.push_str(policy.name());
                }
                if !relay {
                    l.push_str(":norelay");
                }
                l
            }
            Mode::Tasks { prefetch: true } => "tasks".into(),
            Mode::Tasks { prefetch: false } => "tasks:noprefetch".into(),
            Mode::Reference => "reference".into(),
            Mode::EventLoop => "evloop".into(),
        }
    }
}

/// Where things run.
#[derive(Debug, Clone)]
struct Layout {
    client_cpu: u32,
    server_cpus: Vec<u32>,
}

impl Layout {
    fn new(cores: usize) -> Result<Layout> {
        let n = fastwake::cpu::online() as usize;
        if cores == 0 || cores >= n {
            return Err(Fail::invalid(format!(
                "--cores must be between 1 and {} on this host ({n} CPUs; one is kept for the client)",
                n.saturating_sub(1)
            )));
        }
        Ok(Layout {
            client_cpu: 0,
            server_cpus: ((n - cores) as u32..n as u32).collect(),
        })
    }
}

/// The client's end of one connection.
struct ClientEnd {
    tx: Sender,
    rx: Receiver,
    sent: u64,
    received: u64,
}

/// How the server side's waits went (dispatch modes), for the report.
#[derive(Default, Clone, Copy)]
struct Counts {
    handoffs: u64,
    relays: u64,
    fallbacks: u64,
}

impl Counts {
    fn of(s: &fastwake::wait::WaitStats) -> Counts {
        Counts {
            handoffs: s.handoffs,
            relays: s.relays,
            fallbacks: s.dispatch_fallbacks,
        }
    }

    fn add(&mut self, o: Counts) {
        self.handoffs += o.handoffs;
        self.relays += o.relays;
        self.fallbacks += o.fallbacks;
    }
}

/// A running server arrangement for one slice.
struct Servers {
    threads: Vec<JoinHandle<Result<Counts>>>,
    clocks: Vec<libc::clockid_t>,
    dispatchers: Vec<Dispatcher>,
}

impl Servers {
    fn cpu_time(&self) -> Duration {
        let mut t: Duration = self.clocks.iter().map(|&c| clock_time(c)).sum();
        for d in &self.dispatchers {
            t += d.cpu_time().unwrap_or_default();
        }
        t
    }

    /// Wait for the server threads to finish (the client closed its ends).
    fn finish(self) -> Result<Counts> {
        let mut first = Ok(());
        let mut c = Counts::default();
        for t in self.threads {
            match t
                .join()
                .map_err(|_| Fail::new(libc::EIO, "server thread panicked"))
                .and_then(|r| r)
            {
                Ok(n) => c.add(n),
                Err(e) => {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        drop(self.dispatchers);
        first.map(|_| c)
    }
}

fn thread_clock() -> libc::clockid_t {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self is the calling thread; id is a valid out-pointer.
    let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    if r == 0 {
        id
    } else {
        libc::CLOCK_THREAD_CPUTIME_ID
    }
}

fn clock_time(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; an invalid id only makes it fail.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A peer close ends a server loop normally.
fn closed_ok(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.is_closed() => Ok(()),
        r => r,
    }
}

fn echo(rx: &mut Receiver, tx: &mut Sender, m: channel::Msg) -> Result<()> {
    let payload_len = m.len as usize;
    let mut buf = [0u8; 64];
    let n = payload_len.min(buf.len());
    buf[..n].copy_from_slice(&rx.payload()[..n]);
    if payload_len > buf.len() {
        let p = rx.payload().to_vec();
        return tx.send(m.tag, &p);
    }
    tx.send(m.tag, &buf[..n])
}

fn spawn_server(
    name: String,
    cpu: u32,
    clocks: &mpsc::Sender<libc::clockid_t>,
    f: impl FnOnce() -> Result<Counts> + Send + 'static,
) -> Result<JoinHandle<Result<Counts>>> {
    let clocks = clocks.clone();
    std::thread::Builder::new()
        .name(name)
        .stack_size(256 * 1024)
        .spawn(move || {
            fastwake::cpu::pin(cpu)?;
            let _ = clocks.send(thread_clock());
            drop(clocks);
            f()
        })
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn server thread: {e}")))
}

/// Start the servers of `mode` for `ends` (server side of each connection).
fn start(
    mode: Mode,
    ends: Vec<(Receiver, Sender)>,
    layout: &Layout,
    idle_after: Option<Duration>,
) -> Result<Servers> {
    let (ctx, crx) = mpsc::channel();
    let k = layout.server_cpus.len();
    let mut threads = Vec::new();
    let mut dispatchers = Vec::new();
    match mode {
        Mode::PerThread(_) | Mode::Threads { .. } | Mode::Reference => {
            let wm = match mode {
                Mode::PerThread(m) => m,
                Mode::Reference => WaitMode::Poll,
                Mode::Threads { adaptive: true, .. } => {
                    WaitMode::Adaptive(fastwake::adaptive::Config::DEFAULT)
                }
                _ => WaitMode::Dispatch,
            };
            if let Mode::Threads {
                policy,
                cross,
                relay,
                ..
            } = mode
            {
                for &cpu in &layout.server_cpus {
                    let mut cfg = dispatch::Config::new(cpu);
                    cfg.policy = policy;
                    if !relay {
                        cfg.relay = None;
                    }
                    cfg.idle_after = idle_after;
                    if cross {
                        cfg.run_on = Some(layout.client_cpu);
                    }
                    dispatchers.push(Dispatcher::start(cfg)?);
                }
            }
            for (j, (mut rx, mut tx)) in ends.into_iter().enumerate() {
                let cpu = layout.server_cpus[j % k];
                threads.push(spawn_server(format!("fw-srv{j}"), cpu, &ctx, move || {
                    let mut w = Waiter::new(wm);
                    closed_ok((|| loop {
                        let m = w.wait(&mut rx)?;
                        echo(&mut rx, &mut tx, m)?;
                    })())?;
                    Ok(Counts::of(&w.stats()))
                })?);
            }
        }
        Mode::EventLoop => {
            let mut per_core: Vec<Vec<(Receiver, Sender)>> = (0..k).map(|_| Vec::new()).collect();
            for (j, e) in ends.into_iter().enumerate() {
                per_core[j % k].push(e);
            }
            for (c, mut ends) in per_core.into_iter().enumerate() {
                let cpu = layout.server_cpus[c];
                threads.push(spawn_server(format!("fw-ev{c}"), cpu, &ctx, move || {
                    let mut n: u32 = 0;
                    while !ends.is_empty() {
                        n = n.wrapping_add(1);
                        let mut closed = None;
                        for (j, (rx, tx)) in ends.iter_mut().enumerate() {
                            // A close shows only through try_take.
                            if !rx.ready() && !n.is_multiple_of(1024) {
                                continue;
                            }
                            match rx.try_take() {
                                Ok(Some(m)) => echo(rx, tx, m)?,
                                Ok(None) => {}
                                Err(e) if e.is_closed() => closed = Some(j),
                                Err(e) => return Err(e),
                            }
                        }
                        if let Some(j) = closed {
                            ends.swap_remove(j);
                        }
                    }
                    Ok(Counts::default())
                })?);
            }
        }
        Mode::Tasks { prefetch } => {
            let mut per_core: Vec<Vec<(Receiver, Sender)>> = (0..k).map(|_| Vec::new()).collect();
            for (j, e) in ends.into_iter().enumerate() {
                per_core[j % k].push(e);
            }
            for (c, ends) in per_core.into_iter().enumerate() {
                let cpu = layout.server_cpus[c];
                threads.push(spawn_server(format!("fw-rt{c}"), cpu, &ctx, move || {
                    let mut rt = Runtime::new(TaskConfig {
                        idle_after,
                        prefetch,
                        ..TaskConfig::default()
                    })?;
                    for (mut rx, mut tx) in ends {
                        rt.spawn(move |cx| {
                            closed_ok((|| loop {
                                let m = cx.wait(&mut rx)?;
                                echo(&mut rx, &mut tx, m)?;
                            })())
                        })?;
                    }
                    let st = rt.run()?;
                    match rt.take_errors().into_iter().next() {
                        Some((i, e)) => Err(Fail::new(e.errno(), format!("task {i}: {e}"))),
                        None => Ok(Counts {
                            handoffs: st.handoffs,
                            ..Counts::default()
                        }),
                    }
                })?);
            }
        }
    }
    drop(ctx);
    let clocks: Vec<_> = crx.iter().take(threads.len()).collect();
    Ok(Servers {
        threads,
        clocks,
        dispatchers,
    })
}

/// What one slice measured.
#[derive(Default)]
struct Slice {
    client_cpu: Duration,
    server_cpu: Duration,
    wall: Duration,
    n: u64,
}

fn recv_poll(c: &mut ClientEnd) -> Result<()> {
    loop {
        if c.rx.ready()
            && let Some(m) = c.rx.try_take()?
        {
            return check(c, m);
        }
        std::hint::spin_loop();
    }
}

fn check(c: &mut ClientEnd, m: channel::Msg) -> Result<()> {
    if m.tag != c.received {
        return Err(Fail::new(
            libc::EPROTO,
            format!("reply tag {} where {} was expected", m.tag, c.received),
        ));
    }
    c.received += 1;
    Ok(())
}

fn send(c: &mut ClientEnd, payload: &[u8]) -> Result<()> {
    c.tx.send(c.sent, payload)?;
    c.sent += 1;
    Ok(())
}

/// Run the client side of one slice: `warmup` then `n` measured round trips.
fn drive(
    load: Load,
    clients: &mut [ClientEnd],
    servers: &Servers,
    payload: &[u8],
    warmup: u64,
    n: u64,
    sample: &mut Sample,
) -> Result<Slice> {
    let conns = clients.len();
    let mut out = Slice::default();
    match load {
        Load::Latency => {
            let mut next = 0usize;
            let mut one = |sample: Option<&mut Sample>| -> Result<()> {
                let c = &mut clients[next];
                next = (next + 1) % conns;
                let t0 = Instant::now();
                send(c, payload)?;
                recv_poll(c)?;
                if let Some(s) = sample {
                    s.record_rtt(t0.elapsed());
                }
                Ok(())
            };
            for _ in 0..warmup {
                one(None)?;
            }
            let (c0, s0, w0) = (
                fastwake::cpu::thread_cpu_time(),
                servers.cpu_time(),
                Instant::now(),
            );
            for _ in 0..n {
                one(Some(sample))?;
            }
            out.wall = w0.elapsed();
            out.client_cpu = fastwake::cpu::thread_cpu_time() - c0;
            out.server_cpu = servers.cpu_time() - s0;
        }
        Load::Throughput => {
            let mut t0 = vec![Instant::now(); conns];
            for (i, c) in clients.iter_mut().enumerate() {
                t0[i] = Instant::now();
                send(c, payload)?;
            }
            let total = warmup + n;
            let mut sent = conns as u64;
            let mut done = 0u64;
            let mut start = None;
            while done < total {
                for (i, c) in clients.iter_mut().enumerate() {
                    if !c.rx.ready() {
                        continue;
                    }
                    let Some(m) = c.rx.try_take()? else { continue };
                    check(c, m)?;
                    done += 1;
                    if done == warmup {
                        start = Some((
                            fastwake::cpu::thread_cpu_time(),
                            servers.cpu_time(),
                            Instant::now(),
                        ));
                    }
                    if done > warmup {
                        sample.record_rtt(t0[i].elapsed());
                    }
                    if sent < total {
                        t0[i] = Instant::now();
                        send(c, payload)?;
                        sent += 1;
                    }
                }
            }
            let (c0, s0, w0) = start.unwrap_or((
                fastwake::cpu::thread_cpu_time(),
                servers.cpu_time(),
                Instant::now(),
            ));
            out.wall = w0.elapsed();
            out.client_cpu = fastwake::cpu::thread_cpu_time() - c0;
            out.server_cpu = servers.cpu_time() - s0;
        }
    }
    out.n = n;
    Ok(out)
}

struct Plan {
    load: Load,
    conns: usize,
    iters: u64,
    warmup: u64,
    rounds: u64,
    size: usize,
    capacity: u32,
    idle_after: Option<Duration>,
    /// Latency load: connections the request rotates over (None: all).
    rotate: Option<usize>,
}

/// Measure `modes` interleaved; one row each.
fn measure(modes: &[Mode], plan: &Plan, layout: &Layout) -> Result<Vec<Row>> {
    fastwake::cpu::pin(layout.client_cpu)?;
    let payload = vec![0x5au8; plan.size];
    let cfg = ChanConfig {
        capacity: plan.capacity,
        slot_size: plan.size.max(1) as u32,
        doorbell: Doorbell::Futex,
    };
    let mut samples: Vec<Sample> = modes.iter().map(|_| Sample::new()).collect();
    let mut totals: Vec<Slice> = modes.iter().map(|_| Slice::default()).collect();
    let mut counts: Vec<Counts> = modes.iter().map(|_| Counts::default()).collect();
    // Each round's p50 per mode: modes run side by side within a round,
    // so per-round ratios show how steady a ratio is on a host whose
    // speed drifts between minutes.
    let mut round_p50: Vec<Vec<f64>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..plan.rounds {
        let n = plan.iters / plan.rounds + u64::from(round < plan.iters % plan.rounds);
        for (i, &mode) in modes.iter().enumerate() {
            let conns = if mode == Mode::Reference {
                1
            } else {
                plan.conns
            };
            let mut clients = Vec::with_capacity(conns);
            let mut ends = Vec::with_capacity(conns);
            for _ in 0..conns {
                let (req_tx, req_rx) = channel::channel(cfg)?;
                let (resp_tx, resp_rx) = channel::channel(cfg)?;
                clients.push(ClientEnd {
                    tx: req_tx,
                    rx: resp_rx,
                    sent: 0,
                    received: 0,
                });
                ends.push((req_rx, resp_tx));
            }
            let servers = start(mode, ends, layout, plan.idle_after)?;
            let active = plan.rotate.unwrap_or(conns).min(conns);
            let mut this_round = Sample::new();
            let r = drive(
                plan.load,
                &mut clients[..active],
                &servers,
                &payload,
                plan.warmup,
                n,
                &mut this_round,
            );
            samples[i].merge(&this_round);
            round_p50[i].push(this_round.p50_us());
            // Closing the client ends stops the servers.
            drop(clients);
            let fin = servers.finish();
            let s = r?;
            counts[i].add(fin?);
            let t = &mut totals[i];
            t.client_cpu += s.client_cpu;
            t.server_cpu += s.server_cpu;
            t.wall += s.wall;
            t.n += s.n;
        }
    }
    Ok(modes
        .iter()
        .zip(samples.iter().zip(totals))
        .zip(counts)
        .zip(round_p50)
        .map(|(((m, (s, t)), c), rp)| {
            let conns = if *m == Mode::Reference { 1 } else { plan.conns };
            let mut row = Row::from_sample(
                "channel",
                &m.label(),
                "cross",
                plan.size,
                s,
                t.client_cpu,
                t.server_cpu,
            );
            let rate = if t.wall.is_zero() {
                0.0
            } else {
                t.n as f64 / t.wall.as_secs_f64()
            };
            row.extra.insert("conns".into(), conns.into());
            row.extra
                .insert("cores".into(), layout.server_cpus.len().into());
            row.extra.insert("load".into(), plan.load.name().into());
            row.extra.insert("handoffs".into(), c.handoffs.into());
            row.extra.insert("relays".into(), c.relays.into());
            row.extra.insert("round_p50".into(), rp.into());
            row.extra
                .insert("dispatch_fallbacks".into(), c.fallbacks.into());
            row.extra.insert(
                "rtt_per_s".into(),
                serde_json::Number::from_f64(rate.round())
                    .map(serde_json::Value::Number)
                    .unwrap_or(serde_json::Value::Null),
            );
            row
        })
        .collect())
}

fn print_rates(rows: &[Row]) {
    println!(
        " {:<16} {:>6} {:>6} {:>12} {:>10} {:>10} {:>10}",
        "mode", "conns", "cores", "rtt/s", "handoffs", "relays", "fallbacks"
    );
    let get = |r: &Row, k: &str| r.extra.get(k).map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        println!(
            " {:<16} {:>6} {:>6} {:>12} {:>10} {:>10} {:>10}",
            r.mode,
            get(r, "conns"),
            get(r, "cores"),
            get(r, "rtt_per_s"),
            get(r, "handoffs"),
            get(r, "relays"),
            get(r, "dispatch_fallbacks")
        );
    }
}

/// The ratios, from this run's p50s, and the kernel's floor for
/// waking threads on one core.
fn print_ratios(rows: &[Row], layout: &Layout, conns: usize) -> Result<()> {
    let p50 = |m: &str| rows.iter().find(|r| r.mode == m).map(|r| r.t_typical);
    let rounds = |m: &str| -> Vec<f64> {
        rows.iter()
            .find(|r| r.mode == m)
            .and_then(|r| r.extra.get("round_p50"))
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    let line = |a: &str, b: &str| {
        if let (Some(x), Some(y)) = (p50(a), p50(b))
            && y > 0.0
        {
            print!(" p50 {a} / {b} = {:.3} / {:.3} = {:.2}", x, y, x / y);
            let mut per: Vec<f64> = rounds(a)
                .iter()
                .zip(rounds(b))
                .filter(|(_, d)| *d > 0.0)
                .map(|(n, d)| n / d)
                .collect();
            if per.len() >= 2 {
                per.sort_by(f64::total_cmp);
                print!(
                    "  (per round, {} rounds: median {:.2}, range {:.2}-{:.2})",
                    per.len(),
                    per[per.len() / 2],
                    per[0],
                    per[per.len() - 1]
                );
            }
            println!();
        }
    };
    line("tasks", "reference");
    line("tasks", "evloop");
    line("tasks", "interrupt");
    line("tasks", "tasks:noprefetch");
    line("threads", "interrupt");
    line("threads", "threads:norelay");
    if p50("threads").is_some() && conns >= 2 {
        // What any design that wakes one kernel thread per request pays on
        // this host: the same-core futex hand-off between `conns` threads.
        let cpu = layout.server_cpus[0];
        let hop = futex_ring(conns.min(64), cpu, 20_000)?;
        println!(
            " kernel reference: a futex hand-off in a ring of {} threads on CPU {cpu} takes {:.3} µs (median of 3 rings); threads pays one per round trip, i.e. ~{:.3} µs of one-way latency",
            conns.min(64),
            hop.as_secs_f64() * 1e6,
            hop.as_secs_f64() * 1e6 / 2.0
        );
    }
    Ok(())
}

/// Median time of one hand-off in a ring of `n` threads pinned to `cpu`,
/// each waking the next through a futex and then sleeping on its own: the
/// kernel path a dispatch-mode hand-off cannot avoid.
fn futex_ring(n: usize, cpu: u32, hops: u64) -> Result<Duration> {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    fn wait(w: &AtomicU32, seen: u32) {
        // SAFETY: w is a live, aligned u32 for the duration of the call;
        // the kernel only reads it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                std::ptr::null::<libc::timespec>(),
            )
        };
    }
    fn wake(w: &AtomicU32) {
        w.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as in `wait`; FUTEX_WAKE does not touch the word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
    }
    let mut runs = Vec::new();
    for _ in 0..3 {
        let words: std::sync::Arc<Vec<AtomicU32>> =
            std::sync::Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
        let count = std::sync::Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<()>();
        let mut hs = Vec::new();
        for i in 0..n {
            let (words, count, tx) = (words.clone(), count.clone(), tx.clone());
            hs.push(std::thread::spawn(move || -> Result<()> {
                fastwake::cpu::pin(cpu)?;
                let mut seen = 0;
                let _ = tx.send(());
                drop(tx);
                loop {
                    let w = &words[i];
                    while w.load(Ordering::SeqCst) == seen {
                        wait(w, seen);
                    }
                    seen = w.load(Ordering::SeqCst);
                    if count.fetch_add(1, Ordering::SeqCst) >= hops {
                        words.iter().for_each(wake);
                        return Ok(());
                    }
                    wake(&words[(i + 1) % n]);
                }
            }));
        }
        drop(tx);
        for _ in 0..n {
            let _ = rx.recv();
        }
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        wake(&words[0]);
        for h in hs {
            h.join()
                .map_err(|_| Fail::new(libc::EIO, "ring thread panicked"))??;
        }
        runs.push(t0.elapsed() / hops as u32);
    }
    runs.sort();
    Ok(runs[1])
}

/// CPU used over `window` by an idle dispatcher serving `conns` waiting
/// threads, and by an idle runtime of `conns` tasks, after `idle_after`.
fn idle_probe(
    layout: &Layout,
    conns: usize,
    idle_after: Option<Duration>,
    window: Duration,
) -> Result<String> {
    let cpu = layout.server_cpus[0];
    let cfg = ChanConfig::default();
    let settle = idle_after.unwrap_or_default() + Duration::from_millis(50);
    // Threads.
    let mut dcfg = dispatch::Config::new(cpu);
    dcfg.idle_after = idle_after;
    let d = Dispatcher::start(dcfg)?;
    let mut txs = Vec::new();
    let (ctx, _crx) = mpsc::channel();
    let mut threads = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..conns {
        let (tx, rx) = channel::channel(cfg)?;
        txs.push(tx);
        rxs.push(rx);
    }
    for (j, mut rx) in rxs.into_iter().enumerate() {
        threads.push(spawn_server(format!("fw-idle{j}"), cpu, &ctx, move || {
            let mut w = Waiter::new(WaitMode::Dispatch);
            closed_ok(w.wait(&mut rx).map(|_| ()))?;
            Ok(Counts::of(&w.stats()))
        })?);
    }
    std::thread::sleep(settle);
    let state_d = d.state();
    let c0 = d.cpu_time().unwrap_or_default();
    std::thread::sleep(window);
    let used_d = d.cpu_time().unwrap_or_default().saturating_sub(c0);
    drop(txs);
    for t in threads {
        let _ = t.join();
    }
    drop(d);
    // Tasks.
    let (clk_tx, clk_rx) = mpsc::channel();
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..conns {
        let (tx, rx) = channel::channel(cfg)?;
        txs.push(tx);
        rxs.push(rx);
    }
    let rt_thread = std::thread::spawn(move || -> Result<()> {
        fastwake::cpu::pin(cpu)?;
        let mut rt = Runtime::new(TaskConfig {
            idle_after,
            ..TaskConfig::default()
        })?;
        for mut rx in rxs {
            rt.spawn(move |cx| closed_ok(cx.wait(&mut rx).map(|_| ())))?;
        }
        let _ = clk_tx.send((thread_clock(), rt.state()));
        rt.run()?;
        Ok(())
    });
    let (clk, st) = clk_rx
        .recv()
        .map_err(|_| Fail::new(libc::EIO, "task runtime failed to start"))?;
    std::thread::sleep(settle);
    let state_t = st.get();
    let c0 = clock_time(clk);
    std::thread::sleep(window);
    let used_t = clock_time(clk).saturating_sub(c0);
    drop(txs);
    let _ = rt_thread.join();
    Ok(format!(
        "idle probe ({conns} waiters, no traffic, idle threshold {}): dispatcher for threads {:?}, {:.1} µs CPU in {:?}; task runtime {:?}, {:.1} µs CPU in {:?}",
        idle_after.map_or("off".to_string(), |d| format!("{} µs", d.as_micros())),
        state_d,
        used_d.as_nanos() as f64 / 1000.0,
        window,
        state_t,
        used_t.as_nanos() as f64 / 1000.0,
        window
    ))
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
    let layout = Layout::new(a.cores)?;
    let modes = a
        .mode
        .iter()
        .map(|m| Mode::parse(m.trim()))
        .collect::<Result<Vec<_>>>()?;
    let idle_after = (a.idle_after_us > 0).then(|| Duration::from_micros(a.idle_after_us));
    let note = format!(
        "client thread pinned to CPU {} (busy-polling); server ends on CPU(s) {:?}; rings of {} slots; one-way latency = RTT/2; cpu/op = CPU µs per round trip, client+servers (incl. dispatchers){}",
        layout.client_cpu,
        layout.server_cpus,
        a.capacity,
        super::idle_note()
    );
    let note = match a.rotate {
        Some(m) => format!("{note}; the request rotates over the first {m} connection(s) only"),
        None => note,
    };
    // Measuring runs on a thread of its own, so pinning it leaves the
    // caller alone.
    let plan = Plan {
        load,
        conns: a.conns,
        iters: a.iters,
        warmup: a.warmup,
        rounds: a.rounds,
        size: a.size,
        capacity: a.capacity,
        idle_after,
        rotate: a.rotate,
    };
    if !a.sweep {
        let l2 = layout.clone();
        let rows = std::thread::spawn(move || measure(&modes, &plan, &l2))
            .join()
            .map_err(|_| Fail::new(libc::EIO, "benchmark thread panicked"))??;
        if a.json {
            stats::print_json(&rows);
        } else {
            stats::print_table(
                &format!(
                    "fastwake bench share — source channel — load {} — {} conns on {} core(s) — {note}",
                    load.name(),
                    a.conns,
                    a.cores
                ),
                &rows,
            );
            print_rates(&rows);
            if load == Load::Latency {
                print_ratios(&rows, &layout, a.conns)?;
            }
        }
        if a.idle_probe {
            println!(
                "{}",
                idle_probe(&layout, a.conns, idle_after, Duration::from_secs(1))?
            );
        }
        return Ok(());
    }
    // The sweep: latency against the number of sources.
    let mut all = Vec::new();
    let sweep_modes: Vec<Mode> = if a.mode.len() == 5 && a.mode.iter().any(|m| m == "poll") {
        // The default list: drop poll (see --sweep).
        modes
            .into_iter()
            .filter(|m| *m != Mode::PerThread(WaitMode::Poll))
            .collect()
    } else {
        modes
    };
    for conns in [1usize, 4, 16, 64, 256] {
        let p = Plan { conns, ..plan };
        let (m2, l2) = (sweep_modes.clone(), layout.clone());
        let rows = std::thread::spawn(move || measure(&m2, &p, &l2))
            .join()
            .map_err(|_| Fail::new(libc::EIO, "benchmark thread panicked"))??;
        all.push((conns, rows));
    }
    if a.json {
        let flat: Vec<Row> = all.into_iter().flat_map(|(_, r)| r).collect();
        stats::print_json(&flat);
        return Ok(());
    }
    println!(
        "fastwake bench share --sweep — source channel — load {} — one-way p50 / p99 µs against connections sharing {} core(s) — {note}",
        load.name(),
        a.cores
    );
    let mut head = format!(" {:>7}", "sources");
    for m in &sweep_modes {
        head += &format!(" {:>22}", format!("{} p50/p99", m.label()));
    }
    println!("{head}");
    for (conns, rows) in &all {
        let mut line = format!(" {:>7}", conns);
        for r in rows {
            line += &format!(" {:>22}", format!("{:.3} / {:.3}", r.t_typical, r.p99));
        }
        println!("{line}");
    }
    Ok(())
}
