//! `fastwake bench fetch`: fetching objects by key over RDMA by one READ
//! (address cached), two dependent READs, an RPC, and adaptive, per
//! object size, in three scenarios interleaved over rounds: the server idle,
//! a CPU hog on the server's RPC core, and a bulk flow beside (64 KiB READs
//! back to back from another connection on the same device). Per cell:
//! p50/p99 latency, the client's CPU per fetch, the RPC thread's CPU per
//! fetch, and for adaptive the paths it took.
//!
//! One process on one device (the server, its RPC thread and the clients),
//! as `bench odp`: on Soft-RoCE the figures are relative only.

use super::parse_cpus;
use fastwake::fetch::{self, Client, ClientConfig, Path, Policy, Server, ServerConfig};
use fastwake::source::verbs::Device;
use fastwake::{Fail, Result, WaitMode};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// RDMA device (default: the first).
    #[arg(long)]
    pub dev: Option<String>,
    /// Object sizes in bytes (comma separated; at most 64 KiB).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,64,512,4096,16384,65536"
    )]
    pub sizes: Vec<usize>,
    /// Paths: read, read2, rpc, adaptive[:OPTIONS] (comma separated).
    ///
    /// `adaptive` takes the chooser's options, e.g. `adaptive:cap=20%` (the
    /// client's CPU per fetch at most 20 % of its latency) or
    /// `adaptive:paths=read2+rpc`.
    #[arg(long, default_value = "read,read2,rpc,adaptive")]
    pub paths: String,
    /// Scenarios: idle, hog (a CPU hog on the RPC thread's core), bulk (a
    /// flow of 64 KiB READs beside).
    #[arg(long, value_delimiter = ',', default_value = "idle,hog,bulk")]
    pub scenarios: Vec<String>,
    /// Measured fetches per cell (scenario, size, path), over all rounds.
    #[arg(short = 'n', long, default_value_t = 2000)]
    pub fetches: u64,
    /// Interleaving rounds.
    #[arg(long, default_value_t = 4)]
    pub rounds: u64,
    /// CPUs `CLIENT,SERVER`: the fetching thread and the server's RPC
    /// thread (the hog runs on the second).
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    pub cpus: (u32, u32),
    /// How the server's RPC thread waits (default: poll, the RoCE study's
    /// polling server).
    #[arg(long, default_value = "poll")]
    pub server_mode: WaitMode,
    /// Nice value of the server's RPC thread (0..19).
    ///
    /// At 19 a hog on its core wins the CPU whenever it runs, whatever the
    /// scheduler's luck with a polling thread that yields (it changes
    /// nothing while the RPC thread is alone on its core).
    #[arg(long, default_value_t = 0)]
    pub rpc_nice: i32,
    /// How the client waits for its completions.
    #[arg(long, default_value = "hybrid")]
    pub client_mode: WaitMode,
    /// Print JSON (one object per cell) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON into FILE (the table still prints).
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<std::path::PathBuf>,
    /// After the table, the adaptive client's chooser: per size class, the
    /// path in use, fetches per path, switches and the estimates.
    #[arg(long)]
    pub explain: bool,
}

const SCENARIOS: [&str; 3] = ["idle", "hog", "bulk"];
/// Keys per size (fetched in turn).
const KEYS_PER_SIZE: u64 = 4;
/// The bulk flow's object.
const BULK_KEY: u64 = 1 << 40;
const BULK_SIZE: usize = 64 << 10;

struct Cell {
    scenario: usize,
    size: usize,
    /// Index into the path list.
    path: usize,
    lat: Histogram<u64>,
    client_cpu: Duration,
    server_cpu: Duration,
    /// Fetches by each path (adaptive's choices; fixed: all one).
    took: [u64; 3],
}

impl Cell {
    fn fetches(&self) -> u64 {
        self.lat.len()
    }

    fn per_fetch_us(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.fetches().max(1) as f64
    }

