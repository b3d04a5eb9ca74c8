//! The client side: one busy-polling thread driving every connection in
//! the `latency` or the `throughput` load.

use super::conn::ClientLink;
use super::mode::Load;
use super::servers::Servers;
use crate::bench::stats::Sample;
use fastwake::{Fail, Result};
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

/// Run the client side of one slice: `warmup` then `n` measured round trips.
pub(super) fn drive<L: ClientLink>(
    load: Load,
    clients: &mut [ClientEnd<L>],
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
                    let Some(tag) = c.link.poll()? else { continue };
                    check(c, tag)?;
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
