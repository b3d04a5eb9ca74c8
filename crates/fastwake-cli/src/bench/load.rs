//! `fastwake bench load`: open-loop request streams over a completion
//! source, every wait mode side by side, with and without a CPU hog.
//!
//! A *producer* thread (pinned to the first CPU of `--cpus`) sends requests
//! at scheduled times drawn from a Poisson process or an ON/OFF burst
//! process at a nominal rate; a *consumer* thread (pinned to the second)
//! waits for them in one wait mode. Open loop: the schedule does not wait
//! for the consumer, so a slow consumer queues requests and pays for it.
//!
//! - **latency** = consumer got the request − its *scheduled* send time
//!   (includes any lateness of the producer and any queueing);
//! - **CPU** = the consumer thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
//!   over the measured windows, plus the CPU of any helper thread the mode
//!   uses (the dispatcher: charged to dispatch mode whenever it runs, and
//!   to adaptive for the windows in which adaptive handed waits to it).
//!   The producer's CPU is not in
//!   it: its pacing spin dwarfs its sends; the doorbell rings a sleeping
//!   consumer costs the producer show in the `sleeps` column instead.
//!
//! Modes are interleaved within each scenario: the measured time of each
//! mode is cut into `--rounds` windows, in rounds whose order is balanced
//! ([`super::rounds`]: every mode in every position and right after every
//! other mode equally often), so a noisy second on this shared machine,
//! or a mode that leaves the consumer thread behind in the scheduler's
//! fairness, is spread over all modes.

mod arrivals;
pub mod background;
mod backlog;
mod floor;
mod plot;
mod report;
mod service;

use arrivals::{Arrivals, Pattern, Scenario};
use report::print_table;