    fn took(&self) -> String {
        let n = self.took.iter().sum::<u64>().max(1) as f64;
        let mut parts: Vec<(u64, Path)> = fetch::chooser::PATHS
            .iter()
            .map(|&p| (self.took[p as usize], p))
            .filter(|(c, _)| *c > 0)
            .collect();
        parts.sort_by_key(|b| std::cmp::Reverse(b.0));
        parts
            .iter()
            .map(|(c, p)| format!("{} {:.0}%", p.name(), *c as f64 * 100.0 / n))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What runs beside the fetches in a scenario.
struct Beside {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Beside {
    fn start(
        scenario: &str,
        server_cpu: u32,
        bulk: &Option<Arc<std::sync::Mutex<Client>>>,
    ) -> Beside {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        match scenario {
            "hog" => {
                let s = stop.clone();
                threads.push(std::thread::spawn(move || {
                    let _ = fastwake::cpu::pin(server_cpu);
                    let mut x = 0u64;
                    while !s.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                }));
            }
            "bulk" => {
                let (s, c) = (stop.clone(), bulk.clone().expect("a bulk client"));
                threads.push(std::thread::spawn(move || {
                    let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
                    let mut out = Vec::with_capacity(BULK_SIZE);
                    while !s.load(Ordering::Relaxed) {
                        if c.fetch_by(BULK_KEY, Some(Path::Read), &mut out).is_err() {
                            break;
                        }
                    }
                }));
            }
            _ => {}
        }
        Beside { stop, threads }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn key(size_idx: usize, i: u64) -> u64 {
    size_idx as u64 * 1000 + i % KEYS_PER_SIZE + 1
}

fn object(k: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k as usize * 7 + i) as u8).collect()
}

pub fn run(a: Args) -> Result<()> {
    let policies: Vec<Policy> = fastwake::grammar::split_modes(&a.paths)
        .iter()
        .map(|p| p.parse())
        .collect::<Result<_>>()?;
    if policies.is_empty() {
        return Err(Fail::invalid("--paths names no path"));
    }
    for s in &a.scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(Fail::invalid(format!(
                "unknown scenario '{s}': expected idle, hog or bulk"
            )));
        }
    }
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s > 64 << 10) {
        return Err(Fail::invalid("--sizes must be between 1 byte and 64 KiB"));
    }
    if !(0..=19).contains(&a.rpc_nice) {
        return Err(Fail::invalid("--rpc-nice must be between 0 and 19"));
    }
    if a.fetches == 0 || a.rounds == 0 || a.rounds > a.fetches {
        return Err(Fail::invalid(
            "--fetches and --rounds must be at least 1, and --rounds at most --fetches",
        ));
    }
    let dev = Device::open(a.dev.as_deref(), None).map_err(|e| {
        Fail::new(
            e.errno(),
            format!("bench fetch needs an RDMA verbs device: {}", e.cause()),
        )
    })?;
    let dev = Arc::new(dev);
    let server = Server::new(
        &dev,
        ServerConfig {
            mode: a.server_mode,
            cpu: Some(a.cpus.1),
            ..ServerConfig::default()
        },
    )?;
    for (i, &size) in a.sizes.iter().enumerate() {
        for j in 0..KEYS_PER_SIZE {
            let k = key(i, j);
            server.put(k, &object(k, size))?;
        }
    }
    server.put(BULK_KEY, &object(BULK_KEY, BULK_SIZE))?;
    let client_cfg = |policy: Policy| ClientConfig {
        policy,
        mode: a.client_mode,
        timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    // One client per path (fixed paths share one), each with its own
    // chooser; the bulk flow has its own connection.
    let mut clients: Vec<Client> = Vec::new();
    for p in &policies {
        clients.push(fetch::connect(&server, &dev, client_cfg(*p))?);
    }
    let bulk = if a.scenarios.iter().any(|s| s == "bulk") {
        let mut c = fetch::connect(&server, &dev, client_cfg(Policy::fixed(Path::Read)))?;
        let mut out = Vec::new();
        c.fetch_into(BULK_KEY, &mut out)?;
        Some(Arc::new(std::sync::Mutex::new(c)))
    } else {
        None
    };
    let scen: Vec<usize> = a
        .scenarios
        .iter()
        .map(|s| SCENARIOS.iter().position(|x| x == s).expect("checked"))
        .collect();
    let mut cells = Vec::new();
    for &s in &scen {
        for &size in &a.sizes {
            for p in 0..policies.len() {
                cells.push(Cell {
                    scenario: s,
                    size,
                    path: p,
                    lat: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
                    client_cpu: Duration::ZERO,
                    server_cpu: Duration::ZERO,
                    took: [0; 3],
                });
            }
        }
    }
    let rpc_tid = server.rpc_tid();
    if a.rpc_nice != 0 {
        let tid = rpc_tid.ok_or_else(|| Fail::new(libc::ESRCH, "the RPC thread did not start"))?;
        // SAFETY: setpriority on one of this process's own threads.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, a.rpc_nice) } != 0 {
            return Err(Fail::new(
                libc::EPERM,
                format!(
                    "--rpc-nice {}: {}",
                    a.rpc_nice,
                    std::io::Error::last_os_error()
                ),
            ));
        }
    }
    let names: Vec<String> = policies.iter().map(Policy::name).collect();
    let fetcher = std::thread::spawn(move || -> Result<(Vec<Cell>, Vec<Client>)> {
        fastwake::cpu::pin(a.cpus.0)?;
        let mut out = Vec::with_capacity(64 << 10);
        // Warm: every key once per client (addresses cached, estimates
        // seeded), unmeasured.
        for c in clients.iter_mut() {
            for i in 0..a.sizes.len() {
                for j in 0..KEYS_PER_SIZE {
                    c.fetch_into(key(i, j), &mut out)?;
                }
            }
        }
        let per_size = policies.len();
        let per_scen = a.sizes.len() * per_size;
        for round in 0..a.rounds {
            let n = a.fetches / a.rounds + u64::from(round < a.fetches % a.rounds);
            for si in 0..scen.len() {
                let s = (si + round as usize) % scen.len();
                let beside = Beside::start(SCENARIOS[scen[s]], a.cpus.1, &bulk);
                // Let the load word see the change.
                std::thread::sleep(Duration::from_millis(50));
                for z in 0..a.sizes.len() {
                    for pi in 0..per_size {
                        let p = (pi + round as usize) % per_size;
                        let cell = &mut cells[s * per_scen + z * per_size + p];
                        let c = &mut clients[p];
                        let fixed = policies[p].fixed;
                        let cpu0 = fastwake::cpu::thread_cpu_time();
                        let srv0 = thread_cpu(rpc_tid);
                        for i in 0..n {
                            let t = Instant::now();
                            let (found, took) = c.fetch_by(key(z, i), fixed, &mut out)?;
                            cell.lat
                                .record(t.elapsed().as_nanos().max(1) as u64)
                                .map_err(|e| Fail::invalid(format!("histogram: {e}")))?;
                            if !found || out.len() != a.sizes[z] {
                                return Err(Fail::new(
                                    libc::EPROTO,
                                    format!("bench fetch: key {} came back wrong", key(z, i)),
                                ));
                            }
                            cell.took[took as usize] += 1;
                        }
                        cell.client_cpu += fastwake::cpu::thread_cpu_time().saturating_sub(cpu0);
                        cell.server_cpu += thread_cpu(rpc_tid).saturating_sub(srv0);
                    }
                }
                beside.stop();
            }
        }
        Ok((cells, clients))
    });
    let (cells, clients) = fetcher
        .join()
        .map_err(|_| Fail::new(libc::EIO, "the fetching thread panicked"))??;
    let note = format!(
        "device {}; client on CPU {}, server RPC thread on CPU {} ({}, nice {}), client waits {}; {} fetches per cell over {} rounds; cpu = thread CPU per fetch (server: the RPC thread's)",
        dev.name(),
        a.cpus.0,
        a.cpus.1,
        a.server_mode,
        a.rpc_nice,
        a.client_mode,
        a.fetches,
        a.rounds
    );
    let json = to_json(&cells, &names, &note)?;
    if let Some(f) = &a.json_file {
        std::fs::write(f, &json)
            .map_err(|e| Fail::new(libc::EIO, format!("{}: {e}", f.display())))?;
    }
    if a.json {
        println!("{json}");
    } else {
        print_table(&cells, &names, &note);
    }
    if a.explain {
        for (c, n) in clients.iter().zip(&names) {
            if c.chooser().policy().fixed.is_none() {
                println!("{n}: {}", c.explain());
            }
        }
    }
    drop(clients);
    if let Some(e) = server.failed() {
        return Err(e);
    }
    Ok(())
}

