//! The arrangements `bench lanes` compares, their serving threads, and
//! one measured turn of each.

use super::replies::{Replies, reader_of};
use fastwake::lanes::{Class, Config, Endpoint, Layout, Listener, connect};
use fastwake::{Fail, Result};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes 4..8 of every message say what it is.
const REQUEST: u32 = 1;
const BULK: u32 = 2;

/// Unmeasured time at the start of every turn: connections and waits
/// settle, the writer fills the socket buffers.
const SETTLE: Duration = Duration::from_millis(50);
/// Time after a turn for the servers to drain what is still buffered,
/// so no turn inherits its predecessor's bytes.
const DRAIN: Duration = Duration::from_millis(30);

fn kind(m: &[u8]) -> u32 {
    u32::from_le_bytes([m[4], m[5], m[6], m[7]])
}

/// A message of `len` bytes (at least 8) for reader `id` (or the writer)
/// of `kind`.
pub fn message(id: u32, kind: u32, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len.max(8)];
    m[..4].copy_from_slice(&id.to_le_bytes());
    m[4..8].copy_from_slice(&kind.to_le_bytes());
    m
}

/// Where the work runs, as queue maps align it: reads on one CPU, bulk
/// on another.
#[derive(Debug, Clone, Copy)]
pub struct Cpus {
    pub latency: u32,
    pub bulk: u32,
    /// The scheduler slice the readers and the threads serving only reads
    /// ask for (`--slice`; `None`: the kernel's).
    pub read_slice: Option<Duration>,
}

/// The calling thread asks for `slice`, if any (checked by
/// [`check_slice`] before any thread starts).
fn take_slice(slice: Option<Duration>) {
    if slice.is_some() {
        let _ = fastwake::slice::set_slice(slice);
    }
}

/// Can a thread have `slice`? One line for `--slice` if not.
pub fn check_slice(slice: Option<Duration>) -> Result<()> {
    let Some(s) = slice else { return Ok(()) };
    std::thread::spawn(move || fastwake::slice::set_slice(Some(s)))
        .join()
        .map_err(|_| Fail::new(libc::EIO, "slice probe panicked"))?
        .map_err(|e| Fail::new(e.errno(), format!("--slice: {e}")))
}

/// What one arrangement looks like.
pub struct Plan {
    pub name: String,
    /// Synchronous readers, each on `(endpoint, slot)`.
    pub readers: Vec<(usize, usize)>,
    /// The writer's endpoint, and the size and class of its messages.
    pub writer: usize,
    pub bulk: usize,
    pub bulk_class: Class,
    /// The client endpoints, and how each is configured.
    pub configs: Vec<Config>,
}

/// An arrangement set up: client endpoints connected, servers running.
pub struct Arrangement {
    pub plan: Plan,
    eps: Vec<Arc<Endpoint>>,
    /// The servers' endpoints (they send nothing but answers).
    answering: Vec<Arc<Endpoint>>,
    replies: Vec<Arc<Replies>>,
    /// Bulk payload bytes the servers received.
    bulk_bytes: Arc<AtomicU64>,
    servers: Vec<JoinHandle<()>>,
}

/// One turn's measurements.
pub struct Turn {
    pub reads: Histogram<u64>,
    pub wall: Duration,
    pub cpu: Duration,
    pub bulk_bytes: u64,
    pub bulk_sent_bytes: u64,
    pub bulk_syscalls: u64,
    /// What the sends of reads did.
    pub read_sends: ReadSends,
    /// Run time of other processes' threads meanwhile (the machine's
    /// housekeeping, other programs): with both CPUs busy, each of their
    /// stretches took one of ours.
    pub others: Duration,
}

/// The sends of reads, summed over the lanes that carry them.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadSends {
    /// Requests' sends that parked for a turn on their lane.
    pub turn_waits: u64,
    /// Requests left with the thread holding their lane's turn.
    pub handed: u64,
    /// `sendmsg`s on the readers' lanes: requests only, unless
    /// `with_bulk`.
    pub request_sendmsgs: u64,
    /// The writer's bulk goes on a readers' lane too (one shared
    /// connection), so `request_sendmsgs` counts its `sendmsg`s as well.
    pub with_bulk: bool,
    /// `sendmsg`s that carried answers (servers' lanes).
    pub answer_sendmsgs: u64,
}

