//! A dispatch-mode thread that never has to sleep must not hold its core
//! while another thread of the core was handed its completion.
//!
//! Thread B gets a message every 2 ms from the other CPU. Beside it on its
//! core, thread A's source is kept full from the other CPU for 10 ms, then
//! left empty for 10 ms, and so on: while it is full, each of A's waits
//! finds a completion at once and A never sleeps. The `SCHED_IDLE`
//! dispatcher gets no CPU beside A, and a woken thread does not preempt a
//! running one of equal weight before its slice ends, so without A's fair
//! turns B's messages wait for the watchdog (1 ms) and for A's slice
//! (0.75-3 ms). The bound on B's p90 while A is busy is well under either
//! (plus twice B's p90 while A sleeps: the noise of the moment): a stall
//! of one scheduler slice fails the test.
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
const MESSAGES: u64 = 400;
/// Messages per block (A fed, A asleep, alternating).
const BLOCK: u64 = 5;
/// Between two of B's messages.
const GAP: Duration = Duration::from_millis(2);
/// B's p90 delivery latency beside a busy A must stay under this (plus
/// twice its p90 beside a sleeping A, this run's noise): a third of the
/// smallest scheduler slice (0.75 ms), and a quarter of the watchdog's
/// period (1 ms).
const BOUND: Duration = Duration::from_micros(250);

#[test]
fn a_thread_that_never_sleeps_gives_a_woken_one_its_core() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("a_thread_that_never_sleeps_gives_a_woken_one_its_core")
    else {
        return;
    };
    // Another process on the core (a build beside the tests) delays B in
    // both blocks alike only on average: up to three runs, each printed,
    // one of which must be within the bound. The old code failed every
    // run (its p90 was the watchdog's period and a slice, 1.6 ms).
    let mut last = String::new();
    for attempt in 1..=3 {
        match run(wcpu, pcpu) {
            Ok(()) => return,
            Err(e) => {
                eprintln!("run {attempt}: {e}");
                last = e;
            }
        }
    }
    panic!("{last}");
}

/// One run of the scenario; `Err` says how B's latency broke the bound.
fn run(wcpu: u32, pcpu: u32) -> Result<(), String> {
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
            lat.push((
                Duration::from_nanos(now.saturating_sub(sent)),
                sent & 1 == 1,
            ));
        }
        (lat, w.stats())
    });

    // Let both register and sleep once, then, from the other CPU, send B
    // a message every GAP, in blocks that alternate between feeding A
    // without pause and leaving it asleep: B's latency beside a sleeping A
    // is what this machine's noise costs it now (other processes on the
    // core, say), measured alongside.
    std::thread::sleep(Duration::from_millis(20));
    fastwake::cpu::pin(pcpu).unwrap();
    let mut fed = 0u64;
    let mut next_b = Instant::now();
    for i in 0..MESSAGES {
        let feeding = (i / BLOCK) % 2 == 1;
        while Instant::now() < next_b {
            if feeding && tx_a.try_send(fed, &[0u8; 8]).unwrap() {
                fed += 1;
            }
        }
        // The low bit says which block the message was sent in.
        let sent = (epoch.elapsed().as_nanos() as u64 & !1) | feeding as u64;
        tx_b.send(i, &sent.to_le_bytes()).unwrap();
        next_b += GAP;
    }
    let (lat, b_stats) = b.join().expect("B failed");
    stop.store(true, Ordering::Relaxed);
    let a_stats = a.join().expect("A failed");
    let ds = d.stop();
    let p = |busy: bool, q: f64| {
        let mut v: Vec<Duration> = lat.iter().filter(|l| l.1 == busy).map(|l| l.0).collect();
        v.sort();
        v[((v.len() - 1) as f64 * q) as usize]
    };
    let (busy90, idle90) = (p(true, 0.9), p(false, 0.9));
    eprintln!(
        "B's delivery latency beside a busy A: p50 {:?} p90 {busy90:?} p99 {:?}; beside a sleeping A: p50 {:?} p90 {idle90:?}; \
         A took {} ({} without sleep, {} sleeps); B: handoffs {} fallbacks {}; dispatcher: relayed {} fair_yields {} rescued {}",
        p(true, 0.5),
        p(true, 0.99),
        p(false, 0.5),
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
    let bound = BOUND + 2 * idle90;
    if busy90 < bound {
        return Ok(());
    }
    Err(format!(
        "B waited {busy90:?} at p90 for the core while A ran (bound {bound:?}: {BOUND:?} + twice B's p90 beside a sleeping A): a woken thread sat behind a busy one"
    ))
}
