//! The client side: one busy-polling thread driving every connection in
//! the `latency` or the `throughput` load.

use super::mode::Load;
use super::servers::Servers;
use crate::bench::stats::Sample;
use fastwake::source::Source;
use fastwake::source::channel::{self, Receiver, Sender};
use fastwake::{Fail, Result};
use std::time::{Duration, Instant};

/// The client's end of one connection.
pub(super) struct ClientEnd {
    pub(super) tx: Sender,
    pub(super) rx: Receiver,
    pub(super) sent: u64,
    pub(super) received: u64,
}

/// What one slice measured.
#[derive(Default)]
pub(super) struct Slice {
    pub(super) client_cpu: Duration,
    pub(super) server_cpu: Duration,
    pub(super) wall: Duration,
    pub(super) n: u64,
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
pub(super) fn drive(
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
