//! The service-time scenarios of `bench load`: closed-loop requests to a
//! server whose reply comes after a service time `D` (an RDMA READ of a
//! large object, an NVMe read, a server with a steady service time).
//!
//! A *client* thread (pinned to the consumer CPU) sends a request and waits
//! for the reply in the mode under test, then sends the next one at once.
//! A *server* thread (pinned to the producer CPU) plays the device: it
//! polls every mode's request queue, holds each request for its drawn
//! service time (sleeping most of it, spinning the last 120 µs, so the
//! time is exact), stamps the reply with the time it publishes it and
//! sends it. The server's CPU is the device's, not the waiter's: it is
//! not counted.
//!
//! - **wake latency** = reply taken by the client − reply published by the
//!   server: what the waiter adds (the service time is not its to shorten);
//! - **end-to-end** = reply taken − request sent;
//! - **CPU per request** = the client thread's CPU time over the measured
//!   windows / requests (its send is in every mode's figure alike).
//!
//! Modes are interleaved in windows as in the open-loop scenarios.

use super::floor::{SLEEPS_PER_WINDOW, TimerProbe};
use super::{Args, Measured, Scenario, Segment, now_ns, wait_until};
use crate::bench::sources::net;
use crate::bench::stats::Sample;
use fastwake::source::Source;
use fastwake::source::channel::{self, Config as ChanConfig, Doorbell, Receiver, Sender};
use fastwake::source::socket::{SocketOptions, SocketSource};
use fastwake::{Fail, Result, WaitMode, Waiter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How service times are drawn.
#[derive(Debug, Clone, Copy)]
pub struct Draw {
    /// Nominal service time, ns.
    pub d_ns: f64,
    /// Uniform jitter, ± this fraction of `d_ns`.
    pub jitter: f64,
    /// Heavy-tailed instead: log-normal with median `d_ns` and σ = 1
    /// (p90 ≈ 3.6 D, p99 ≈ 10 D), capped at 100 D.
    pub tail: bool,
}

impl Draw {
    fn next(&self, rng: &mut StdRng) -> u64 {
        if self.tail {
            // Box-Muller: one standard normal.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (self.d_ns * z.exp()).min(100.0 * self.d_ns) as u64
        } else {
            let j = (2.0 * rng.random::<f64>() - 1.0) * self.jitter;
            (self.d_ns * (1.0 + j)).max(0.0) as u64
        }
    }
}

/// The client's end of one mode's connection.
enum Client {
    Chan { tx: Sender, rx: Receiver },
    Tcp { s: SocketSource, buf: Vec<u8> },
}

/// The server's end.
enum Server {
    Chan { tx: Sender, rx: Receiver },
    Tcp { s: SocketSource, buf: Vec<u8> },
}

fn pair(source: &str, payload: usize) -> Result<(Client, Server)> {
    // Both directions carry the 8-byte tag, then a payload of at least
    // 8 bytes (the request's send time travels back in it).
    let payload = payload.max(8);
    Ok(match source {
        "tcp" => {
            let l = net::connect(net::Net::Loopback)?;
            let n = 8 + payload;
            let opts = SocketOptions::default();
            (
                Client::Tcp {
                    s: SocketSource::new(l.b, n, opts)?,
                    buf: vec![0; n],
                },
                Server::Tcp {
                    s: SocketSource::new(l.a, n, opts)?,
                    buf: vec![0; n],
                },
            )
        }
        _ => {
            let cfg = ChanConfig {
                capacity: 64,
                slot_size: payload as u32,
                doorbell: Doorbell::Futex,
            };
            let (ctx, srx) = channel::channel(cfg)?;
            let (stx, crx) = channel::channel(cfg)?;
            (
                Client::Chan { tx: ctx, rx: crx },
                Server::Chan { tx: stx, rx: srx },
            )
        }
    })
}

impl Client {
    fn request(&mut self, sent: u64) -> Result<()> {
        match self {
            Client::Chan { tx, .. } => tx.send(0, &sent.to_ne_bytes()),
            Client::Tcp { s, buf } => {
                buf[..8].copy_from_slice(&0u64.to_ne_bytes());
                buf[8..16].copy_from_slice(&sent.to_ne_bytes());
                s.send(buf)
            }
        }
    }

    /// Wait for the reply; the time the server published it.
    fn reply(&mut self, w: &mut Waiter) -> Result<u64> {
        match self {
            Client::Chan { rx, .. } => Ok(w.wait(rx)?.tag),
            Client::Tcp { s, .. } => {
                w.wait(s)?;
                Ok(u64::from_ne_bytes(
                    s.message()[..8].try_into().expect("8 bytes"),
                ))
            }
        }
    }
}

impl Server {
    /// A request, if one is there: its send time.
    fn poll(&mut self) -> Result<Option<u64>> {
        match self {
            Server::Chan { rx, .. } => Ok(rx
                .try_take()?
                .map(|_| u64::from_ne_bytes(rx.payload()[..8].try_into().expect("8 bytes")))),
            Server::Tcp { s, .. } => Ok(s
                .try_take()?
                .map(|_| u64::from_ne_bytes(s.message()[8..16].try_into().expect("8 bytes")))),
        }
    }

    fn reply(&mut self, published: u64, sent: u64) -> Result<()> {
        match self {
            Server::Chan { tx, .. } => tx.send(published, &sent.to_ne_bytes()),
            Server::Tcp { s, buf } => {
                buf[..8].copy_from_slice(&published.to_ne_bytes());
                buf[8..16].copy_from_slice(&sent.to_ne_bytes());
                s.send(buf)
            }
        }
    }
}

fn server(
    mut ends: Vec<Server>,
    draw: Draw,
    seed: u64,
    epoch: Instant,
    cpu: u32,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    fastwake::cpu::pin(cpu)?;
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer argument and only
    // changes this thread's timer slack (1 ns: the service time is exact).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        for e in ends.iter_mut() {
            if let Some(sent) = e.poll()? {
                let due = now_ns(epoch) + draw.next(&mut rng);
                wait_until(epoch, due);
                e.reply(now_ns(epoch), sent)?;
            }
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// The client's connections, one per mode, with their waiters.
type Ends = Vec<(Client, Waiter)>;

/// The probe's idle channel (its sender stays with the caller: a closed
/// channel is ready), how long each sleep asks for, and what it measured.
struct Probe {
    rx: Receiver,
    asked: Duration,
    out: TimerProbe,
    failed: Option<String>,
}

impl Probe {
    /// A few timed sleeps, the way a pre-wake sleeps; a failure is kept
    /// (and the probe stops), not the run's.
    fn sleep(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let n = SLEEPS_PER_WINDOW;
        match crate::doctor::sleep_on_idle(&mut self.rx, n, self.asked, &mut self.out.late) {
            Ok(cpu) => self.out.cpu += cpu,
            Err(e) => self.failed = Some(e),
        }
    }
}

/// What the client measured for one mode.
pub(super) struct ClientMeasured {
    pub m: Measured,
    pub e2e: Sample,
}

fn client(
    mut ends: Ends,
    segs: Vec<Segment>,
    epoch: Instant,
    (cpu, slice): (u32, Option<Duration>),
    helper: Option<Arc<fastwake::dispatch::Dispatcher>>,
    mut probe: Probe,
) -> Result<(Vec<ClientMeasured>, Ends, Probe)> {
    fastwake::cpu::pin(cpu)?;
    super::take_slice(slice)?;
    let helper = super::HelperClock::new(helper, ends.iter().map(|(_, w)| w));
    let mut ms: Vec<Measured> = (0..ends.len()).map(|_| Measured::new()).collect();
    let mut e2e: Vec<Sample> = (0..ends.len()).map(|_| Sample::new()).collect();
    for s in &segs {
        let (c, w) = &mut ends[s.mode];
        let window = s.measured.then(|| super::Window::open(&helper, w, cpu));
        let (o, oe) = (&mut ms[s.mode], &mut e2e[s.mode]);
        let end = now_ns(epoch) + s.ns;
        loop {
            let sent = now_ns(epoch);
            if sent >= end {
                break;
            }
            c.request(sent)?;
            let published = c.reply(w)?;
            let got = now_ns(epoch);
            if s.measured {
                o.sample
                    .record_one_way(Duration::from_nanos(got.saturating_sub(published)));
                oe.record_one_way(Duration::from_nanos(got.saturating_sub(sent)));
                o.msgs += 1;
            }
        }
        if let Some(win) = window {
            win.close(&helper, w, &mut ms, s.mode);
            probe.sleep();
        }
    }
    for ((_, w), o) in ends.iter().zip(ms.iter_mut()) {
        o.explain = w.explain().or_else(|| helper.explain(w));
        o.prewakes = helper.prewakes(w);
    }
    let out = ms
        .into_iter()
        .zip(e2e)
        .map(|(m, e2e)| ClientMeasured { m, e2e })
        .collect();
    // The ends go back to the caller, to be dropped once the server has
    // stopped: a request queue closed under a polling server is an error.
    Ok((out, ends, probe))
}

/// Run one service-time scenario: every mode, interleaved, with the timer
/// probe between the windows (`None` when it failed: said on stderr).
pub(super) fn run(
    a: &Args,
    sc: Scenario,
    modes: &[WaitMode],
    segs: Vec<Segment>,
) -> Result<(Vec<ClientMeasured>, Option<TimerProbe>)> {
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    let helper = if modes.contains(&WaitMode::Dispatch) {
        if a.dispatcher == "fixed" {
            return Err(Fail::invalid(
                "bench load: the service scenarios run dispatch mode only with --dispatcher adaptive (with the fixed 2 ms idle threshold the dispatcher polls through every service time: poll mode on another thread)",
            ));
        }
        Some(super::start_dispatcher(a)?)
    } else {
        None
    };
    for m in modes {
        let (c, s) = pair(&a.source, a.size)?;
        clients.push((c, Waiter::new(*m)));
        servers.push(s);
    }
    let draw = Draw {
        d_ns: sc.rate as f64 * 1000.0,
        jitter: a.jitter as f64 / 100.0,
        tail: sc.pattern == super::Pattern::ServiceTail,
    };
    // The probe sleeps about as long as a pre-wake would before this
    // service time (its timer's cost hardly depends on it).
    let (probe_tx, probe_rx) = channel::channel(ChanConfig::default())?;
    let probe = Probe {
        rx: probe_rx,
        asked: Duration::from_nanos((draw.d_ns / 2.0) as u64)
            .clamp(Duration::from_micros(10), Duration::from_micros(500)),
        out: TimerProbe::default(),
        failed: None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let (pc, cc) = a.cpus;
    let (seed, slice) = (a.seed, a.slice);
    let stop2 = stop.clone();
    let srv = std::thread::Builder::new()
        .name("fw-load-srv".into())
        .spawn(move || server(servers, draw, seed, epoch, pc, stop2))
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn server: {e}")))?;
    let cli = std::thread::Builder::new()
        .name("fw-load-cli".into())
        .spawn(move || client(clients, segs, epoch, (cc, slice), helper, probe))
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn client: {e}")))?;
    let cr = cli.join();
    stop.store(true, Ordering::Relaxed);
    let sr = srv.join();
    let (out, ends, probe) = cr.map_err(|_| Fail::new(libc::EIO, "client panicked"))??;
    sr.map_err(|_| Fail::new(libc::EIO, "server panicked"))??;
    drop(ends);
    drop(probe_tx);
    let timers = match probe.failed {
        Some(e) => {
            eprintln!(
                "bench load: {}: timed sleeps not measured ({e}): no pre-wake floor",
                sc.name()
            );
            None
        }
        None => Some(probe.out),
    };
    Ok((out, timers))
}