impl std::ops::Sub for ReadSends {
    type Output = ReadSends;
    fn sub(self, o: ReadSends) -> ReadSends {
        ReadSends {
            turn_waits: self.turn_waits - o.turn_waits,
            handed: self.handed - o.handed,
            request_sendmsgs: self.request_sendmsgs - o.request_sendmsgs,
            answer_sendmsgs: self.answer_sendmsgs - o.answer_sendmsgs,
            with_bulk: self.with_bulk,
        }
    }
}

impl std::ops::AddAssign for ReadSends {
    fn add_assign(&mut self, o: ReadSends) {
        self.turn_waits += o.turn_waits;
        self.handed += o.handed;
        self.request_sendmsgs += o.request_sendmsgs;
        self.answer_sendmsgs += o.answer_sendmsgs;
        self.with_bulk |= o.with_bulk;
    }
}

/// Serve one lane of a server endpoint: answer requests with a
/// `reply`-byte message, count bulk bytes. Ends when the client closes.
fn serve(
    ep: Arc<Endpoint>,
    class: Class,
    reply: usize,
    bulk: Arc<AtomicU64>,
    (cpu, slice): (u32, Option<Duration>),
) {
    let _ = fastwake::cpu::pin(cpu);
    take_slice(slice);
    let mut answer = message(0, 0, reply);
    loop {
        let got = ep.recv_with(class, |m| (kind(m), reader_of(m), m.len()));
        match got {
            Ok((REQUEST, id, _)) => {
                answer[..4].copy_from_slice(&(id as u32).to_le_bytes());
                // Requests that arrived together are answered in one
                // `sendmsg` (the NVMe/TCP host's `MSG_MORE` while more is
                // queued), in every arrangement alike.
                let sent = if ep.buffered(class) {
                    ep.send_more_as(&answer, Class::Latency)
                } else {
                    ep.send_as(&answer, Class::Latency)
                };
                if sent.is_err() {
                    return;
                }
            }
            Ok((_, _, len)) => {
                bulk.fetch_add(len as u64, Ordering::Relaxed);
            }
            Err(_) => return,
        }
    }
}

impl Arrangement {
    /// Connect `plan`'s endpoints to a listener of `server`'s parameters
    /// and start their servers: a thread serving only reads on
    /// `cpus.latency`, one serving bulk (alone or with reads) on
    /// `cpus.bulk`.
    pub fn new(plan: Plan, server: Config, reply: usize, cpus: Cpus) -> Result<Arrangement> {
        let listener = Arc::new(Listener::bind(
            "127.0.0.1:0".parse().expect("an address"),
            server,
        )?);
        let addr = listener.local_addr()?;
        let n = plan.configs.len();
        let l2 = listener.clone();
        let acceptor =
            std::thread::spawn(move || (0..n).map(|_| l2.accept()).collect::<Result<Vec<_>>>());
        let mut eps = Vec::with_capacity(n);
        for c in &plan.configs {
            eps.push(Arc::new(connect(addr, *c)?));
        }
        let accepted = acceptor
            .join()
            .map_err(|_| Fail::new(libc::EIO, "accepting thread panicked"))??;
        let bulk_bytes = Arc::new(AtomicU64::new(0));
        let mut servers = Vec::new();
        let mut answering = Vec::new();
        for (i, ep) in accepted.into_iter().enumerate() {
            let ep = Arc::new(ep);
            answering.push(ep.clone());
            // Where each server thread runs, and its slice: the read
            // slice for a thread serving only reads.
            let (reads, bulk) = ((cpus.latency, cpus.read_slice), (cpus.bulk, None));
            let classes = if ep.connections() == 2 {
                vec![(Class::Latency, reads), (Class::Bulk, bulk)]
            } else if i == plan.writer {
                vec![(Class::Latency, bulk)]
            } else {
                vec![(Class::Latency, reads)]
            };
            for (class, server_cpu) in classes {
                let (ep, b) = (ep.clone(), bulk_bytes.clone());
                servers.push(
                    std::thread::Builder::new()
                        .name(format!("fw-lanes-srv-{}", class.name()))
                        .spawn(move || serve(ep, class, reply, b, server_cpu))
                        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn server: {e}")))?,
                );
            }
        }
        let mut per_ep = vec![0usize; n];
        for &(e, _) in &plan.readers {
            per_ep[e] += 1;
        }
        Ok(Arrangement {
            replies: per_ep.iter().map(|&k| Arc::new(Replies::new(k))).collect(),
            plan,
            eps,
            answering,
            bulk_bytes,
            servers,
        })
    }

