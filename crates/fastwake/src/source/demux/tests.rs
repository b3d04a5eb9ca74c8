//! The demultiplexer on its in-memory queue: routing, order, kept
//! completions, the pump lock under contention, interrupt-mode sleepers
//! sharing one event fd.

use super::*;
use crate::source::{BlockReport, Source, block_until_ready};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

fn demux() -> Demux<MemQueue<u64>> {
    Demux::new(MemQueue::new().unwrap())
}

#[test]
fn routes_by_key_in_order_and_keeps_unknown_keys() {
    let d = demux();
    let mut a = d.inbox(1).unwrap();
    let mut b = d.inbox(2).unwrap();
    assert!(d.inbox(1).is_err(), "a key has one inbox");
    for i in 0..40 {
        d.queue().push(1 + i % 3, i);
    }
    // Key 3 has no inbox yet: kept, counted, not dropped.
    let take = |s: &mut Inbox<MemQueue<u64>>| {
        std::iter::from_fn(|| s.try_take().unwrap().map(|(_, v)| v)).collect::<Vec<_>>()
    };
    assert_eq!(
        take(&mut a),
        (0..40).filter(|i| i % 3 == 0).collect::<Vec<_>>()
    );
    assert_eq!(
        take(&mut b),
        (0..40).filter(|i| i % 3 == 1).collect::<Vec<_>>()
    );
    let st = d.stats();
    assert_eq!((st.routed, st.unrouted), (27, 13), "{st:?}");
    // An inbox registered later gets what was kept for it, first.
    d.queue().push(3, 100);
    let mut c = d.inbox(3).unwrap();
    let mut want: Vec<u64> = (0..40).filter(|i| i % 3 == 2).collect();
    want.push(100);
    assert_eq!(take(&mut c), want);
    // A dropped inbox's key is unknown again, and what it held untaken
    // is kept, first.
    d.queue().push(1, 5);
    d.queue().push(1, 6);
    d.pump();
    assert_eq!(a.try_take().unwrap(), Some((1, 5)));
    drop(a);
    d.queue().push(1, 7);
    d.pump();
    d.queue().push(1, 8);
    d.pump();
    // At most so many, oldest first; the rest stay kept.
    assert_eq!(d.take_unrouted_at_most(2), vec![(1, 6), (1, 7)]);
    assert_eq!(d.take_unrouted(), vec![(1, 8)]);
    assert!(d.take_unrouted().is_empty());
    assert!(d.take_unrouted_at_most(3).is_empty());
    assert_eq!(d.stats().unrouted, 13 + 3);
}

#[test]
fn peek_routes_and_reports_without_taking() {
    let d = demux();
    let mut a = d.inbox(5).unwrap();
    let p = a.peek().unwrap().clone();
    assert!(!p.ready());
    d.queue().push(5, 1);
    assert!(p.ready(), "a peek polls the shared queue");
    assert!(d.queue().is_empty(), "and routed what it held");
    assert!(p.ready(), "peeking does not take");
    assert_eq!(a.try_take().unwrap(), Some((5, 1)));
    assert!(!p.ready());
    assert!(p.pump().is_some());
}

#[test]
fn arm_notice_answers_with_what_the_queue_holds() {
    let d = demux();
    let a = d.inbox(9).unwrap();
    let p = a.peek().unwrap().clone();
    let ring = crate::source::notice::NoticeRing::new(4);
    assert!(p.attach_notices(ring.notifier(3)));
    assert_eq!(p.arm_notice(), Some(false));
    d.queue().push(9, 0);
    d.pump();
    assert_eq!(ring.pop(), Some(3), "routing answered the request");
    assert_eq!(ring.pop(), None);
    assert_eq!(d.stats().notices, 1);
    // Ready now: the request says so at once, and no second notice comes
    // from a publish that finds no request.
    assert_eq!(p.arm_notice(), Some(true));
}