/// A thread's CPU time so far, from its schedstat (zero if unreadable).
fn thread_cpu(tid: Option<i32>) -> Duration {
    let ns = tid
        .and_then(|t| std::fs::read_to_string(format!("/proc/self/task/{t}/schedstat")).ok())
        .and_then(|s| s.split_ascii_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn size_label(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} B")
    }
}

fn print_table(cells: &[Cell], names: &[String], note: &str) {
    println!("fastwake bench fetch — {note}");
    println!(
        "| scenario | size | path | fetches | p50 us | p99 us | client cpu us | server cpu us | took |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---|");
    for c in cells {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
            SCENARIOS[c.scenario],
            size_label(c.size),
            names[c.path],
            c.fetches(),
            c.lat.value_at_quantile(0.5) as f64 / 1e3,
            c.lat.value_at_quantile(0.99) as f64 / 1e3,
            c.per_fetch_us(c.client_cpu),
            c.per_fetch_us(c.server_cpu),
            c.took()
        );
    }
}

fn to_json(cells: &[Cell], names: &[String], note: &str) -> Result<String> {
    let run = serde_json::to_value(crate::meta::RunMeta::now())
        .map_err(|e| Fail::new(libc::EIO, e.to_string()))?;
    let rows: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            serde_json::json!({
                "scenario": SCENARIOS[c.scenario],
                "size_bytes": c.size,
                "path": names[c.path],
                "fetches": c.fetches(),
                "p50_us": c.lat.value_at_quantile(0.5) as f64 / 1e3,
                "p99_us": c.lat.value_at_quantile(0.99) as f64 / 1e3,
                "client_cpu_us_per_fetch": c.per_fetch_us(c.client_cpu),
                "server_cpu_us_per_fetch": c.per_fetch_us(c.server_cpu),
                "took": {
                    "read": c.took[0],
                    "read2": c.took[1],
                    "rpc": c.took[2],
                },
                "placement": note,
                "run": run,
            })
        })
        .collect();
    serde_json::to_string_pretty(&rows).map_err(|e| Fail::new(libc::EIO, e.to_string()))
}
