//! `fastwake bench lanes`: the NVMe/TCP host's read-beside-write experiment on loopback TCP.
//! N synchronous readers (one small request outstanding each, answered
//! with a 4 KiB reply) and one writer streaming 1 MiB messages without
//! bound, in three arrangements interleaved over rounds: one shared
//! connection, lanes (a latency lane and a bulk lane), and one connection
//! per reader plus one for the writer. Then the bulk lane alone with
//! batching on and off.

mod arrangement;
mod plot;
mod replies;
pub mod report;

use super::parse_cpus;

use super::rounds::Rounds;
use arrangement::Arrangement;
use clap::Args as ClapArgs;
use fastwake::lanes::{self, Config};
use fastwake::{Fail, Result, WaitMode};
use report::Row;
use std::time::Duration;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Synchronous readers, one request outstanding each.
    #[arg(long, default_value_t = 16)]
    pub readers: usize,
    /// Bytes of a read request.
    #[arg(long, default_value_t = 16)]
    pub request: usize,
    /// Bytes of the reply to a read.
    #[arg(long, default_value_t = 4096)]
    pub reply: usize,
    /// Bytes of each message the writer streams.
    #[arg(long, default_value_t = 1 << 20)]
    pub bulk: usize,
    /// Measured seconds per arrangement, over all rounds.
    ///
    /// A p99.99 needs reads behind it: one stall of the read CPU (another
    /// thread running on it for a few ms, or a host taking the vCPU away)
    /// delays every read in flight, so the default leaves a four-nines
    /// tail of at least 48 reads (three such stalls with 16 readers) down
    /// to 32k IOPS.
    #[arg(long, default_value_t = 15.0)]
    pub seconds: f64,
    /// Interleaving rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: u64,
    /// CPUs `LATENCY,BULK`: reads on the first, bulk on the second.
    ///
    /// The readers and the threads serving only reads are pinned to the
    /// first; the writer and the threads serving bulk (a shared
    /// connection's included) to the second, as queue maps align queues.
    /// With no readers (the bulk lane alone) the writer takes the first.
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    pub cpus: (u32, u32),
    /// Scheduler slice of the threads on the read CPU, e.g. 100us.
    ///
    /// The readers and the threads serving only reads ask for this slice
    /// (Linux 6.12 or later; see fastwake::slice), in every arrangement:
    /// woken by a read, such a thread preempts another thread running on
    /// that CPU (a kernel thread, another program) instead of waiting out
    /// its turn. The writer and the threads serving bulk keep the
    /// kernel's. Default: the kernel's slice for all.
    #[arg(long, value_parser = crate::values::slice, value_name = "DURATION")]
    pub slice: Option<std::time::Duration>,
    /// Largest message on the latency lane.
    #[arg(long, default_value_t = lanes::THRESHOLD)]
    pub threshold: usize,
    /// Bytes per bulk sendmsg.
    #[arg(long, default_value_t = lanes::CHUNK)]
    pub chunk: usize,
    /// Bytes per bulk sendmsg while a read is in flight.
    #[arg(long, default_value_t = lanes::POLITE_CHUNK)]
    pub polite_chunk: usize,
    /// Messages per batched sendmsg at most (i10: 16).
    #[arg(long, default_value_t = lanes::Batch::I10.messages)]
    pub batch_messages: usize,
    /// Bytes per batch at most (i10: 64 KiB).
    #[arg(long, default_value_t = lanes::Batch::I10.bytes)]
    pub batch_bytes: usize,
    /// How long a batch may wait for more (i10: 50us).
    #[arg(long, default_value = "50us", value_parser = crate::values::duration)]
    pub batch_delay: std::time::Duration,
    /// How the latency lane (and a shared connection) waits.
    #[arg(long, default_value = "hybrid")]
    pub latency_mode: WaitMode,
    /// How the bulk lane waits.
    #[arg(long, default_value = "interrupt")]
    pub bulk_mode: WaitMode,
    /// Message sizes of the batching comparison (bulk lane alone).
    ///
    /// The writer says it has more (`send_more`); batching on, its
    /// messages share `sendmsg`s by i10's rule; off, each goes alone.
    #[arg(long, value_delimiter = ',', default_value = "16384,1048576")]
    pub batch_sizes: Vec<usize>,
    /// Skip the batching comparison.
    #[arg(long)]
    pub no_batching: bool,
    /// Measured seconds per batching row, over all rounds.
    #[arg(long, default_value_t = 1.0)]
    pub batch_seconds: f64,
    /// Arrangements to run: shared, lanes, per-reader (default all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write the read-latency plot into DIR (lanes.svg, lanes.png).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<std::path::PathBuf>,
}

