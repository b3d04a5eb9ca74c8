//! Many connections sharing one core, served by stackful tasks and the
//! core's dispatcher (FastWake approach 1): the runtime peeks every
//! connection's channel and switches straight into the task whose request
//! is ready; the task answers and switches back when it waits again.
//!
//! ```sh
//! cargo run --release --example tasks_echo -- [CONNECTIONS] [REQUESTS]
//! ```
//!
//! The runtime runs on CPU 1, the client on CPU 0 (when there are two). The
//! client sends one request at a time, round-robin over the connections,
//! and busy-polls for the reply; the figure is the one-way latency of a
//! hand-off including the scan of all connections.

mod common;

use fastwake::Fail;
use fastwake::dispatch::{Runtime, TaskConfig};
use fastwake::source::channel::{self, Config};

fn run() -> fastwake::Result<()> {
    let mut args = std::env::args().skip(1);
    let conns: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    if conns == 0 {
        return Err(Fail::invalid("at least one connection"));
    }
    let two = fastwake::cpu::online() >= 2;
    let mut client = Vec::new();
    let mut server = Vec::new();
    for _ in 0..conns {
        let (req_tx, req_rx) = channel::channel(Config::default())?;
        let (resp_tx, resp_rx) = channel::channel(Config::default())?;
        client.push((req_tx, resp_rx));
        server.push((req_rx, resp_tx));
    }

    let rt = std::thread::spawn(move || -> fastwake::Result<_> {
        if two {
            fastwake::cpu::pin(1)?;
        }
        let mut rt = Runtime::new(TaskConfig::default())?;
        for (mut rx, mut tx) in server {
            rt.spawn(move |cx| {
                // The same call shape as a thread's `Waiter::wait`; a
                // closed client ends the task.
                while let Ok(m) = cx.wait(&mut rx) {
                    tx.send(m.tag, rx.payload())?;
                }
                Ok(())
            })?;
        }
        rt.run()
    });

    if two {
        fastwake::cpu::pin(0)?;
    }
    let rtt = common::round_robin(&mut client, n)?;
    drop(client);
    let stats = rt
        .join()
        .map_err(|_| Fail::invalid("runtime thread panicked"))??;
    println!(
        "{conns} connections on one core: {n} requests, one-way p50 {:.3} us; runtime: {} hand-offs, {:.1} passes per hand-off",
        common::one_way_p50_us(&rtt),
        stats.handoffs,
        stats.passes as f64 / stats.handoffs.max(1) as f64
    );
    Ok(())
}

/// A bad argument or a failure is one line on stderr and exit status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("tasks_echo: {e}");
        std::process::exit(1);
    }
}