use super::rounds::Rounds;
use super::sources::net;
use super::stats::{self, Row, Sample};
use fastwake::dispatch::{self, Dispatcher};
use fastwake::source::channel::{self, Config as ChanConfig, Doorbell, Receiver, Sender};
use fastwake::source::socket::{SocketOptions, SocketSource};
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Nominal request rates, requests per second (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub rates: Vec<u64>,
    /// Arrival patterns, comma separated
    ///
    /// Arrival patterns: poisson, onoff (bursts at 10x the rate for 10 % of the
    /// time: ON periods of mean 2 ms, OFF periods of mean 18 ms); service and
    /// service-tail are closed-loop service-time scenarios instead (one request
    /// at a time, the reply after a service time from --service-us: ± --jitter
    /// uniform, or log-normal with σ = 1 for service-tail), which report the
    /// wake latency (reply published → taken), end-to-end latency and CPU per
    /// request. Between their windows the waiting thread takes 16 timed sleeps
    /// the way a pre-wake sleeps; with poll among the modes, each service
    /// scenario then prints its pre-wake floor: the least CPU per request of a
    /// pre-wake that is spinning before all but the earliest 1/32 of the
    /// completions (a timed sleep's CPU, the spin from the earliest
    /// completions, the timer's lateness spread, the request's own CPU), as a
    /// ratio to polling's.
    #[arg(long, value_delimiter = ',', default_value = "poisson,onoff", value_parser = ["poisson", "onoff", "service", "service-tail"])]
    pub patterns: Vec<String>,
    /// Service times of the service scenarios, µs (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "20,50,200,1000")]
    pub service_us: Vec<u64>,
    /// Jitter of the service scenario's service times, ± percent, uniform.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub jitter: u8,
    /// Co-located busy processes, N[:DUTY]
    ///
    /// Co-located load for every scenario: N unpinned processes of normal
    /// priority, each busy for random stretches of 0.1-10 ms for DUTY % of the
    /// time (default 100 = always busy), e.g. 2:50.
    #[arg(long, value_name = "N[:DUTY]", value_parser = background::Background::parse)]
    pub background: Option<background::Background>,
    /// CPU hog on the consumer's CPU: off, on or both.
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    pub hog: String,
    /// Wait modes to compare, comma separated
    ///
    /// Wait modes to compare, comma separated, in the one grammar
    /// (docs/reference/grammar.md): poll, interrupt, hybrid[:DURATION], dispatch,
    /// adaptive[:OPTIONS] (e.g. hybrid:20us, adaptive:cap=20%). A mode given
    /// again (any but dispatch) is a control: its rows are named MODE#2,
    /// MODE#3, ..., and each scenario says how far apart the rows that
    /// waited alike came out, the run's own noise.
    #[arg(
        long,
        default_value = "poll,interrupt,hybrid,dispatch,adaptive",
        value_parser = super::parse_modes
    )]
    pub mode: super::ModeList,
    /// Completion source
    ///
    /// Completion source: channel (shared memory), or tcp (a loopback TCP
    /// connection per mode, read through the socket source).
    #[arg(long, default_value = "channel", value_parser = ["channel", "tcp"])]
    pub source: String,
    /// Idle policy of the dispatcher: fixed or adaptive[:OPTIONS]
    ///
    /// Idle policy of the dispatcher on the consumer's CPU, which runs only
    /// when --mode includes dispatch (adaptive then hands waits to it too):
    /// `fixed` (sleep after 2 ms without a hand-off) or `adaptive` (the
    /// threshold learned by the adaptive controller, with its pre-wake where
    /// the gaps are predictable; see dispatch::Config::learn_idle), or
    /// `adaptive:OPTIONS` as in `--mode adaptive:…` (e.g.
    /// `adaptive:prewake=off`).
    #[arg(long, default_value = "fixed", value_parser = parse_dispatcher)]
    pub dispatcher: String,
    /// Scheduler slice of the consumer thread, e.g. 100us
    ///
    /// Scheduler slice the consumer (the waiting thread) asks for, 100us to
    /// 100ms (Linux 6.12 or later; see fastwake::slice): a waking thread whose
    /// slice is shorter than a busy neighbour's preempts it. Default: the
    /// kernel's slice.
    #[arg(long, value_parser = crate::values::slice)]
    pub slice: Option<Duration>,
    /// Measured seconds per mode and scenario.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// Interleaving rounds per scenario
    ///
    /// Interleaving rounds per scenario. Default: one period of the rounds'
    /// balanced order (as many rounds as modes, twice as many for an odd
    /// number: 10 for the five default modes), at least 4.
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Unmeasured warm-up per mode and scenario, ms
    ///
    /// Unmeasured warm-up per mode and scenario, ms (the adaptive controller
    /// learns here, and keeps learning while measured).
    #[arg(long, default_value_t = 200)]
    pub warmup_ms: u64,
    /// CPUs of the producer and the consumer, `P,C`.
    #[arg(long, default_value = "0,1", value_parser = super::parse_cpus)]
    pub cpus: (u32, u32),
    /// Payload bytes per request.
    #[arg(long, default_value_t = 8)]
    pub size: usize,
    /// Seed of the arrival schedules.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON (one object per mode and scenario) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print what the adaptive controller decided and why
    ///
    /// Prints what the adaptive controller decided and why, per scenario (for
    /// the `dispatch` row: how its waits ended and what the dispatcher did:
    /// hand-offs, watchdog rescues, idle sleeps, pre-wakes).
    #[arg(long)]
    pub explain: bool,
    /// Write one latency-vs-CPU plot per scenario into DIR (SVG and PNG).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<std::path::PathBuf>,
}

/// One measured or warm-up window of one mode.
#[derive(Debug, Clone, Copy)]
struct Segment {
    mode: usize,
    /// Interleaving round (0 = warm-up); every mode of a round gets the
    /// same arrival schedule, so modes differ only in how they wait.
    round: u64,
    ns: u64,
    measured: bool,
}

const START: u64 = u64::MAX - 1;
const STOP: u64 = u64::MAX;
/// Lead between a window's START marker and its first scheduled request.
const LEAD_NS: u64 = 200_000;

/// What the consumer measured for one mode in one scenario.
struct Measured {
    sample: Sample,
    cpu: Duration,
    helper_cpu: Duration,
    wall: Duration,
    msgs: u64,
    sleeps: u64,
    explain: Option<String>,
    /// Open loop: requests sent and not yet taken, summed over the takes
    /// (the mean is the queue a request found; it grows without bound
    /// when the consumer falls behind), and the most seen.
    queue_sum: u64,
    queue_max: u64,
    /// Open loop: requests due by the schedule and not yet taken
    /// ([`backlog`]).
    backlog: backlog::Backlog,
    /// Adaptive: waits planned as pre-wakes.
    prewakes: u64,
    /// CPU time others took on the consumer's CPU in the measured
    /// windows: its busy time in /proc/stat less the consumer's and the
    /// dispatcher's own (None where /proc/stat is unreadable).
    others: Option<Duration>,
    /// The consumer's run-queue delay in the measured windows: time it
    /// was runnable and waited for its CPU (None where schedstat is
    /// unreadable).
    run_delay: Option<Duration>,
}

