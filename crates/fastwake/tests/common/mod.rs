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
pub fn stress_seed() -> u64 {
    std::env::var("FW_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}
