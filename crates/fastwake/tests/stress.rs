//! Randomised stress: at least 10^6 completions through every wait mode,
//! with random producer pauses (so the consumer really goes to sleep), random
//! batch sizes, random payload sizes and random re-placement of both threads
//! over the CPUs. Every completion is checked: none lost, none duplicated,
//! none reordered, payload intact.
//!
//! The seed is printed; set FW_STRESS_SEED to replay a run and
//! FW_STRESS_EVENTS to change the count per mode.

mod common;

use fastwake::source::channel::{self, Config, Doorbell};
use fastwake::{Source, WaitMode, Waiter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

fn events() -> u64 {
    std::env::var("FW_STRESS_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
}

fn run(mode: WaitMode, doorbell: Doorbell, seed: u64) {
    let n = events();
    let ncpu = fastwake::cpu::online();
    let (mut tx, mut rx) = channel::channel(Config {
        capacity: 64,
        slot_size: 24,
        doorbell,
    })
    .unwrap();
    let t0 = Instant::now();
    let prod = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut t = 0u64;
        while t < n {
            if rng.random_ratio(1, 20_000) {
                fastwake::cpu::pin(rng.random_range(0..ncpu)).unwrap();
            }
            // Pauses long enough for the consumer to arm and sleep.
            if rng.random_ratio(1, 500) {
                let d = Duration::from_micros(rng.random_range(1..200));
                if rng.random_bool(0.5) {
                    std::thread::sleep(d);
                } else {
                    let s = Instant::now();
                    while s.elapsed() < d {
                        std::hint::spin_loop();
                    }
                }
            }
            let batch = rng.random_range(1..=8u64).min(n - t);
            for _ in 0..batch {
                let len = (t % 25) as usize;
                let p = common::payload_for(t, len);
                while !tx.try_push(t, &p).unwrap() {
                    tx.flush();
                    std::thread::yield_now();
                }
                t += 1;
            }
            tx.flush();
        }
    });
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let mut w = Waiter::new(mode);
    for t in 0..n {
        if rng.random_ratio(1, 20_000) {
            fastwake::cpu::pin(rng.random_range(0..ncpu)).unwrap();
        }
        let m = match w.wait_timeout(&mut rx, Duration::from_secs(10)) {
            Ok(Some(m)) => m,
            Ok(None) => panic!("{mode}: completion {t} lost (10 s without it), seed {seed}"),
            Err(e) => panic!("{mode}: {e} at completion {t}, seed {seed}"),
        };
        assert_eq!(
            m.tag, t,
            "{mode}: lost, duplicated or reordered; seed {seed}"
        );
        assert_eq!(
            rx.payload(),
            &common::payload_for(t, (t % 25) as usize)[..],
            "{mode}: payload corrupted at {t}; seed {seed}"
        );
    }
    prod.join().unwrap();
    // Nothing extra may arrive: a duplicate would show here.
    assert!(
        rx.try_take().unwrap_err().is_closed(),
        "{mode}: extra completion after {n}"
    );
    fastwake::cpu::unpin().unwrap();
    let s = w.stats();
    eprintln!(
        "stress {mode} ({doorbell:?}): {n} completions in {:.2?}, 0 lost/duplicated/reordered; sleeps {} rechecks_hit {} spurious {} spin_skipped_same_cpu {} (seed {seed})",
        t0.elapsed(),
        s.sleeps,
        s.rechecks_hit,
        s.spurious,
        s.spin_skipped_same_cpu
    );
    assert_eq!(s.completions, n);
    if mode != WaitMode::Poll {
        assert!(s.sleeps > 0, "{mode}: the sleep path was never exercised");
    }
}

#[test]
fn stress_every_mode() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("stress");
    run(WaitMode::Poll, Doorbell::Futex, seed);
    run(WaitMode::Interrupt, Doorbell::Futex, seed);
    run(WaitMode::Interrupt, Doorbell::EventFd, seed);
    run(
        WaitMode::Hybrid {
            budget: Duration::from_micros(20),
        },
        Doorbell::Futex,
        seed,
    );
}
