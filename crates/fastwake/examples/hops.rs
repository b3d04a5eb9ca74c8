//! Where a round trip's time goes: the request hop (client's send → server
//! has the request) and the reply hop (server's send → client has the
//! reply), for one polled connection against N connections served by a
//! task runtime, with the requests landing on the first M of them.
//!
//! ```sh
//! cargo run --release --example hops -- [N] [M] [ROUND_TRIPS]
//! ```
//!
//! Each side stamps its send with the TSC (one `rdtsc`, a few ns; the
//! monotonic clock elsewhere) and the receiver subtracts: both CPUs read
//! the same invariant TSC. Prints medians in ns. Client on CPU 0, server
//! on CPU 1. Why it exists: `fastwake bench share --rotate` showed that
//! requests landing on 16 connections cost more than one connection, for
//! the task runtime and a hand-written loop alike; this splits that cost
//! by direction (docs/design/dispatcher.md).

use fastwake::dispatch::{Runtime, TaskConfig};
use fastwake::source::channel::{self, Config, Msg, Receiver, Sender};
use fastwake::{Fail, Source, WaitMode, Waiter};
use std::sync::mpsc;

/// A timestamp both CPUs agree on, in ticks, and ticks per ns.
#[cfg(target_arch = "x86_64")]
fn stamp() -> u64 {
    // SAFETY: rdtsc has no preconditions; it only reads a counter.
    unsafe { std::arch::x86_64::_rdtsc() }
}
#[cfg(not(target_arch = "x86_64"))]
fn stamp() -> u64 {
    fastwake::cpu::monotonic_ns()
}

/// Ticks per ns of [`stamp`], measured over 50 ms.
fn ticks_per_ns() -> f64 {
    let (t0, c0) = (std::time::Instant::now(), stamp());
    std::thread::sleep(std::time::Duration::from_millis(50));
    (stamp() - c0) as f64 / t0.elapsed().as_nanos() as f64
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Answer each request on `rx` with a stamped reply on `tx`, noting its
/// request hop, until the client closes; then hand the hops to `out`.
fn serve(
    rx: &mut Receiver,
    tx: &mut Sender,
    out: &mpsc::Sender<Vec<u64>>,
    mut wait: impl FnMut(&mut Receiver) -> fastwake::Result<Msg>,
) -> fastwake::Result<()> {
    let mut hops = Vec::new();
    while let Ok(m) = wait(rx) {
        hops.push(stamp().wrapping_sub(m.tag));
        tx.send(stamp(), b"reply")?;
    }
    let _ = out.send(hops);
    Ok(())
}

/// Medians (request hop, reply hop, round trip) in ticks, for `conns`
/// connections (`None`: the single polled one) with requests on `active`.
fn measure(conns: Option<usize>, active: usize, n: usize) -> fastwake::Result<(u64, u64, u64)> {
    let cfg = Config {
        capacity: 8,
        slot_size: 8,
        ..Config::default()
    };
    let mut client = Vec::new();
    let mut server = Vec::new();
    for _ in 0..conns.unwrap_or(1) {
        let (req_tx, req_rx) = channel::channel(cfg)?;
        let (resp_tx, resp_rx) = channel::channel(cfg)?;
        client.push((req_tx, resp_rx));
        server.push((req_rx, resp_tx));
    }
    let (hops_tx, hops_rx) = mpsc::channel::<Vec<u64>>();
    let srv = std::thread::spawn(move || -> fastwake::Result<()> {
        fastwake::cpu::pin(1)?;
        if conns.is_some() {
            let mut rt = Runtime::new(TaskConfig::default())?;
            for (mut rx, mut tx) in server {
                let hops_tx = hops_tx.clone();
                rt.spawn(move |cx| serve(&mut rx, &mut tx, &hops_tx, |rx| cx.wait(rx)))?;
            }
            rt.run()?;
            Ok(())
        } else {
            let (mut rx, mut tx) = server.pop().expect("one connection");
            let mut w = Waiter::new(WaitMode::Poll);
            serve(&mut rx, &mut tx, &hops_tx, |rx| w.wait(rx))
        }
    });
    fastwake::cpu::pin(0)?;
    let active = active.clamp(1, client.len());
    let (mut reply, mut rtt) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (tx, rx) = &mut client[i % active];
        let t0 = stamp();
        tx.send(t0, b"request")?;
        let m = loop {
            if rx.ready()
                && let Some(m) = rx.try_take()?
            {
                break m;
            }
            std::hint::spin_loop();
        };
        let t1 = stamp();
        reply.push(t1.wrapping_sub(m.tag));
        rtt.push(t1 - t0);
    }
    drop(client);
    srv.join()
        .map_err(|_| Fail::invalid("server thread panicked"))??;
    let request: Vec<u64> = hops_rx.try_iter().flatten().collect();
    Ok((median(request), median(reply), median(rtt)))
}

fn run() -> fastwake::Result<()> {
    let mut args = std::env::args().skip(1);
    let conns: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let active: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(conns);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    if fastwake::cpu::online() < 2 {
        return Err(Fail::invalid("needs two CPUs"));
    }
    let per_ns = ticks_per_ns();
    let ns = |t: u64| t as f64 / per_ns;
    // Alternate the two, three times: this VM's speed drifts by the minute.
    for _ in 0..3 {
        for (label, c) in [("1 polled connection", None), ("tasks", Some(conns))] {
            let (q, r, t) = measure(c, active, n)?;
            let what = match c {
                None => label.to_string(),
                Some(c) => format!("{label}, {active} of {c} connections"),
            };
            println!(
                "{what:<34} request hop {:6.1} ns  reply hop {:6.1} ns  round trip {:6.1} ns (medians)",
                ns(q),
                ns(r),
                ns(t)
            );
        }
    }
    Ok(())
}

/// A bad argument or a failure is one line on stderr and exit status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("hops: {e}");
        std::process::exit(1);
    }
}
