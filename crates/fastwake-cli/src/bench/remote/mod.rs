//! `fastwake bench pingpong --source verbs [HOST]`: the ping-pong with one
//! end per process, possibly on two hosts, like perftest's `ib_send_lat`.
//!
//! Without HOST this process is the server (the pong end): it opens the
//! device, listens on the TCP port (perftest's 18515) and waits for one
//! client. With HOST it is the client (the ping end, which times the round
//! trips). The two exchange QP numbers, PSNs, LIDs and GIDs over TCP in
//! perftest's own format ([`wire`]), so either end can also face
//! `ib_send_lat`; two fastwake ends also exchange their run parameters and
//! refuse to run when they differ.
//!
//! Each `--mode` gets its own QP pair; the rows are interleaved in rounds as
//! in the one-process form, both ends following the same schedule. After
//! each size the ends exchange their CPU times, the client makes the rows
//! and sends them to the server, and both print the same table.

pub mod wire;

use super::harness::{self, Placement, Plan, Progress};
use super::sources::verbs::{VerbsEnd, remote_end};
use super::stats::{self, Row, Sample};
use fastwake::source::verbs::{Device, Endpoint};
use fastwake::{Fail, Result, WaitMode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use wire::{Conn, Dest, Peer};

/// perftest's `MAX_SIZE`: the largest message, and the last size of -a.
pub const MAX_SIZE: usize = 1 << 23;
/// No message from the peer for this long during a run ends it.
const STALL: Duration = Duration::from_secs(10);

/// The options of `bench pingpong` this form uses (`bench::pingpong`
/// fills it from its arguments).
pub struct Opts<'a> {
    pub common: &'a super::Common,
    /// The `--mode` names (or `interrupt` for -e).
    pub modes: Vec<String>,
    pub all: bool,
    pub dev: Option<&'a str>,
    pub ib_port: u8,
    pub gid_index: Option<u8>,
    pub port: u16,
    pub host: Option<&'a str>,
    pub replace: &'a str,
    pub out_json: Option<&'a std::path::Path>,
}

/// What an end runs; two fastwake ends must agree on all of it.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    sizes: Vec<usize>,
    all: bool,
    iters: u64,
    warmup: u64,
    rounds: u64,
    modes: Vec<String>,
}

/// The parameters message of two fastwake ends: the run, and who the end
/// is (for the other's report).
#[derive(Debug, Clone, PartialEq)]
struct Params {
    run: Run,
    version: String,
    host: String,
    device: String,
}

impl Params {
    fn encode(&self) -> String {
        let r = &self.run;
        let sizes: Vec<String> = r.sizes.iter().map(|s| s.to_string()).collect();
        format!(
            "sizes={}\nall={}\niters={}\nwarmup={}\nrounds={}\nmodes={}\nversion={}\nhost={}\ndevice={}\n",
            sizes.join(","),
            r.all as u8,
            r.iters,
            r.warmup,
            r.rounds,
            r.modes.join(" "),
            self.version,
            self.host,
            self.device
        )
    }