impl Measured {
    fn new() -> Measured {
        Measured {
            sample: Sample::new(),
            cpu: Duration::ZERO,
            helper_cpu: Duration::ZERO,
            wall: Duration::ZERO,
            msgs: 0,
            sleeps: 0,
            explain: None,
            queue_sum: 0,
            queue_max: 0,
            backlog: backlog::Backlog::default(),
            prewakes: 0,
            others: Some(Duration::ZERO),
            run_delay: Some(Duration::ZERO),
        }
    }

    /// CPU seconds of the consumer and its dispatcher.
    fn cpu_s(&self) -> f64 {
        (self.cpu + self.helper_cpu).as_secs_f64()
    }

    /// Their CPU µs per request (`cpu_us_per_req` in `--json`).
    fn cpu_us_per_req(&self) -> f64 {
        1e6 * self.cpu_s() / self.msgs.max(1) as f64
    }
}

impl Args {
    /// The rounds per scenario (`run` settles the default first).
    fn rounds(&self) -> u64 {
        self.rounds.unwrap_or(4).into()
    }
}

fn segments(modes: usize, a: &Args) -> Vec<Segment> {
    let mut v = Vec::new();
    for m in 0..modes {
        v.push(Segment {
            mode: m,
            round: 0,
            ns: a.warmup_ms * 1_000_000,
            measured: false,
        });
    }
    let measured_ns = (a.secs * 1e9) as u64;
    for t in Rounds::new(modes, a.rounds(), measured_ns).turns() {
        v.push(Segment {
            mode: t.case,
            round: t.round + 1,
            ns: t.amount,
            measured: true,
        });
    }
    v
}