    /// Client-side connections.
    pub fn connections(&self) -> usize {
        self.eps.iter().map(|e| e.connections()).sum()
    }

    /// Run the readers on `cpus.latency` and the writer on `cpus.bulk`
    /// for `len` (after [`SETTLE`]), measuring.
    pub fn turn(&self, len: Duration, request: usize, cpus: Cpus) -> Result<Turn> {
        let stop = Arc::new(AtomicBool::new(false));
        let measuring = Arc::new(AtomicBool::new(false));
        let mut readers = Vec::new();
        for &(e, slot) in &self.plan.readers {
            let ep = self.eps[e].clone();
            let replies = self.replies[e].clone();
            let (stop, measuring) = (stop.clone(), measuring.clone());
            readers.push(std::thread::spawn(move || -> Result<Histogram<u64>> {
                fastwake::cpu::pin(cpus.latency)?;
                take_slice(cpus.read_slice);
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                    .map_err(|e| Fail::invalid(format!("histogram: {e}")))?;
                let req = message(slot as u32, REQUEST, request);
                let mut more = false;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    if more {
                        ep.send_more_as(&req, Class::Latency)?;
                    } else {
                        ep.send_as(&req, Class::Latency)?;
                    }
                    replies.wait(&ep, slot)?;
                    if measuring.load(Ordering::Relaxed) {
                        h.saturating_record(t0.elapsed().as_nanos() as u64);
                    }
                    more = replies.more_follow();
                }
                Ok(h)
            }));
        }
        let writer = {
            let ep = self.eps[self.plan.writer].clone();
            let (stop, measuring) = (stop.clone(), measuring.clone());
            let msg = message(u32::MAX, BULK, self.plan.bulk);
            let class = self.plan.bulk_class;
            // With no readers (the bulk lane alone) the writer takes the
            // readers' CPU: sender and receiver a core each, as a
            // throughput test runs them.
            let cpu = if self.plan.readers.is_empty() {
                cpus.latency
            } else {
                cpus.bulk
            };
            // The writer always has more: it says so (`send_more`), and
            // its lane batches where batching is on.
            std::thread::spawn(move || -> Result<(u64, u64)> {
                fastwake::cpu::pin(cpu)?;
                let (mut bytes, mut calls) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let s = ep.send_more_as(&msg, class)?;
                    if measuring.load(Ordering::Relaxed) {
                        bytes += msg.len() as u64;
                        calls += s.syscalls;
                    }
                }
                ep.flush()?;
                Ok((bytes, calls))
            })
        };
        std::thread::sleep(SETTLE);
        // Before the window: the scan of /proc costs this thread a few ms.
        let others0 = crate::others::run_times();
        let s0 = self.read_sends();
        let b0 = self.bulk_bytes.load(Ordering::Relaxed);
        let c0 = process_cpu();
        let t0 = Instant::now();
        measuring.store(true, Ordering::Relaxed);
        std::thread::sleep(len);
        measuring.store(false, Ordering::Relaxed);
        let wall = t0.elapsed();
        let read_sends = self.read_sends() - s0;
        let cpu_used = process_cpu().saturating_sub(c0);
        let bulk_bytes = self.bulk_bytes.load(Ordering::Relaxed) - b0;
        let others =
            Duration::from_nanos(crate::others::ran(&others0, &crate::others::run_times()).1);
        stop.store(true, Ordering::Relaxed);
        let mut reads = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| Fail::invalid(format!("histogram: {e}")))?;
        for r in readers {
            let h = r
                .join()
                .map_err(|_| Fail::new(libc::EIO, "reader panicked"))??;
            reads
                .add(&h)
                .map_err(|e| Fail::invalid(format!("histogram: {e}")))?;
        }
        let (bulk_sent_bytes, bulk_syscalls) = writer
            .join()
            .map_err(|_| Fail::new(libc::EIO, "writer panicked"))??;
        std::thread::sleep(DRAIN);
        Ok(Turn {
            reads,
            wall,
            cpu: cpu_used,
            bulk_bytes,
            bulk_sent_bytes,
            bulk_syscalls,
            read_sends,
            others,
        })
    }

    /// The sends of reads so far: the latency lanes of the readers'
    /// endpoints (each counted once) and of the servers' endpoints (only
    /// answers go out there).
    fn read_sends(&self) -> ReadSends {
        let mut eps: Vec<usize> = self.plan.readers.iter().map(|r| r.0).collect();
        eps.dedup();
        let mut s = ReadSends {
            with_bulk: eps.contains(&self.plan.writer)
                && self.eps[self.plan.writer].connections() == 1,
            ..ReadSends::default()
        };
        for &e in &eps {
            let c = self.eps[e].send_counters(Class::Latency);
            s.turn_waits += c.turn_waits;
            s.handed += c.handed;
            s.request_sendmsgs += c.sendmsgs;
        }
        for ep in &self.answering {
            s.answer_sendmsgs += ep.send_counters(Class::Latency).sendmsgs;
        }
        s
    }

    /// Close the client endpoints and wait for the servers to see it.
    pub fn close(self) {
        drop(self.eps);
        for s in self.servers {
            let _ = s.join();
        }
    }
}

fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The three arrangements of the NVMe/TCP experiment, for `readers`
/// readers and a writer of `bulk`-byte messages.
pub fn experiment(readers: usize, bulk: usize, lanes: Config) -> Vec<Plan> {
    let shared = Config {
        layout: Layout::Shared,
        ..lanes
    };
    // The writer's own connection carries bulk only: it waits as a bulk
    // lane does.
    let writer_own = Config {
        latency_mode: lanes.bulk_mode,
        ..shared
    };
    let mut per_reader: Vec<Config> = vec![shared; readers];
    per_reader.push(writer_own);
    vec![
        Plan {
            name: "shared".into(),
            readers: (0..readers).map(|i| (0, i)).collect(),
            writer: 0,
            bulk,
            bulk_class: Class::Bulk,
            configs: vec![shared],
        },
        Plan {
            name: "lanes".into(),
            readers: (0..readers).map(|i| (0, i)).collect(),
            writer: 0,
            bulk,
            bulk_class: Class::Bulk,
            configs: vec![lanes],
        },
        Plan {
            name: "per-reader".into(),
            readers: (0..readers).map(|i| (i, 0)).collect(),
            writer: readers,
            bulk,
            bulk_class: Class::Bulk,
            configs: per_reader,
        },
    ]
}

/// The bulk lane alone, batching on and off, for messages of `size`.
pub fn batching(size: usize, lanes: Config) -> Vec<Plan> {
    let on = lanes.batch.unwrap_or(fastwake::lanes::Batch::I10);
    let rule = format!(
        "on ({} msgs, {}, {} us)",
        on.messages,
        super::bytes(on.bytes),
        on.delay.as_micros()
    );
    [(rule, Some(on)), ("off".to_string(), None)]
        .into_iter()
        .map(|(name, batch)| Plan {
            name: format!(
                "bulk alone, {} messages, batching {name}",
                super::bytes(size)
            ),
            readers: Vec::new(),
            writer: 0,
            bulk: size,
            bulk_class: Class::Bulk,
            configs: vec![Config { batch, ..lanes }],
        })
        .collect()
}
