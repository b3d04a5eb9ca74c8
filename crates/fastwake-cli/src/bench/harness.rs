//! The ping-pong measurement engine every benchmark shares.
//!
//! Two threads, each pinned to a CPU, bounce a message: the *ping* end
//! sends and waits for the reply, timing the round trip; the *pong* end waits
//! and replies. One-way latency is half the round trip, as perftest reports.
//!
//! Several cases (wait modes, mechanisms, placements) are measured in one
//! run, interleaved in rounds ([`super::rounds`]).

use super::rounds::Rounds;
use super::stats::{Row, Sample};
use fastwake::wait::WaitStats;
use fastwake::{Fail, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One end of a ping-pong pair.
pub trait End: Send {
    /// Send one message to the other end.
    fn send(&mut self) -> Result<()>;
    /// Wait for one message from the other end.
    fn recv(&mut self) -> Result<()>;
    /// The end's waiter's counters, for the report (`None`: it has none).
    fn wait_stats(&self) -> Option<WaitStats> {
        None
    }
}

impl<T: End + ?Sized> End for Box<T> {
    fn send(&mut self) -> Result<()> {
        (**self).send()
    }
    fn recv(&mut self) -> Result<()> {
        (**self).recv()
    }
    fn wait_stats(&self) -> Option<WaitStats> {
        (**self).wait_stats()
    }
}

/// Where the two ends run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub ping_cpu: u32,
    pub pong_cpu: u32,
}

impl Placement {
    pub fn label(&self) -> &'static str {
        if self.ping_cpu == self.pong_cpu {
            "same"
        } else {
            "cross"
        }
    }
}

/// One row to measure: a pair of ends plus labels.
pub struct Case {
    pub source: String,
    pub mode: String,
    pub placement: Placement,
    pub size: usize,
    pub ping: Box<dyn End>,
    pub pong: Box<dyn End>,
}

/// How long to run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Measured iterations per case.
    pub iters: u64,
    /// Unmeasured iterations per case, before the first measured one.
    pub warmup: u64,
    /// Interleaving rounds.
    pub rounds: u64,
}

impl Plan {
    fn schedule(&self, cases: usize) -> Rounds {
        Rounds::new(cases, self.rounds, self.iters)
    }
}

/// Shared progress counter, read by the progress bar.
#[derive(Clone, Default)]
pub struct Progress {
    pub done: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
}

struct Labels {
    source: String,
    mode: String,
    placement: Placement,
    size: usize,
}

/// Measure every case, interleaved. Returns one row per case, in order.
pub fn run(cases: Vec<Case>, plan: Plan, progress: &Progress) -> Result<Vec<Row>> {
    let mut labels = Vec::new();
    let mut pings = Vec::new();
    let mut pongs = Vec::new();
    for c in cases {
        labels.push(Labels {
            source: c.source,
            mode: c.mode,
            placement: c.placement,
            size: c.size,
        });
        pings.push(c.ping);
        pongs.push(c.pong);
    }
    let places: Vec<Placement> = labels.iter().map(|l| l.placement).collect();
    let places2 = places.clone();

    let pong = std::thread::Builder::new()
        .name("fw-pong".into())
        .spawn(move || (pong_loop(&mut pongs, &places2, plan, false), pongs))
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn pong thread: {e}")))?;
    let prog = progress.clone();
    let ping = std::thread::Builder::new()
        .name("fw-ping".into())
        .spawn(move || (ping_loop(&mut pings, &places, plan, &prog), pings))
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn ping thread: {e}")))?;
    let (ping_r, pings) = ping
        .join()
        .map_err(|_| Fail::new(libc::EIO, "ping thread panicked"))?;
    let (pong_r, pongs) = pong
        .join()
        .map_err(|_| Fail::new(libc::EIO, "pong thread panicked"))?;
    let (samples, ping_cpu) = ping_r?;
    let (_, pong_cpu) = pong_r?;
    Ok(labels
        .into_iter()
        .zip(samples)
        .enumerate()
        .map(|(i, (l, s))| {
            let mut row = Row::from_sample(
                &l.source,
                &l.mode,
                l.placement.label(),
                l.size,
                &s,
                ping_cpu[i],
                pong_cpu[i],
            );
            for (end, stats) in [
                ("ping", pings[i].wait_stats()),
                ("pong", pongs[i].wait_stats()),
            ] {
                if let Some(st) = stats.filter(|st| l.mode == "dispatch" || dispatched(st)) {
                    for (k, v) in [
                        ("without_sleep", st.without_sleep),
                        ("handoffs", st.handoffs),
                        ("relays", st.relays),
                        ("fallbacks", st.dispatch_fallbacks),
                        ("paused", st.dispatch_paused),
                    ] {
                        row.extra.insert(format!("{end}_{k}"), v.into());
                    }
                }
            }
            row
        })
        .collect())
}