fn now_ns(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Sleep most of the way, spin the rest: the send must leave on time, and
/// a nanosleep wakes late by tens of µs.
fn wait_until(epoch: Instant, t: u64) {
    loop {
        let now = now_ns(epoch);
        if now >= t {
            return;
        }
        let d = t - now;
        if d > 200_000 {
            std::thread::sleep(Duration::from_nanos(d - 120_000));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The producer's end of one mode's stream.
enum Tx {
    Chan(Sender),
    /// Each message is the 8-byte tag, then the payload.
    Tcp(SocketSource, Vec<u8>),
}

impl Tx {
    fn send(&mut self, tag: u64, data: &[u8]) -> Result<()> {
        match self {
            Tx::Chan(tx) => tx.send(tag, data),
            Tx::Tcp(s, buf) => {
                buf[..8].copy_from_slice(&tag.to_ne_bytes());
                buf[8..].copy_from_slice(data);
                s.send(buf)
            }
        }
    }
}

/// The consumer's end: a source and how to read a request's tag.
enum Rx {
    Chan(Receiver),
    Tcp(SocketSource),
}

impl Rx {
    /// Wait for the next request; its tag (scheduled send time or a
    /// marker).
    fn wait(&mut self, w: &mut Waiter) -> Result<u64> {
        match self {
            Rx::Chan(rx) => Ok(w.wait(rx)?.tag),
            Rx::Tcp(s) => {
                w.wait(s)?;
                let mut tag = [0u8; 8];
                tag.copy_from_slice(&s.message()[..8]);
                Ok(u64::from_ne_bytes(tag))
            }
        }
    }
}

/// One stream per mode over `source`, with `payload` bytes per request.
fn streams(source: &str, modes: &[WaitMode], payload: usize) -> Result<Vec<(Tx, Ends)>> {
    let mut v = Vec::new();
    for m in modes {
        let (tx, rx) = match source {
            "tcp" => {
                // Loopback: a veth pair adds only per-packet cost here.
                let l = net::connect(net::Net::Loopback)?;
                let n = 8 + payload;
                let opts = SocketOptions::default();
                (
                    Tx::Tcp(SocketSource::new(l.a, n, opts)?, vec![0; n]),
                    Rx::Tcp(SocketSource::new(l.b, n, opts)?),
                )
            }
            _ => {
                // Deep enough that a burst never blocks the producer.
                let cfg = ChanConfig {
                    capacity: 4096,
                    slot_size: payload.max(1) as u32,
                    doorbell: Doorbell::Futex,
                };
                let (tx, rx) = channel::channel(cfg)?;
                (Tx::Chan(tx), Rx::Chan(rx))
            }
        };
        v.push((
            tx,
            Ends {
                rx,
                waiter: Waiter::new(*m),
            },
        ));
    }
    Ok(v)
}

/// Where and how the producer paces its sends.
struct Pace {
    seed: u64,
    epoch: Instant,
    cpu: u32,
    payload: usize,
}

fn producer(
    mut txs: Vec<Tx>,
    sent: Arc<Vec<AtomicU64>>,
    segs: Vec<Segment>,
    sc: Scenario,
    pace: Pace,
) -> Result<()> {
    let Pace {
        seed,
        epoch,
        cpu,
        payload,
    } = pace;
    fastwake::cpu::pin(cpu)?;
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer argument and only
    // changes this thread's timer slack (1 ns: sleeps end when asked).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let data = vec![0x5a; payload];
    for s in &segs {
        let tx = &mut txs[s.mode];
        let t0 = now_ns(epoch) + LEAD_NS;
        tx.send(START, &data)?;
        let end = t0 + s.ns;
        let mut arr = Arrivals::new(sc.pattern, sc.rate, t0, seed ^ (s.round << 32));
        loop {
            let t = arr.next();
            if t >= end {
                break;
            }
            wait_until(epoch, t);
            tx.send(t, &data)?;
            sent[s.mode].fetch_add(1, Ordering::Release);
        }
        wait_until(epoch, end);
        tx.send(STOP, &data)?;
    }
    Ok(())
}

struct Ends {
    rx: Rx,
    waiter: Waiter,
}

/// The dispatcher's CPU, charged to the mode it served: its mode's cost
/// wherever it falls. After a dispatch window it polls on until its idle
/// threshold, into the next mode's window, and charging that to the next
/// mode made fixed modes look dearer than they are (by ~2 ms per window,
/// which is most of an interrupt-mode window's CPU at 1k/s). Adaptive is
/// charged the windows in which it handed waits to the dispatcher.
pub(super) struct HelperClock {
    helper: Option<Arc<Dispatcher>>,
    dispatch_row: Option<usize>,
}

/// Where a window started, for [`HelperClock::charge`].
#[derive(Clone, Copy)]
pub(super) struct HelperMark {
    dispatched: u64,
    cpu: Duration,
}

impl HelperClock {
    pub(super) fn new<'a>(
        helper: Option<Arc<Dispatcher>>,
        waiters: impl Iterator<Item = &'a Waiter>,
    ) -> HelperClock {
        let dispatch_row = waiters
            .into_iter()
            .position(|w| w.mode() == WaitMode::Dispatch);
        HelperClock {
            helper,
            dispatch_row,
        }
    }

    fn cpu(&self) -> Duration {
        self.helper
            .as_ref()
            .and_then(|d| d.cpu_time())
            .unwrap_or_default()
    }

    fn dispatched(w: &Waiter) -> u64 {
        let s = w.stats();
        s.handoffs + s.dispatch_fallbacks + s.dispatch_paused
    }

    /// Pre-wakes planned for `w`'s waits: its own (adaptive), or its
    /// dispatcher's (dispatch mode, a learned idle policy).
    pub(super) fn prewakes(&self, w: &Waiter) -> u64 {
        match (w.mode(), &self.helper) {
            (WaitMode::Dispatch, Some(d)) => d.stats().prewakes,
            _ => w.adaptive_stats().map_or(0, |s| s.prewakes),
        }
    }

    /// `--explain` for a dispatch-mode waiter: how its waits ended and
    /// what its dispatcher did (the dispatcher serves every row's
    /// dispatched waits, so its counters cover the whole scenario).
    pub(super) fn explain(&self, w: &Waiter) -> Option<String> {
        let d = self
            .helper
            .as_ref()
            .filter(|_| w.mode() == WaitMode::Dispatch)?;
        let (s, ds) = (w.stats(), d.stats());
        Some(format!(
            "dispatch: {} waits: handed off {}, fell back {}, paused {} (resumed {}); \
             dispatcher: hand-offs {}, rescued by the watchdog {}, idle sleeps {}, \
             pre-wakes {} (early {}, caught {}, late {}, paused {} times), margin {:.1}us",
            s.completions,
            s.handoffs,
            s.dispatch_fallbacks,
            s.dispatch_paused,
            s.dispatch_resumed,
            ds.handoffs,
            ds.rescued,
            ds.idle_sleeps,
            ds.prewakes,
            ds.prewake_early,
            ds.prewake_caught,
            ds.prewake_late,
            ds.prewake_pauses,
            ds.margin_ns as f64 / 1e3,
        ))
    }

    /// At the start of a window of waits by `w`.
    pub(super) fn mark(&self, w: &Waiter) -> HelperMark {
        HelperMark {
            dispatched: Self::dispatched(w),
            cpu: self.cpu(),
        }
    }

    /// At its end: the row to charge (the window's own, or dispatch's) and
    /// the dispatcher CPU used since `m`.
    pub(super) fn charge(&self, m: HelperMark, w: &Waiter, row: usize) -> (usize, Duration) {
        let h = self.cpu().saturating_sub(m.cpu);
        match self.dispatch_row {
            Some(d) if Self::dispatched(w) == m.dispatched => (d, h),
            _ => (row, h),
        }
    }
}

/// What the consumer counts queues with: requests sent per mode, and
/// its takes for the backlog.
struct Counts {
    sent: Arc<Vec<AtomicU64>>,
    takes: backlog::Takes,
}

fn consumer(
    mut ends: Vec<Ends>,
    counts: Counts,
    segs: Vec<Segment>,
    epoch: Instant,
    cpu: u32,
    slice: Option<Duration>,
    helper: Option<Arc<Dispatcher>>,
) -> Result<Vec<Measured>> {
    fastwake::cpu::pin(cpu)?;
    take_slice(slice)?;
    let mut out: Vec<Measured> = (0..ends.len()).map(|_| Measured::new()).collect();
    let mut taken = vec![0u64; ends.len()];
    let Counts { sent, mut takes } = counts;
    let helper = HelperClock::new(helper, ends.iter().map(|e| &e.waiter));
    for s in &segs {
        let e = &mut ends[s.mode];
        loop {
            if e.rx.wait(&mut e.waiter)? == START {
                break;
            }
        }
        // Warm-up windows are not charged: no figures read for them.
        let window = s.measured.then(|| Window::open(&helper, &e.waiter, cpu));
        let o = &mut out[s.mode];
        loop {
            let tag = e.rx.wait(&mut e.waiter)?;
            let got = now_ns(epoch);
            if tag == STOP {
                break;
            }
            taken[s.mode] += 1;
            if s.measured {
                o.sample
                    .record_one_way(Duration::from_nanos(got.saturating_sub(tag)));
                o.msgs += 1;
                // Those sent after this one and not yet taken.
                let q = sent[s.mode]
                    .load(Ordering::Acquire)
                    .saturating_sub(taken[s.mode]);
                o.queue_sum += q;
                o.queue_max = o.queue_max.max(q);
                takes.record(tag, got);
            }
        }
        if let Some(w) = window {
            w.close(&helper, &e.waiter, &mut out, s.mode);
            takes.close(&mut out[s.mode].backlog);
        }
    }
    for (e, o) in ends.iter().zip(out.iter_mut()) {
        o.explain = e.waiter.explain().or_else(|| helper.explain(&e.waiter));
        o.prewakes = helper.prewakes(&e.waiter);
    }
    Ok(out)
}

/// One measured window of waits by one mode, on the waiting thread:
/// what it is charged (its CPU, wall time, sleeps, the dispatcher's CPU)
/// and what others took of its CPU meanwhile.
struct Window {
    mark: HelperMark,
    sleeps: u64,
    busy: Option<u64>,
    cpu: Duration,
    sched: Option<fastwake::cpu::SchedStat>,
    wall: Instant,
    on: u32,
}

impl Window {
    /// At its start, on the waiting thread, pinned to `on`.
    fn open(helper: &HelperClock, w: &Waiter, on: u32) -> Window {
        Window {
            mark: helper.mark(w),
            sleeps: w.stats().sleeps,
            busy: cpu_busy(on),
            cpu: fastwake::cpu::thread_cpu_time(),
            sched: fastwake::cpu::thread_schedstat(),
            wall: Instant::now(),
            on,
        }
    }

    /// At its end: charge `out[row]` (and the dispatcher's CPU to the row
    /// [`HelperClock::charge`] says). Others' share is the CPU's busy time
    /// in /proc/stat less the waiter's and the dispatcher's own.
    fn close(self, helper: &HelperClock, w: &Waiter, out: &mut [Measured], row: usize) {
        let own = fastwake::cpu::thread_cpu_time() - self.cpu;
        let (helper_row, h) = helper.charge(self.mark, w, row);
        let o = &mut out[row];
        o.cpu += own;
        o.wall += self.wall.elapsed();
        o.sleeps += w.stats().sleeps - self.sleeps;
        o.others = match (o.others, self.busy, cpu_busy(self.on)) {
            (Some(t), Some(b0), Some(b1)) => {
                Some(t + Duration::from_nanos(b1.saturating_sub(b0)).saturating_sub(own + h))
            }
            _ => None,
        };
        o.run_delay = match (o.run_delay, self.sched, fastwake::cpu::thread_schedstat()) {
            (Some(t), Some(a), Some(b)) => {
                Some(t + Duration::from_nanos(b.delay_ns.saturating_sub(a.delay_ns)))
            }
            _ => None,
        };
        out[helper_row].helper_cpu += h;
    }
}

/// Busy ns of `cpu` since boot (/proc/stat).
fn cpu_busy(cpu: u32) -> Option<u64> {
    fastwake::adaptive::pressure::cpu_times()?
        .get(cpu as usize)
        .map(|t| t.busy_ns)
}

/// A thread that burns the consumer's CPU until told to stop.
fn hog(cpu: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if fastwake::cpu::pin(cpu).is_err() {
            return;
        }
        while !stop.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    })
}

fn run_scenario(
    a: &Args,
    sc: Scenario,
    modes: &[WaitMode],
    names: &[String],
) -> Result<(Vec<Row>, Vec<Option<String>>)> {
    let _bg = sc.bg.map(|b| background::start(b, a.seed)).transpose()?;
    let stop = Arc::new(AtomicBool::new(false));
    let hog_t = sc.hog.then(|| hog(a.cpus.1, stop.clone()));
    let mut timers = None;
    let measured = if sc.pattern.closed() {
        let segs = segments(modes.len(), a);
        service::run(a, sc, modes, segs).map(|(v, t)| {
            timers = t;
            v.into_iter()
                .map(|c| (c.m, Some(c.e2e)))
                .collect::<Vec<_>>()
        })
    } else {
        open_loop(a, sc, modes).map(|v| v.into_iter().map(|m| (m, None)).collect::<Vec<_>>())
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = hog_t {
        let _ = h.join();
    }
    let measured = measured?;
    let place = if a.cpus.0 == a.cpus.1 {
        "same"
    } else {
        "cross"
    };
    // The pre-wake floor, where polling was run beside the timer probe.
    let floor = timers.as_ref().and_then(|t| {
        let i = modes.iter().position(|m| *m == WaitMode::Poll)?;
        let (m, e2e) = &measured[i];
        floor::floor(t, e2e.as_ref()?, m.cpu_us_per_req())
    });
    let mut rows = Vec::new();
    let mut explains = Vec::new();
    for (i, (m, e2e)) in measured.into_iter().enumerate() {
        let mut r = Row::from_sample(
            &a.source,
            &names[i],
            place,
            a.size,
            &m.sample,
            m.cpu,
            m.helper_cpu,
        );
        let cpu_s = m.cpu_s();
        let wall = m.wall.as_secs_f64().max(1e-9);
        let x = &mut r.extra;
        x.insert("scenario".into(), sc.name().into());
        x.insert("pattern".into(), sc.pattern.name().into());
        if sc.pattern.closed() {
            x.insert("service_us".into(), sc.rate.into());
        } else {
            x.insert("rate".into(), sc.rate.into());
            x.insert(
                "queue_mean".into(),
                (m.queue_sum as f64 / m.msgs.max(1) as f64).into(),
            );
            x.insert("queue_max".into(), m.queue_max.into());
            if let Some(b) = m.backlog.mean() {
                x.insert("backlog_mean".into(), b.into());
                x.insert("backlog_max".into(), m.backlog.max.into());
            }
        }
        x.insert("hog".into(), sc.hog.into());
        if let Some(s) = a.slice {
            x.insert("consumer_slice_us".into(), (s.as_secs_f64() * 1e6).into());
        }
        if let Some(b) = sc.bg {
            x.insert("background".into(), b.name().into());
        }
        x.insert("cpu_s".into(), cpu_s.into());
        x.insert("wall_s".into(), wall.into());
        if let Some(o) = m.others {
            x.insert(
                "others_pct_of_consumer_cpu".into(),
                (100.0 * o.as_secs_f64() / wall).min(100.0).into(),
            );
        }
        if let Some(d) = m.run_delay {
            x.insert(
                "run_delay_us_per_req".into(),
                (1e6 * d.as_secs_f64() / m.msgs.max(1) as f64).into(),
            );
        }
        x.insert("cpu_pct_of_core".into(), (100.0 * cpu_s / wall).into());
        x.insert("cpu_us_per_req".into(), m.cpu_us_per_req().into());
        x.insert("msgs".into(), m.msgs.into());
        x.insert("sleeps".into(), m.sleeps.into());
        x.insert("prewakes".into(), m.prewakes.into());
        if let Some(e2e) = e2e {
            x.insert("e2e_p50_us".into(), e2e.quantile_us(0.5).into());
            x.insert("e2e_p99_us".into(), e2e.quantile_us(0.99).into());
        }
        if let Some(e) = &m.explain {
            x.insert("adaptive".into(), e.clone().into());
        }
        if let Some(fl) = &floor {
            fl.insert(x);
        }
        rows.push(r);
        explains.push(m.explain);
    }
    Ok((rows, explains))
}

/// The calling thread (a consumer) asks for `--slice`, if given.
pub(super) fn take_slice(slice: Option<Duration>) -> Result<()> {
    match slice {
        Some(s) => fastwake::slice::set_slice(Some(s))
            .map_err(|e| Fail::new(e.errno(), format!("--slice: {e}"))),
        None => Ok(()),
    }
}

/// `--dispatcher`: `fixed`, or an adaptive mode whose options configure
/// the learned idle policy.
fn parse_dispatcher(s: &str) -> std::result::Result<String, String> {
    let expected = || format!("'{s}': expected fixed, adaptive or adaptive:OPTIONS");
    if s == "fixed" {
        return Ok(s.to_string());
    }
    match s.parse::<WaitMode>() {
        Ok(WaitMode::Adaptive(_)) => Ok(s.to_string()),
        Err(e) if s.starts_with("adaptive:") => Err(e.to_string()),
        _ => Err(expected()),
    }
}

/// The learned idle policy `--dispatcher` asks for (`None`: fixed).
fn learned_idle(s: &str) -> Option<fastwake::adaptive::Config> {
    match s.parse::<WaitMode>() {
        Ok(WaitMode::Adaptive(c)) => Some(c),
        _ => None,
    }
}

/// The dispatcher on the consumer's CPU, with the idle policy of
/// `--dispatcher`.
pub(super) fn start_dispatcher(a: &Args) -> Result<Arc<Dispatcher>> {
    let mut dc = dispatch::Config::new(a.cpus.1);
    dc.learn_idle = learned_idle(&a.dispatcher);
    Ok(Arc::new(Dispatcher::start(dc)?))
}

/// Takes to make room for in a measured window: its mean count with room
/// for ON/OFF's bursts (their ON time in a window varies) and Poisson's
/// spread.
fn window_room(sc: Scenario, segs: &[Segment]) -> usize {
    let ns = segs
        .iter()
        .filter(|s| s.measured)
        .map(|s| s.ns)
        .max()
        .unwrap_or(0);
    let mean = ns as f64 * sc.rate as f64 / 1e9;
    let spread = if sc.pattern == Pattern::OnOff {
        3.0
    } else {
        1.5
    };
    (mean * spread) as usize + 4096
}

/// The open-loop scenarios: producer and consumer, every mode interleaved.
fn open_loop(a: &Args, sc: Scenario, modes: &[WaitMode]) -> Result<Vec<Measured>> {
    let (txs, ends): (Vec<Tx>, Vec<Ends>) = streams(&a.source, modes, a.size)?.into_iter().unzip();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..modes.len()).map(|_| AtomicU64::new(0)).collect());
    let helper = if modes.contains(&WaitMode::Dispatch) {
        Some(start_dispatcher(a)?)
    } else {
        None
    };
    let segs = segments(modes.len(), a);
    let epoch = Instant::now();
    let (pc, cc) = a.cpus;
    let (seed, size) = (a.seed, a.size);
    let segs2 = segs.clone();
    let sent2 = sent.clone();
    let prod = std::thread::Builder::new()
        .name("fw-load-prod".into())
        .spawn(move || {
            let pace = Pace {
                seed,
                epoch,
                cpu: pc,
                payload: size,
            };
            producer(txs, sent2, segs2, sc, pace)
        })
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn producer: {e}")))?;
    let h2 = helper.clone();
    let slice = a.slice;
    let counts = Counts {
        sent,
        takes: backlog::Takes::with_room(window_room(sc, &segs)),
    };
    let cons = std::thread::Builder::new()
        .name("fw-load-cons".into())
        .spawn(move || consumer(ends, counts, segs, epoch, cc, slice, h2))
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn consumer: {e}")))?;
    let pr = prod.join();
    let cr = cons.join();
    drop(helper);
    pr.map_err(|_| Fail::new(libc::EIO, "producer panicked"))??;
    cr.map_err(|_| Fail::new(libc::EIO, "consumer panicked"))?
}

