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

/// Reader `id`'s `seq`-th request (and its reply) carry this tag.
fn tag(id: u64, seq: u64) -> u64 {
    id << 32 | seq
}

/// The tag of a request or reply of `len` bytes, the whole message checked.
fn checked_tag(m: &[u8], len: usize) -> u64 {
    let t = u64::from_le_bytes(m[..8].try_into().unwrap());
    assert_eq!(m, &message(t, len)[..], "message {t:#x}");
    t
}

/// The bench's experiment over RDMA, for counters (timings under a TCG
/// guest are not performance figures): synchronous readers (one 16-byte
/// request outstanding each, a 4 KiB reply) on the latency lane beside a
/// writer streaming 1 MiB messages on the bulk lane. Every reply and bulk
/// message is checked; the writer's chunks turn polite while reads are in
/// flight, and its chains share doorbells.
#[test]
fn lanes_rdma_readers_beside_a_streaming_writer() {
    const READERS: u64 = 4;
    const READS: u64 = 150;
    const BULK: usize = 1 << 20;
    let test = "lanes_rdma_readers";
    let Some(dev) = device(test) else { return };
    let config = Config {
        latency_mode: WaitMode::Interrupt,
        bulk_mode: WaitMode::Interrupt,
        batch: Some(Batch::I10),
        ..Config::default()
    };
    let (client, server) = pair(&dev, config).expect("connected pair");
    let (client, server) = (Arc::new(client), Arc::new(server));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The server: answers each request with a reply naming its reader and
    // sequence number.
    let answers = {
        let server = server.clone();
        std::thread::spawn(move || {
            for _ in 0..READERS * READS {
                let tag = server
                    .recv_with(Class::Latency, |m| checked_tag(m, 16))
                    .expect("request");
                server
                    .send_as(&message(tag, 4096), Class::Latency)
                    .expect("reply");
            }
        })
    };
    // Its bulk side: every message whole, in order, until the writer's
    // short last message.
    let sink = {
        let server = server.clone();
        std::thread::spawn(move || {
            let mut seq = 0u64;
            loop {
                let whole = server
                    .recv_with(Class::Bulk, |m| {
                        if m.len() != BULK {
                            assert_eq!(m, b"end", "bulk message {seq}");
                            return false;
                        }
                        assert_eq!(m, &message(seq, BULK)[..], "bulk message {seq}");
                        true
                    })
                    .expect("bulk");
                if !whole {
                    return seq;
                }
                seq += 1;
            }
        })
    };
    // Replies come back on one lane in any order: one thread takes them
    // (this is a test, not the bench's reader-led hand-over) and hands
    // each to its reader.
    let mut to_reader = Vec::new();
    let mut readers = Vec::new();
    for id in 0..READERS {
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        to_reader.push(tx);
        let client = client.clone();
        readers.push(std::thread::spawn(move || {
            for seq in 0..READS {
                client
                    .send_as(&message(tag(id, seq), 16), Class::Latency)
                    .expect("request");
                assert_eq!(
                    rx.recv().expect("reply"),
                    seq,
                    "reader {id}'s replies in order"
                );
            }
        }));
    }
    let replies = {
        let client = client.clone();
        std::thread::spawn(move || {
            for _ in 0..READERS * READS {
                let t = client
                    .recv_with(Class::Latency, |m| checked_tag(m, 4096))
                    .expect("reply");
                let (id, seq) = (t >> 32, t & 0xffff_ffff);
                to_reader[id as usize].send(seq).expect("reader alive");
            }
        })
    };
    let writer = {
        let client = client.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) || seq == 0 {
                client
                    .send_as(&message(seq, BULK), Class::Bulk)
                    .expect("bulk send");
                seq += 1;
            }
            client.send_as(b"end", Class::Bulk).expect("last bulk send");
            seq
        })
    };
    for r in readers {
        r.join().expect("reader");
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    replies.join().expect("replies");
    answers.join().expect("server");
    let sent = writer.join().expect("writer");
    let got = sink.join().expect("bulk sink");
    assert_eq!(got, sent, "bulk messages received");
    let lat = client.stats(Class::Latency);
    let bulk = client.stats(Class::Bulk);
    println!(
        "INFO {test} latency: {} requests, {} replies received whole ({READERS} readers)",
        lat.messages,
        client.stats(Class::Latency).received
    );
    println!(
        "INFO {test} bulk: {} messages of 1 MiB, {} chunks ({} polite), {} doorbells ({} batched); {} received whole",
        bulk.messages,
        bulk.chunks,
        bulk.polite,
        bulk.doorbells,
        bulk.batched_doorbells,
        server.stats(Class::Bulk).received
    );
    assert_eq!(lat.messages, READERS * READS);
    assert!(
        bulk.chunks >= bulk.messages * 16,
        "1 MiB in chunks of at most 64 KiB: {bulk:?}"
    );
    assert!(
        bulk.polite > 0,
        "no polite chunk while reads were in flight: {bulk:?}"
    );
    assert!(
        bulk.batched_doorbells > 0 && bulk.doorbells < bulk.chunks,
        "{bulk:?}"
    );
}
