//! Lanes over RDMA against a real device (Soft-RoCE in the rxe-test
//! guest): every message arrives whole, once and in order on its lane;
//! bulk goes in chunks, chains share doorbells. Without libibverbs or a
//! device each test prints `SKIPPED <name>: <why>` and returns.
//!
//! `FASTWAKE_TEST_VERBS_DEV` picks the device (default: the first one).

use fastwake::WaitMode;
use fastwake::lanes::rdma::{RdmaEndpoint, pair};
use fastwake::lanes::{Batch, Class, Config};
use fastwake::source::verbs::Device;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

mod common;

fn device(test: &str) -> Option<Arc<Device>> {
    common::verbs_device(test)
}

fn message(seq: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| (i as u64 ^ seq.wrapping_mul(131)) as u8)
        .collect();
    let n = len.min(8);
    m[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    m
}

fn run(test: &str, batch: Option<Batch>, n: u64, seed: u64) {
    let Some(dev) = device(test) else { return };
    let config = Config {
        latency_mode: WaitMode::Interrupt,
        bulk_mode: WaitMode::Interrupt,
        batch,
        ..Config::default()
    };
    let (a, b): (RdmaEndpoint, RdmaEndpoint) = pair(&dev, config).expect("connected pair");
    let (a, b) = (Arc::new(a), Arc::new(b));
    // The whole plan first, so the receivers know what to expect.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let plan: Vec<(Class, usize)> = (0..n)
        .map(|_| {
            let len = match rng.random_range(0..4) {
                0 => rng.random_range(8..64),
                1 => rng.random_range(1000..16_384),
                2 => rng.random_range(16_385..100_000),
                _ => rng.random_range(100_000..400_000),
            };
            let class = if rng.random_range(0..10) == 0 || len <= config.threshold {
                Class::Latency
            } else {
                Class::Bulk
            };
            (class, len)
        })
        .collect();
    let mut total = [0u64; 2];
    for &(c, _) in &plan {
        total[c as usize] += 1;
    }
    let mut receivers = Vec::new();
    for class in [Class::Latency, Class::Bulk] {
        let b = b.clone();
        let want = total[class as usize];
        receivers.push(std::thread::spawn(move || {
            for seq in 0..want {
                b.recv_with(class, |m| {
                    assert_eq!(m, &message(seq, m.len())[..], "{class:?} message {seq}");
                })
                .expect("recv");
            }
        }));
    }
    let mut next = [0u64; 2];
    for (class, len) in plan {
        let lane = class as usize;
        a.send_as(&message(next[lane], len), class).expect("send");
        next[lane] += 1;
    }
    for r in receivers {
        r.join().expect("receiver");
    }
    for class in [Class::Latency, Class::Bulk] {
        let s = a.stats(class);
        let r = b.stats(class);
        assert_eq!(
            r.received, total[class as usize],
            "{class:?}: messages received"
        );
        println!(
            "INFO {test} {}: {} messages, {} chunks, {} doorbells ({} batched), {} polite chunks; {} received whole",
            class.name(),
            s.messages,
            s.chunks,
            s.doorbells,
            s.batched_doorbells,
            s.polite,
            r.received
        );
        if class == Class::Bulk && s.messages > 0 {
            assert!(
                s.chunks > s.messages,
                "bulk messages were not chunked: {s:?}"
            );
            if batch.is_some() {
                assert!(s.batched_doorbells > 0 && s.doorbells < s.chunks, "{s:?}");
            } else {
                assert_eq!((s.doorbells, s.batched_doorbells), (s.chunks, 0), "{s:?}");
            }
        }
    }
}

#[test]
fn lanes_rdma_every_message_whole_and_in_order_batched() {
    run("lanes_rdma_batched", Some(Batch::I10), 200, 5);
}

#[test]
fn lanes_rdma_every_message_whole_and_in_order_one_doorbell_each() {
    run("lanes_rdma_unbatched", None, 120, 9);
}
