//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

/// Tests that spin (poll and hybrid modes) take this lock so that no two of
/// them fight over the machine's two CPUs at once; cargo runs the tests of
/// one binary in parallel threads.
pub fn spin_lock() -> MutexGuard<'static, ()> {
    static SPIN: Mutex<()> = Mutex::new(());
    SPIN.lock().unwrap_or_else(|p| p.into_inner())
}

/// CPUs to pin test threads to: 0 and 1 when the host has two.
pub fn two_cpus() -> (u32, u32) {
    let n = fastwake::cpu::online();
    (0, if n > 1 { 1 } else { 0 })
}

/// A payload derived from the tag, so corruption is detected, not only
/// loss or reordering.
pub fn payload_for(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as u8).wrapping_add(i as u8) ^ 0xa5)
        .collect()
}

/// The stress tests' seed: FW_STRESS_SEED to replay a run, else the clock.
/// Printed (on stderr, after `what`), so a failing run can be replayed.
pub fn stress_seed(what: &str) -> u64 {
    let seed = std::env::var("FW_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let sep = if what.is_empty() { "" } else { " " };
    eprintln!("{what}{sep}seed {seed} (FW_STRESS_SEED to replay)");
    seed
}

/// A producer for the dispatch stress tests: values `0..per` for each of
/// `sources` sources, in order per source, sources in random order, in
/// random bursts (one, a few, or across the open sources) with pauses of
/// every length between them: now and then past the dispatchers' 2 ms
/// idle threshold (threads go back to interrupt mode, task runtimes nap),
/// `naps` in 256 a short sleep, 32 in 256 a short spin. `push(k, v)`
/// offers value `v` to source `k`; false means full (its owner is
/// behind): the value is offered again later. Panics after 60 s (a stuck
/// producer), naming the seed.
pub fn produce_bursts(
    sources: usize,
    per: u64,
    naps: u32,
    seed: u64,
    mut push: impl FnMut(usize, u64) -> bool,
) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::time::{Duration, Instant};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next = vec![0u64; sources];
    let mut open: Vec<usize> = (0..sources).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !open.is_empty() {
        assert!(Instant::now() < deadline, "producer stuck (seed {seed})");
        let burst = match rng.random_range(0..3) {
            0 => 1,
            1 => rng.random_range(1..=4),
            _ => rng.random_range(1..=open.len()),
        };
        for _ in 0..burst.min(open.len()) {
            let j = rng.random_range(0..open.len());
            let k = open[j];
            if !push(k, next[k]) {
                std::thread::yield_now();
                continue;
            }
            next[k] += 1;
            if next[k] == per {
                open.swap_remove(j);
            }
        }
        let pause = rng.random_range(0..256u32);
        if pause == 0 {
            std::thread::sleep(Duration::from_millis(3));
        } else if pause <= naps {
            std::thread::sleep(Duration::from_micros(rng.random_range(1..400)));
        } else if pause <= naps + 32 {
            let until = Instant::now() + Duration::from_micros(rng.random_range(1..20));
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    }
}

/// The RDMA device the verbs tests use (`FASTWAKE_TEST_VERBS_DEV`, default
/// the first), or `None` after printing `SKIPPED <test>: <why>` (no
/// libibverbs, no device): those tests run in the Soft-RoCE guest.
pub fn verbs_device(test: &str) -> Option<std::sync::Arc<fastwake::source::verbs::Device>> {
    let want = std::env::var("FASTWAKE_TEST_VERBS_DEV").ok();
    match fastwake::source::verbs::Device::open(want.as_deref(), None) {
        Ok(d) => Some(std::sync::Arc::new(d)),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}