    fn decode(text: &str) -> std::result::Result<Params, String> {
        let get = |k: &str| -> std::result::Result<&str, String> {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .ok_or_else(|| format!("no '{k}' in the peer's parameters"))
        };
        let num = |k: &str| -> std::result::Result<u64, String> {
            get(k)?
                .parse()
                .map_err(|_| format!("bad '{k}' in the peer's parameters"))
        };
        let sizes = get("sizes")?
            .split(',')
            .map(|s| s.parse::<usize>().map_err(|_| "bad 'sizes'".to_string()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Params {
            run: Run {
                sizes,
                all: num("all")? != 0,
                iters: num("iters")?,
                warmup: num("warmup")?,
                rounds: num("rounds")?,
                modes: get("modes")?.split(' ').map(String::from).collect(),
            },
            version: get("version")?.to_string(),
            host: get("host")?.to_string(),
            device: get("device")?.to_string(),
        })
    }
}

/// How the two runs differ, as flags ("-s 64 there, -s 8 here"); `None`
/// when they agree.
fn disagreement(here: &Run, there: &Run) -> Option<String> {
    let size = |r: &Run| {
        if r.all {
            "-a".to_string()
        } else {
            format!("-s {}", r.sizes.first().copied().unwrap_or(0))
        }
    };
    let mut d = Vec::new();
    let mut differ = |flag: &str, h: String, t: String| {
        if h != t {
            d.push(format!("{flag}: {t} there, {h} here"));
        }
    };
    differ("size", size(here), size(there));
    differ("-n", here.iters.to_string(), there.iters.to_string());
    differ(
        "--warmup",
        here.warmup.to_string(),
        there.warmup.to_string(),
    );
    differ(
        "--rounds",
        here.rounds.to_string(),
        there.rounds.to_string(),
    );
    differ("--mode", here.modes.join(","), there.modes.join(","));
    (!d.is_empty()).then(|| d.join("; "))
}

/// The options of this run, checked.
fn run_of(a: &Opts) -> Result<(Run, Vec<WaitMode>)> {
    let c = &a.common;
    if c.iters == 0 {
        return Err(Fail::invalid("--iters must be at least 1"));
    }
    if c.rounds == 0 || c.rounds > c.iters {
        return Err(Fail::invalid("--rounds must be between 1 and --iters"));
    }
    if c.size == 0 || c.size > MAX_SIZE {
        return Err(Fail::invalid(format!(
            "--size must be between 1 and {MAX_SIZE} with --source verbs"
        )));
    }
    let names = a.modes.clone();
    let modes = names
        .iter()
        .map(|m| m.parse::<WaitMode>())
        .collect::<Result<Vec<_>>>()?;
    let sizes = if a.all {
        (1..=23).map(|i| 1usize << i).collect()
    } else {
        vec![c.size]
    };
    Ok((
        Run {
            sizes,
            all: a.all,
            iters: c.iters,
            warmup: c.warmup,
            rounds: c.rounds,
            modes: names,
        },
        modes,
    ))
}

/// Ends a run that stops hearing from the peer: one line, exit 2.
struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(progress: Arc<AtomicU64>, peer: String, size: usize) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fw-watchdog".into())
            .spawn(move || {
                let (mut last, mut since) = (progress.load(Ordering::Relaxed), Instant::now());
                while !s2.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    let now = progress.load(Ordering::Relaxed);
                    if now != last {
                        (last, since) = (now, Instant::now());
                    } else if since.elapsed() > STALL {
                        eprintln!(
                            "fastwake: error: no message from {peer} for {} s ({now} received so far, size {size}): the peer stopped or expects another run (both ends need the same -n, -s/-a, --mode)",
                            STALL.as_secs()
                        );
                        std::process::exit(2);
                    }
                }
            })
            .ok();
        Watchdog { stop, thread }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn dest_of(e: &VerbsEnd) -> Dest {
    let ep = e.qp().endpoint();
    Dest {
        lid: ep.lid,
        out_reads: 1,
        qpn: ep.qpn,
        psn: ep.psn,
        gid: ep.gid,
        ..Dest::default()
    }
}

/// Write `--out-json FILE`: `{"run": ..., "rows": [...]}`.
pub fn write_out_json(path: &std::path::Path, run: serde_json::Value, rows: &[Row]) -> Result<()> {
    let doc = serde_json::json!({ "run": run, "rows": rows });
    let text = serde_json::to_string_pretty(&doc).expect("rows serialise");
    std::fs::write(path, text + "\n").map_err(|e| {
        Fail::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("cannot write {}: {e}", path.display()),
        )
    })
}