/// Did these waits go through a dispatcher (or try to)?
fn dispatched(s: &WaitStats) -> bool {
    s.handoffs + s.relays + s.dispatch_fallbacks + s.dispatch_paused > 0
}

fn place(cpu: u32, current: &mut Option<u32>) -> Result<()> {
    if *current != Some(cpu) {
        fastwake::cpu::pin(cpu)?;
        *current = Some(cpu);
    }
    Ok(())
}

/// The ping end of every case, in the schedule's turns (the two-process
/// bench runs it alone in its client).
pub(crate) fn ping_loop<E: End>(
    ends: &mut [E],
    places: &[Placement],
    plan: Plan,
    progress: &Progress,
) -> Result<(Vec<Sample>, Vec<Duration>)> {
    let mut samples: Vec<Sample> = (0..ends.len()).map(|_| Sample::new()).collect();
    let mut cpu = vec![Duration::ZERO; ends.len()];
    let mut on = None;
    for t in plan.schedule(ends.len()).turns() {
        let (i, end) = (t.case, &mut ends[t.case]);
        place(places[i].ping_cpu, &mut on)?;
        if t.round == 0 {
            for _ in 0..plan.warmup {
                end.send()?;
                end.recv()?;
            }
        }
        let c0 = fastwake::cpu::thread_cpu_time();
        for _ in 0..t.amount {
            let t0 = Instant::now();
            end.send()?;
            end.recv()?;
            samples[i].record_rtt(t0.elapsed());
        }
        cpu[i] += fastwake::cpu::thread_cpu_time() - c0;
        progress.done.fetch_add(t.amount, Ordering::Relaxed);
        if progress.stop.load(Ordering::Relaxed) {
            return Err(Fail::new(libc::EINTR, "interrupted"));
        }
    }
    Ok((samples, cpu))
}

/// The pong end of every case, in the same turns. With `record`, it also
/// times each of its replies to the next message (a round trip seen from
/// this end, as perftest's server measures; off in the one-process bench,
/// where it would only cost a clock read per message).
pub(crate) fn pong_loop<E: End>(
    ends: &mut [E],
    places: &[Placement],
    plan: Plan,
    record: bool,
) -> Result<(Vec<Sample>, Vec<Duration>)> {
    let mut samples: Vec<Sample> = (0..ends.len()).map(|_| Sample::new()).collect();
    let mut cpu = vec![Duration::ZERO; ends.len()];
    let mut on = None;
    // The same turns as the ping end's, in the same order.
    for t in plan.schedule(ends.len()).turns() {
        let (i, end) = (t.case, &mut ends[t.case]);
        place(places[i].pong_cpu, &mut on)?;
        if t.round == 0 {
            for _ in 0..plan.warmup {
                end.recv()?;
                end.send()?;
            }
        }
        let c0 = fastwake::cpu::thread_cpu_time();
        if record {
            let mut replied: Option<Instant> = None;
            for _ in 0..t.amount {
                end.recv()?;
                if let Some(t0) = replied {
                    samples[i].record_rtt(t0.elapsed());
                }
                replied = Some(Instant::now());
                end.send()?;
            }
        } else {
            for _ in 0..t.amount {
                end.recv()?;
                end.send()?;
            }
        }
        cpu[i] += fastwake::cpu::thread_cpu_time() - c0;
    }
    Ok((samples, cpu))
}