pub fn run(mut a: Args) -> Result<()> {
    if a.source != "channel" && a.source != "tcp" {
        return Err(Fail::invalid(format!(
            "unknown source '{}': bench load supports: channel, tcp",
            a.source
        )));
    }
    if a.rates.is_empty() || a.rates.iter().any(|r| *r == 0 || *r > 2_000_000) {
        return Err(Fail::invalid("--rates must be 1 to 2000000 requests/s"));
    }
    if a.service_us.is_empty() || a.service_us.iter().any(|d| *d == 0 || *d > 1_000_000) {
        return Err(Fail::invalid("--service-us must be 1 to 1000000 µs"));
    }
    if !(a.secs > 0.0 && a.secs <= 3600.0) || a.rounds == Some(0) {
        return Err(Fail::invalid(
            "--secs must be in (0, 3600] and --rounds at least 1",
        ));
    }
    if a.size > 4096 {
        return Err(Fail::invalid("--size must be at most 4096"));
    }
    let patterns = a
        .patterns
        .iter()
        .map(|p| Pattern::parse(p))
        .collect::<Result<Vec<_>>>()?;
    let hogs: &[bool] = match a.hog.as_str() {
        "off" => &[false],
        "on" => &[true],
        "both" => &[false, true],
        o => {
            return Err(Fail::invalid(format!(
                "bad --hog '{o}': expected off, on or both"
            )));
        }
    };
    let modes = a
        .mode
        .iter()
        .map(|m| m.parse::<WaitMode>())
        .collect::<Result<Vec<_>>>()?;
    let names = report::row_names(&modes)?;
    // Every mode in every position and after every other mode alike.
    a.rounds = Some(
        a.rounds
            .unwrap_or_else(|| Rounds::period(modes.len()).max(4) as u32),
    );
    if let Some(d) = &a.plot {
        std::fs::create_dir_all(d).map_err(|e| {
            Fail::new(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("create plot directory {}: {e}", d.display()),
            )
        })?;
    }
    let mut scenarios = Vec::new();
    for &hog in hogs {
        for &pattern in &patterns {
            let values = if pattern.closed() {
                &a.service_us
            } else {
                &a.rates
            };
            for &rate in values {
                scenarios.push(Scenario {
                    pattern,
                    rate,
                    hog,
                    bg: a.background,
                });
            }
        }
    }
    let mut rows = Vec::new();
    for sc in &scenarios {
        if !a.json {
            eprintln!("bench load: scenario {} ...", sc.name());
        }
        let (r, explains) = run_scenario(&a, *sc, &modes, &names)?;
        if a.explain && !a.json {
            for (m, e) in names.iter().zip(explains) {
                if let Some(e) = e {
                    eprintln!("  explain {} {m}: {e}", sc.name());
                }
            }
        }
        rows.extend(r);
    }
    if let Some(d) = &a.plot {
        for sc in &scenarios {
            let name = sc.name();
            let rs: Vec<&Row> = rows
                .iter()
                .filter(|r| r.extra.get("scenario").and_then(|v| v.as_str()) == Some(&name))
                .collect();
            let paths = plot::write(d, &name, &rs)?;
            if !a.json {
                eprintln!("plot: {}", paths.join(" "));
            }
        }
    }
    if a.json {
        stats::print_json(&rows);
    } else {
        print_table(&a, &rows, &scenarios);
    }
    Ok(())
}