#[test]
fn a_failed_queue_closes_every_inbox() {
    struct Broken;
    impl SharedQueue for Broken {
        type Item = u64;
        fn poll(&self, _: &mut Vec<u64>) -> Result<()> {
            Err(Fail::new(libc::EIO, "broken"))
        }
        fn key(&self, c: &u64) -> u64 {
            *c
        }
    }
    let d = Demux::new(Broken);
    let mut a = d.inbox(1).unwrap();
    assert!(a.ready(), "a closed source is ready");
    assert_eq!(a.try_take().unwrap_err().errno(), libc::EIO);
    let mut late = d.inbox(2).unwrap();
    assert_eq!(late.try_take().unwrap_err().errno(), libc::EIO);
}

/// Owners on their own threads, each taking only its key, while a
/// producer pushes random keys and every owner pumps: many concurrent
/// pumps, so most find the lock taken and leave their request to its
/// holder. Nothing lost, duplicated or reordered; polling owners.
#[test]
fn contended_pumps_lose_and_reorder_nothing() {
    let seed = std::env::var("FW_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("seed {seed} (FW_STRESS_SEED to replay)");
    let owners = 8u64;
    let per = 20_000u64;
    let d = demux();
    let inboxes: Vec<_> = (0..owners).map(|k| d.inbox(k).unwrap()).collect();
    std::thread::scope(|s| {
        for mut inbox in inboxes {
            s.spawn(move || {
                let k = inbox.key();
                let deadline = Instant::now() + Duration::from_secs(60);
                for want in 0..per {
                    loop {
                        if let Some((key, v)) = inbox.try_take().unwrap() {
                            assert_eq!((key, v), (k, want), "owner {k}: lost or reordered");
                            break;
                        }
                        assert!(Instant::now() < deadline, "owner {k}: {want} lost");
                        std::thread::yield_now();
                    }
                }
                assert_eq!(inbox.try_take().unwrap(), None, "owner {k}: extra");
            });
        }
        let q = d.queue();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut next = vec![0u64; owners as usize];
        let mut open: Vec<u64> = (0..owners).collect();
        while !open.is_empty() {
            let j = rng.random_range(0..open.len());
            let k = open[j];
            q.push(k, next[k as usize]);
            next[k as usize] += 1;
            if next[k as usize] == per {
                open.swap_remove(j);
            }
        }
    });
    let st = d.stats();
    eprintln!("{st:?}");
    assert_eq!(st.routed, owners * per);
    assert_eq!(st.unrouted, 0);
}

/// Interrupt mode: owners sleep on their inboxes, which share the queue's
/// one event fd; whichever sleeper gets an event routes for the others
/// and rings their doorbells. Bursts with pauses, so owners do sleep.
#[test]
fn sleepers_share_one_event_fd_and_lose_nothing() {
    let owners = 6u64;
    let per = 300u64;
    let d = demux();
    let inboxes: Vec<_> = (0..owners).map(|k| d.inbox(k).unwrap()).collect();
    let sleeps = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for mut inbox in inboxes {
            let sleeps = &sleeps;
            s.spawn(move || {
                let k = inbox.key();
                let mut r = BlockReport::default();
                let deadline = Instant::now() + Duration::from_secs(30);
                for want in 0..per {
                    let got = block_until_ready(&mut inbox, Some(deadline), &mut r)
                        .unwrap()
                        .unwrap_or_else(|| panic!("owner {k}: {want} lost (a lost wake-up)"));
                    assert_eq!(got, (k, want), "owner {k}: reordered");
                }
                sleeps.fetch_add(r.sleeps as u64, std::sync::atomic::Ordering::Relaxed);
            });
        }
        let mut rng = StdRng::seed_from_u64(7);
        for v in 0..per {
            let mut keys: Vec<u64> = (0..owners).collect();
            keys.sort_by_key(|_| rng.random::<u32>());
            // Some rounds reach only a few owners before the pause.
            for k in keys {
                d.queue().push(k, v);
                if rng.random_range(0..4) == 0 {
                    std::thread::sleep(Duration::from_micros(rng.random_range(1..200)));
                }
            }
        }
    });
    let st = d.stats();
    let sleeps = sleeps.into_inner();
    eprintln!("{st:?}, {sleeps} sleeps");
    assert_eq!(st.routed, owners * per);
    assert!(sleeps > 0, "no owner slept: the event path was not tested");
    assert!(st.rings > 0, "no router rang another sleeper's doorbell");
}
