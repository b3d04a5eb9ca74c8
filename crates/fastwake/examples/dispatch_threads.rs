//! Ordinary kernel threads handed their completions by the core's
//! dispatcher (the path unmodified programs take): each server thread waits
//! in `dispatch` mode, i.e. registers its channel with the dispatcher that
//! serves its CPU and sleeps on a futex; the dispatcher (`SCHED_IDLE`, same
//! core) peeks all of them and wakes the owner of a ready one.
//!
//! ```sh
//! cargo run --release --example dispatch_threads -- [THREADS] [REQUESTS]
//! ```
//!
//! Server threads and the dispatcher run on CPU 1, the client on CPU 0
//! (when there are two). Compare with `interrupt` waits by running
//! `fastwake bench share --mode threads,interrupt`.

mod common;

use fastwake::dispatch::{Config, Dispatcher};
use fastwake::source::channel::{self, Config as ChannelConfig};
use fastwake::{Fail, WaitMode, Waiter};

fn run() -> fastwake::Result<()> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(8);
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    if threads == 0 {
        return Err(Fail::invalid("at least one thread"));
    }
    let cpus = fastwake::cpu::online();
    let (client_cpu, server_cpu) = if cpus >= 2 { (0, 1) } else { (0, 0) };
    let dispatcher = Dispatcher::start(Config::new(server_cpu))?;

    let mut client = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..threads {
        let (req_tx, mut req_rx) = channel::channel(ChannelConfig::default())?;
        let (mut resp_tx, resp_rx) = channel::channel(ChannelConfig::default())?;
        client.push((req_tx, resp_rx));
        servers.push(std::thread::spawn(move || -> fastwake::Result<_> {
            fastwake::cpu::pin(server_cpu)?;
            let mut w = Waiter::new(WaitMode::Dispatch);
            while let Ok(m) = w.wait(&mut req_rx) {
                resp_tx.send(m.tag, req_rx.payload())?;
            }
            Ok(w.stats())
        }));
    }

    fastwake::cpu::pin(client_cpu)?;
    let rtt = common::round_robin(&mut client, n)?;
    drop(client);
    let (mut handoffs, mut relays, mut fallbacks) = (0, 0, 0);
    for s in servers {
        let st = s.join().map_err(|_| Fail::invalid("server panicked"))??;
        handoffs += st.handoffs;
        relays += st.relays;
        fallbacks += st.dispatch_fallbacks;
    }
    println!(
        "{threads} threads on CPU {server_cpu}: {n} requests, one-way p50 {:.3} us; waits: {handoffs} handed off ({relays} by relay), {fallbacks} fell back to interrupt mode; dispatcher: {:?}",
        common::one_way_p50_us(&rtt),
        dispatcher.stats().state
    );
    Ok(())
}

/// A bad argument or a failure is one line on stderr and exit status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("dispatch_threads: {e}");
        std::process::exit(1);
    }
}
