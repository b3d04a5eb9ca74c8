//! The smallest complete use of fastwake (the `rc_pingpong` of this
//! project): two threads ping-pong over a pair of shared-memory channels,
//! both ends waiting in the mode given.
//!
//! ```sh
//! cargo run --release --example pingpong -- [MODE] [ROUND_TRIPS]
//! ```
//!
//! MODE is any wait mode: `poll`, `interrupt`, `hybrid`, `hybrid:5us`,
//! `adaptive`, `adaptive:cap=20%`, … (default `hybrid`). Prints the one-way
//! latency (RTT/2) and how often each end had to sleep. The ends run on CPUs
//! 0 and 1 when there are two.

use fastwake::source::channel::{self, Config};
use fastwake::{Fail, WaitMode, Waiter};
use std::time::Instant;

fn run() -> fastwake::Result<()> {
    let mut args = std::env::args().skip(1);
    let mode: WaitMode = args.next().as_deref().unwrap_or("hybrid").parse()?;
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let (mut ping_tx, mut ping_rx) = channel::channel(Config::default())?;
    let (mut pong_tx, mut pong_rx) = channel::channel(Config::default())?;
    let two = fastwake::cpu::online() >= 2;

    // The pong end: echo every ping, payload and tag.
    let pong = std::thread::spawn(move || -> fastwake::Result<u64> {
        if two {
            fastwake::cpu::pin(1)?;
        }
        let mut w = Waiter::new(mode);
        for _ in 0..n {
            let m = w.wait(&mut ping_rx)?;
            pong_tx.send(m.tag, ping_rx.payload())?;
        }
        Ok(w.stats().sleeps)
    });

    if two {
        fastwake::cpu::pin(0)?;
    }
    let mut w = Waiter::new(mode);
    let mut rtt = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t0 = Instant::now();
        ping_tx.send(i, b"ping")?;
        let m = w.wait(&mut pong_rx)?;
        rtt.push(t0.elapsed());
        if m.tag != i || pong_rx.payload() != b"ping" {
            return Err(Fail::invalid(format!("round trip {i}: wrong reply")));
        }
    }
    let pong_sleeps = pong
        .join()
        .map_err(|_| Fail::invalid("pong thread panicked"))??;
    rtt.sort_unstable();
    let one_way = |q: f64| rtt[((rtt.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6 / 2.0;
    println!(
        "{mode}: {n} round trips, one-way p50 {:.3} us, p99 {:.3} us; sleeps: ping {}, pong {}",
        one_way(0.5),
        one_way(0.99),
        w.stats().sleeps,
        pong_sleeps
    );
    Ok(())
}

/// A bad argument or a failure is one line on stderr and exit status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}