/// Run one end of the two-process ping-pong.
pub fn run(a: &Opts) -> Result<()> {
    let (run, modes) = run_of(a)?;
    let policy = a.replace.parse()?;
    let dev = Arc::new(Device::open_port(a.dev, a.ib_port, a.gid_index)?);
    let client = a.host.is_some();
    let role = if client { "client" } else { "server" };
    let cpu = if client {
        a.common.cpus.0
    } else {
        a.common.cpus.1
    };
    let (gid_index, gid) = dev.gid();
    // perftest sends a GID whenever it has a GID index: always on RoCE,
    // on InfiniBand only with -x.
    let with_gid = dev.is_roce() || a.gid_index.is_some();
    let mut conn = match a.host {
        Some(h) => Conn::connect(h, a.port)?,
        None => Conn::accept(a.port, || {
            eprintln!(
                "verbs: server on {} port {} GID index {gid_index}: waiting for a client on TCP port {}",
                dev.name(),
                dev.port(),
                a.port
            )
        })?,
    };
    let peer = conn.versions()?;
    let me = Params {
        run: run.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        host: crate::meta::hostname(),
        device: dev.name().into(),
    };
    let mut peer_params = None;
    let plan = match &peer {
        Peer::Fastwake(_) => {
            let theirs = conn.blob(me.encode().as_bytes(), "parameters")?;
            let theirs = Params::decode(&String::from_utf8_lossy(&theirs)).map_err(|e| {
                Fail::new(
                    libc::EPROTO,
                    format!("exchange with {}: {e}", conn.peer_name),
                )
            })?;
            if let Some(d) = disagreement(&run, &theirs.run) {
                return Err(Fail::invalid(format!(
                    "the {} at {} runs with other parameters ({d}): give both ends the same",
                    if client { "server" } else { "client" },
                    conn.peer_name
                )));
            }
            peer_params = Some(theirs);
            Plan {
                iters: run.iters,
                warmup: run.warmup,
                rounds: run.rounds,
            }
        }
        Peer::Perftest(v) => {
            if modes.len() != 1 {
                return Err(Fail::invalid(format!(
                    "the peer at {} is perftest {v}, which runs one row per size: give one --mode (or -e)",
                    conn.peer_name
                )));
            }
            eprintln!(
                "verbs: the peer is perftest {v}: exactly -n round trips per size, no warm-up, plain SENDs (only their length is checked){}",
                if client {
                    ""
                } else {
                    "; this end times its replies to the next message, as perftest's server does"
                }
            );
            Plan {
                iters: run.iters,
                warmup: 0,
                rounds: 1,
            }
        }
    };
    conn.sys_data()?;
    let my_mtu = dev
        .port_attr()
        .active_mtu
        .clamp(1, fastwake_verbs_sys::IBV_MTU_1024);
    let mtu = conn.mtu(my_mtu)?;
    let max = *run.sizes.iter().max().expect("one size at least");
    let progress = Arc::new(AtomicU64::new(0));
    fastwake::cpu::pin(cpu)?;
    let plain = matches!(peer, Peer::Perftest(_));
    let mut ends = modes
        .iter()
        .map(|m| {
            remote_end(
                &dev,
                *m,
                max,
                cpu,
                policy,
                plain,
                role,
                Arc::clone(&progress),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mine: Vec<Dest> = ends.iter().map(dest_of).collect();
    let mut theirs = Vec::new();
    for (i, d) in mine.iter().enumerate() {
        theirs.push(conn.keys(d, with_gid, &format!("keys of QP {i}"))?);
    }
    if with_gid && mine[0].v4_mapped() != theirs[0].v4_mapped() {
        return Err(Fail::invalid(format!(
            "this end's GID ({}) and the peer's ({}) are of different IP versions: choose GID indexes of the same kind with -x on both ends",
            fmt_gid(&mine[0].gid),
            fmt_gid(&theirs[0].gid)
        )));
    }
    for (e, t) in ends.iter_mut().zip(&theirs) {
        let ep = Endpoint {
            qpn: t.qpn,
            psn: t.psn,
            lid: t.lid,
            gid: t.gid,
        };
        e.qp().connect_mtu(&ep, mtu)?;
        e.post_receives()?;
    }
    // perftest's hand shakes after connecting: once, then once per QP.
    conn.keys(&mine[0], with_gid, "sync")?;
    for (i, d) in mine.iter().enumerate() {
        conn.keys(d, with_gid, &format!("sync of QP {i}"))?;
    }
    let places = vec![
        Placement {
            ping_cpu: cpu,
            pong_cpu: cpu,
        };
        ends.len()
    ];
    let mut rows: Vec<Row> = Vec::new();
    for &size in &run.sizes {
        for e in ends.iter_mut() {
            e.set_size(size);
        }
        conn.keys(&mine[0], with_gid, &format!("sync before size {size}"))?;
        let (samples, my_cpu) = {
            let _dog = Watchdog::start(Arc::clone(&progress), conn.peer_name.clone(), size);
            if client {
                harness::ping_loop(&mut ends, &places, plan, &Progress::default())?
            } else {
                harness::pong_loop(&mut ends, &places, plan, plain)?
            }
        };
        let mut new_rows = if plain {
            // perftest tells nothing of its CPU time: NaN (null in JSON).
            modes
                .iter()
                .zip(&samples)
                .zip(&my_cpu)
                .map(|((m, s), c)| {
                    let mut r =
                        Row::from_sample("verbs", &m.to_string(), "remote", size, s, *c, *c);
                    if client {
                        r.cpu_us_per_op_pong = f64::NAN;
                    } else {
                        r.cpu_us_per_op_ping = f64::NAN;
                    }
                    r.cpu_us_per_op = f64::NAN;
                    r
                })
                .collect()
        } else {
            exchange_rows(&mut conn, client, &modes, size, &samples, &my_cpu)?
        };
        for r in &mut new_rows {
            r.extra.insert("peer".into(), peer.to_string().into());
            r.extra.insert(
                "measured_by".into(),
                if client || !plain { "client" } else { "server" }.into(),
            );
        }
        rows.extend(new_rows);
    }
    conn.close(&mine[0], with_gid)?;
    let mut meta = serde_json::to_value(crate::meta::RunMeta::now()).expect("meta serialises");
    meta["role"] = role.into();
    meta["device"] = dev.name().into();
    meta["ib_port"] = dev.port().into();
    meta["gid_index"] = gid_index.into();
    meta["gid"] = fmt_gid(&gid.raw).into();
    meta["tcp_port"] = a.port.into();
    meta["cpu"] = cpu.into();
    let mut p = serde_json::json!({ "address": conn.peer_name, "program": peer.to_string() });
    if let Some(pp) = &peer_params {
        p["version"] = pp.version.clone().into();
        p["host"] = pp.host.clone().into();
        p["device"] = pp.device.clone().into();
    }
    meta["peer"] = p;
    if let Some(path) = a.out_json {
        write_out_json(path, meta.clone(), &rows)?;
    }
    if a.common.json {
        stats::print_json(&rows);
    } else {
        let peer_desc = match &peer_params {
            Some(pp) => format!("fastwake on {} ({})", pp.host, pp.device),
            None => peer.to_string(),
        };
        stats::print_table(
            &format!(
                "fastwake bench pingpong — source verbs, two processes: this {role} on {} ({} port {} GID index {gid_index}, CPU {cpu}), peer {peer_desc} at {} — {}; one-way latency = RTT/2; cpu/op = CPU µs per round trip (ping+pong: client+server){}",
                crate::meta::hostname(),
                dev.name(),
                dev.port(),
                conn.peer_name,
                if client || !plain {
                    "timed by the client"
                } else {
                    "timed by this server, reply to next message"
                },
                super::idle_note()
            ),
            &rows,
        );
    }
    Ok(())
}

/// After a size: both ends send their CPU times, the client makes the rows
/// and sends them, both return them.
fn exchange_rows(
    conn: &mut Conn<std::net::TcpStream>,
    client: bool,
    modes: &[WaitMode],
    size: usize,
    samples: &[Sample],
    my_cpu: &[Duration],
) -> Result<Vec<Row>> {
    let text: Vec<String> = my_cpu.iter().map(|d| d.as_nanos().to_string()).collect();
    let theirs = conn.blob(text.join(",").as_bytes(), "cpu times")?;
    let theirs: Vec<Duration> = String::from_utf8_lossy(&theirs)
        .split(',')
        .map(|s| s.parse().map(Duration::from_nanos))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Fail::new(libc::EPROTO, "the peer's cpu times are not numbers"))?;
    if theirs.len() != modes.len() {
        return Err(Fail::new(
            libc::EPROTO,
            "the peer sent cpu times for another number of modes",
        ));
    }
    if client {
        let rows: Vec<Row> = modes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Row::from_sample(
                    "verbs",
                    &m.to_string(),
                    "remote",
                    size,
                    &samples[i],
                    my_cpu[i],
                    theirs[i],
                )
            })
            .collect();
        let json = serde_json::to_vec(&rows).expect("rows serialise");
        conn.blob(&json, "rows")?;
        Ok(rows)
    } else {
        let json = conn.blob(b"", "rows")?;
        serde_json::from_slice(&json)
            .map_err(|e| Fail::new(libc::EPROTO, format!("the client's rows: {e}")))
    }
}

/// A GID as `0000:0000:0000:0000:0000:ffff:0a00:020f` (as sysfs shows it).
fn fmt_gid(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests;
