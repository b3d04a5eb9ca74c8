//! A dispatch-mode thread that never has to sleep must not hold its core
//! while another thread of the core was handed its completion.
//!
//! Thread A's source is kept full by a feeder on the other CPU, so each of
//! A's waits finds a completion at once and A never sleeps; thread B, on
//! A's core, gets a message every 2 ms. The `SCHED_IDLE` dispatcher gets no
//! CPU beside A, and a woken thread does not preempt a running one of
//! equal weight before its slice ends, so without A's fair turns B's
//! messages wait for the watchdog (1 ms) and for A's slice (0.75-3 ms).
//! The bound below is well under either: a stall of one scheduler slice
//! fails the test.
//!
//! Spins on both CPUs for about a second: takes `SPIN`.

mod dispatch_common;

use dispatch_common::chan;
use dispatch_common::threads::{WAIT, spin_lock, two_cpus};
use fastwake::dispatch::{Config, Dispatcher};
use fastwake::{WaitMode, Waiter};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// B's messages.
const MESSAGES: u64 = 300;
/// Between two of B's messages.
const GAP: Duration = Duration::from_millis(2);
/// B's p90 delivery latency must stay under this: a third of the smallest
/// scheduler slice (0.75 ms), and of the watchdog's period (1 ms).
const BOUND: Duration = Duration::from_micros(250);

#[test]
fn a_thread_that_never_sleeps_gives_a_woken_one_its_core() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("a_thread_that_never_sleeps_gives_a_woken_one_its_core")
    else {
        return;
    };
    let d = Dispatcher::start(Config::new(wcpu)).expect("start dispatcher");
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (mut tx_a, mut rx_a) = chan();
    let (mut tx_b, mut rx_b) = chan();
    let a_taken = Arc::new(AtomicU64::new(0));

    // A: takes whatever it is fed until told to stop.
    let (stop_a, taken) = (stop.clone(), a_taken.clone());
    let a = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        let mut n = 0u64;
        while !stop_a.load(Ordering::Relaxed) {
            match w
                .wait_timeout(&mut rx_a, Duration::from_millis(50))
                .unwrap()
            {
                Some(m) => {
                    assert_eq!(m.tag, n, "A: lost or duplicated completion");
                    n += 1;
                    taken.store(n, Ordering::Relaxed);
                }
                None => continue,
            }
        }
        w.stats()
    });
    // B: each message carries its send time, in ns since `epoch`.
    let b = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        let mut lat = Vec::with_capacity(MESSAGES as usize);
        for expect in 0..MESSAGES {
            let m = w
                .wait_timeout(&mut rx_b, WAIT)
                .unwrap()
                .unwrap_or_else(|| panic!("B: message {expect} not delivered within {WAIT:?}"));
            let now = epoch.elapsed().as_nanos() as u64;
            assert_eq!(m.tag, expect, "B: lost or duplicated completion");
            let sent = u64::from_le_bytes(rx_b.payload()[..8].try_into().unwrap());
            lat.push(Duration::from_nanos(now.saturating_sub(sent)));
        }
        (lat, w.stats())
    });

    // Let both register and sleep once, then feed A without pause and
    // send B a message every GAP, from the other CPU.
    std::thread::sleep(Duration::from_millis(20));
    fastwake::cpu::pin(pcpu).unwrap();
    let mut fed = 0u64;
    let mut next_b = Instant::now();
    for i in 0..MESSAGES {
        while Instant::now() < next_b {
            if tx_a.try_send(fed, &[0u8; 8]).unwrap() {
                fed += 1;
            }
        }
        let sent = epoch.elapsed().as_nanos() as u64;
        tx_b.send(i, &sent.to_le_bytes()).unwrap();
        next_b += GAP;
    }
    let (mut lat, b_stats) = b.join().expect("B failed");
    stop.store(true, Ordering::Relaxed);
    let a_stats = a.join().expect("A failed");
    let ds = d.stop();
    lat.sort();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    eprintln!(
        "B's delivery latency p50 {:?} p90 {:?} p99 {:?} max {:?}; A took {} ({} without sleep, {} sleeps); \
         B: handoffs {} fallbacks {}; dispatcher: relayed {} fair_yields {} rescued {}",
        at(0.5),
        at(0.9),
        at(0.99),
        lat[lat.len() - 1],
        a_taken.load(Ordering::Relaxed),
        a_stats.without_sleep,
        a_stats.sleeps,
        b_stats.handoffs,
        b_stats.dispatch_fallbacks,
        ds.relayed,
        ds.fair_yields,
        ds.rescued,
    );
    assert!(
        a_stats.without_sleep > 10 * MESSAGES,
        "A was not kept busy (it must find its source ready at almost every wait): {a_stats:?}"
    );
    assert!(
        at(0.9) < BOUND,
        "B waited {:?} at p90 for the core while A ran (bound {BOUND:?}): a woken thread sat behind a busy one",
        at(0.9)
    );
}
