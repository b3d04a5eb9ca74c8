//! The client side: busy-polling threads, one per client CPU, each driving
//! its share of the connections in the `latency` or the `throughput` load.

use super::conn::ClientLink;
use super::mode::Load;
use super::servers::Servers;
use crate::bench::stats::Sample;
use fastwake::{Fail, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The client's end of one connection, and the tags it sent and got back.
pub(super) struct ClientEnd<L> {
    pub(super) link: L,
    pub(super) sent: u64,
    pub(super) received: u64,
}

impl<L> ClientEnd<L> {
    pub(super) fn new(link: L) -> ClientEnd<L> {
        ClientEnd {
            link,
            sent: 0,
            received: 0,
        }
    }
}

/// What one slice measured.
#[derive(Default)]
pub(super) struct Slice {
    pub(super) client_cpu: Duration,
    pub(super) server_cpu: Duration,
    pub(super) wall: Duration,
    pub(super) n: u64,
}

fn recv_poll<L: ClientLink>(c: &mut ClientEnd<L>) -> Result<()> {
    loop {
        if let Some(tag) = c.link.poll()? {
            return check(c, tag);
        }
        std::hint::spin_loop();
    }
}

fn check<L>(c: &mut ClientEnd<L>, tag: u64) -> Result<()> {
    if tag != c.received {
        return Err(Fail::new(
            libc::EPROTO,
            format!("reply tag {} where {} was expected", tag, c.received),
        ));
    }
    c.received += 1;
    Ok(())
}

fn send<L: ClientLink>(c: &mut ClientEnd<L>, payload: &[u8]) -> Result<()> {
    c.link.send(c.sent, payload)?;
    c.sent += 1;
    Ok(())
}

/// Where the client threads wait for each other between their warm-ups
/// and their measured round trips, so that every one measures under the
/// whole load. A thread that failed lets the others through.
struct StartLine {
    arrived: AtomicUsize,
    failed: AtomicBool,
    threads: usize,
}

impl StartLine {
    fn wait(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        // The client threads busy-poll anyway, each on its own CPU.
        while self.arrived.load(Ordering::SeqCst) < self.threads
            && !self.failed.load(Ordering::Relaxed)
        {
            std::hint::spin_loop();
        }
    }
}

/// Run the client side of one slice on the client CPUs `cpus`, one thread
/// each (the calling thread, already pinned to the first, is the first):
/// connection j is driven by thread j mod M, `n` round trips are shared
/// out, each thread warms its connections up with `warmup` of its own.
/// Returns the slice (wall time: the longest thread's; CPU: all of theirs)
/// and the client ends, whose drop closes the connections.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive_all<L: ClientLink>(
    load: Load,
    clients: Vec<ClientEnd<L>>,
    cpus: &[u32],
    servers: &Servers,
    payload: &[u8],
    warmup: u64,
    n: u64,
    sample: &mut Sample,
) -> Result<(Slice, Vec<ClientEnd<L>>)> {
    let m = cpus.len().min(clients.len()).max(1);
    if m == 1 {
        let mut clients = clients;
        let s = drive(
            load,
            &mut clients,
            servers,
            payload,
            warmup,
            n,
            sample,
            None,
        )?;
        return Ok((s, clients));
    }
    let mut parts: Vec<Vec<ClientEnd<L>>> = (0..m).map(|_| Vec::new()).collect();
    for (j, c) in clients.into_iter().enumerate() {
        parts[j % m].push(c);
    }
    let line = StartLine {
        arrived: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        threads: m,
    };
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(c, mut part)| {
                let (line, cpu) = (&line, cpus[c]);
                let share = n / m as u64 + u64::from((c as u64) < n % m as u64);
                scope.spawn(move || {
                    let mut own = Sample::new();
                    let r = fastwake::cpu::pin(cpu).and_then(|_| {
                        drive(
                            load,
                            &mut part,
                            servers,
                            payload,
                            warmup,
                            share,
                            &mut own,
                            Some(line),
                        )
                    });
                    if r.is_err() {
                        line.failed.store(true, Ordering::Relaxed);
                    }
                    (r, own, part)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut out = Slice::default();
    let mut back = Vec::new();
    let mut first_err = None;
    for r in results {
        let (r, own, part) = r.map_err(|_| Fail::new(libc::EIO, "client thread panicked"))?;
        back.extend(part);
        match r {
            Ok(s) => {
                sample.merge(&own);
                out.client_cpu += s.client_cpu;
                // The last thread to finish saw the servers' CPU over the
                // whole measured stretch.
                out.server_cpu = out.server_cpu.max(s.server_cpu);
                out.wall = out.wall.max(s.wall);
                out.n += s.n;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok((out, back)),
    }
}

/// Run one client thread's side of one slice: `warmup` then `n` measured
/// round trips; with `line`, meet the other client threads there between
/// the two.
#[allow(clippy::too_many_arguments)]
fn drive<L: ClientLink>(
    load: Load,
    clients: &mut [ClientEnd<L>],
    servers: &Servers,
    payload: &[u8],
    warmup: u64,
    n: u64,
    sample: &mut Sample,
    line: Option<&StartLine>,
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
            if let Some(l) = line {
                l.wait();
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
            let mark = |start: &mut Option<_>| {
                if let Some(l) = line {
                    l.wait();
                }
                *start = Some((
                    fastwake::cpu::thread_cpu_time(),
                    servers.cpu_time(),
                    Instant::now(),
                ));
            };
            if warmup == 0 {
                mark(&mut start);
            }
            while done < total {
                for (i, c) in clients.iter_mut().enumerate() {
                    let Some(tag) = c.link.poll()? else { continue };
                    check(c, tag)?;
                    done += 1;
                    if done == warmup {
                        mark(&mut start);
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
