//! Helpers shared by the dispatch tests.

pub mod threads;

use fastwake::source::channel::{self, Config as ChanConfig, Receiver, Sender};
use rand::Rng;
use std::time::Duration;

/// A small channel: 16 slots of 8 bytes.
pub fn chan() -> (Sender, Receiver) {
    channel::channel(ChanConfig {
        capacity: 16,
        slot_size: 8,
        ..ChanConfig::default()
    })
    .unwrap()
}

/// Send tags 0..n to each sender, picking the sender at random each time
/// and pausing now and then, so waiters see every mix of "already there"
/// and "arrives while asleep".
#[allow(dead_code)]
pub fn produce_random(mut txs: Vec<Sender>, n: u64) {
    let mut rng = rand::rng();
    let mut sent = vec![0u64; txs.len()];
    let mut left: u64 = n * txs.len() as u64;
    while left > 0 {
        let i = rng.random_range(0..txs.len());
        if sent[i] == n {
            continue;
        }
        txs[i].send(sent[i], &[0u8; 8]).unwrap();
        sent[i] += 1;
        left -= 1;
        if rng.random_range(0..8) == 0 {
            std::thread::sleep(Duration::from_micros(rng.random_range(0..50)));
        }
    }
}