impl Args {
    fn config(&self) -> Result<Config> {
        let c = Config {
            threshold: self.threshold,
            chunk: self.chunk,
            polite_chunk: self.polite_chunk,
            latency_mode: self.latency_mode,
            bulk_mode: self.bulk_mode,
            max_message: lanes::MAX_MESSAGE
                .max(self.bulk)
                .max(self.batch_sizes.iter().copied().max().unwrap_or(0)),
            batch: Some(lanes::Batch {
                messages: self.batch_messages,
                bytes: self.batch_bytes,
                delay: self.batch_delay,
            }),
            ..Config::default()
        };
        c.validate()?;
        if self.readers == 0 || self.readers > 1024 {
            return Err(Fail::invalid("--readers must be between 1 and 1024"));
        }
        if self.request < 8 || self.request > self.threshold {
            return Err(Fail::invalid(format!(
                "--request must be between 8 and the threshold ({})",
                self.threshold
            )));
        }
        if self.reply < 8 || self.reply > self.threshold {
            return Err(Fail::invalid(format!(
                "--reply must be between 8 and the threshold ({})",
                self.threshold
            )));
        }
        if self.bulk <= self.threshold || self.batch_sizes.iter().any(|&s| s < 8) {
            return Err(Fail::invalid(
                "--bulk must exceed the threshold, and --batch-sizes be at least 8",
            ));
        }
        let ok = |s: f64| s.is_finite() && s > 0.0 && s <= 600.0;
        if !ok(self.seconds) || !ok(self.batch_seconds) || self.rounds == 0 {
            return Err(Fail::invalid(
                "--seconds and --batch-seconds must be in (0, 600], --rounds at least 1",
            ));
        }
        Ok(c)
    }
}

pub fn run(a: Args) -> Result<()> {
    let config = a.config()?;
    let cpus = arrangement::Cpus {
        latency: a.cpus.0,
        bulk: a.cpus.1,
        read_slice: a.slice,
    };
    arrangement::check_slice(a.slice)?;
    let mut plans = arrangement::experiment(a.readers, a.bulk, config);
    for o in &a.only {
        if !plans.iter().any(|p| &p.name == o) {
            return Err(Fail::invalid(format!(
                "unknown arrangement '{o}': expected shared, lanes or per-reader"
            )));
        }
    }
    plans.retain(|p| a.only.is_empty() || a.only.contains(&p.name));
    let main = plans.len();
    for &s in a.batch_sizes.iter().filter(|_| !a.no_batching) {
        plans.extend(arrangement::batching(s, config));
    }
    let mut arrs = Vec::with_capacity(plans.len());
    for p in plans {
        arrs.push(Arrangement::new(p, config, a.reply, cpus)?);
    }
    let mut rows: Vec<Row> = arrs
        .iter()
        .map(|x| Row::new(&x.plan, x.connections()))
        .collect();
    // Shares of the run in ms: main arrangements and batching rows have
    // their own totals, one schedule each round.
    let total_ms = |s: f64| (s * 1000.0).round() as u64;
    let sched = Rounds::new(arrs.len(), a.rounds, a.rounds * 1000);
    for t in sched.turns() {
        let secs = if t.case < main {
            a.seconds
        } else {
            a.batch_seconds
        };
        let len = Duration::from_millis((total_ms(secs) / a.rounds).max(1));
        let r = arrs[t.case].turn(len, a.request, cpus)?;
        rows[t.case].add(&r)?;
    }
    for x in arrs {
        x.close();
    }
    let note = format!(
        "threads pinned: {} readers and the threads serving only reads on CPU {}{}, the writer and the threads serving bulk (a shared connection's too) on CPU {}; loopback TCP; latency lane {}, bulk lane {}; chunk {} (polite {}), batching {}; cpu/op = process CPU per read and bulk message; others ms/s = run time of other processes' threads per second measured",
        a.readers,
        cpus.latency,
        a.slice.map_or(String::new(), |s| format!(
            " with a {} µs scheduler slice",
            s.as_micros()
        )),
        cpus.bulk,
        a.latency_mode,
        a.bulk_mode,
        bytes(config.chunk),
        bytes(config.polite_chunk),
        config.batch.map_or("off".into(), |b| format!(
            "{} messages, {}, {} us",
            b.messages,
            bytes(b.bytes),
            b.delay.as_micros()
        ))
    );
    if a.json {
        report::print_json(&rows, main, &note)?;
    } else {
        report::print_tables(&rows, main, &note);
    }
    if let Some(w) = report::thin_tail(&rows[..main], a.readers) {
        eprintln!("{w}");
    }
    if let Some(d) = &a.plot {
        let paths = plot::write(d, &rows[..main])?;
        eprintln!("plot: {}", paths.join(" "));
    }
    Ok(())
}

/// `16 KiB`, `1 MiB`, `100 B`.
pub fn bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}
