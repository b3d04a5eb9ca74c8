//! Caller-owned rings (`source::ring::ExternalRing`) in dispatch mode,
//! threads and tasks, under random traffic: rings made with notices whose
//! producer calls `RingProducer::published` are handed off through ready
//! notices (the safety net finds nothing a notice did not name); a ring
//! without notices is still peeked every pass; a ring with notices whose
//! producer forgets the call is served by the safety net, and counted.
//! Every entry is checked per ring: none lost, duplicated or reordered.
//! The seed is printed; FW_STRESS_SEED replays a run.

mod common;

use fastwake::dispatch::{Config, DispatchStats, Dispatcher, Runtime, TaskConfig};
use fastwake::source::ring::{ExternalRing, RingFd, RingProducer};
use fastwake::{WaitMode, Waiter};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Entries per ring.
const CAP: u32 = 8;

/// A counter on a cache line of its own, as a real ring keeps it.
#[repr(align(64))]
struct Line(AtomicU32);

/// A single-producer ring of the caller's: two 32-bit counters, slots,
/// and an eventfd the producer writes after each publish (the doorbell an
/// owner handed back to interrupt mode sleeps on).
struct UserRing {
    head: Line,
    tail: Line,
    slots: [AtomicU64; CAP as usize],
    efd: OwnedFd,
}

/// How a ring's producer tells fastwake of a publish.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Calls {
    /// A ring without notices (`ExternalRing::new`): no call.
    Plain,
    /// With notices, and the producer calls `published` every time.
    Published,
    /// With notices, but the producer never calls `published`.
    Forgotten,
}

impl UserRing {
    fn new() -> Arc<UserRing> {
        Arc::new(UserRing {
            head: Line(AtomicU32::new(0)),
            tail: Line(AtomicU32::new(0)),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            efd: rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap(),
        })
    }

    /// The owner's source; the producer's handle when it calls.
    fn source(&self, calls: Calls) -> (ExternalRing, Option<RingProducer>) {
        let (head, tail, fd) = (
            self.head.0.as_ptr().cast_const(),
            self.tail.0.as_ptr().cast_const(),
            self.efd.as_raw_fd(),
        );
        // SAFETY: the counters and the eventfd live in `self`, an Arc the
        // test keeps until every waiter, dispatcher and runtime is done.
        let src = unsafe {
            match calls {
                Calls::Plain => ExternalRing::new(head, tail, fd, RingFd::EventFd),
                _ => ExternalRing::with_notices(head, tail, fd, RingFd::EventFd),
            }
        }
        .unwrap();
        let p = (calls == Calls::Published).then(|| src.producer().unwrap());
        (src, p)
    }

    /// Producer: append `v` unless the ring is full; then the call (when
    /// `p`), then the doorbell.
    fn try_push(&self, v: u64, p: Option<&RingProducer>) -> bool {
        let t = self.tail.0.load(Ordering::Relaxed);
        if t.wrapping_sub(self.head.0.load(Ordering::Acquire)) == CAP {
            return false;
        }
        self.slots[(t % CAP) as usize].store(v, Ordering::Relaxed);
        self.tail.0.store(t.wrapping_add(1), Ordering::Release);
        if let Some(p) = p {
            p.published();
        }
        // A failed write means the counter is saturated: a wake-up is
        // pending anyway.
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        true
    }

    /// Owner: take the `n` entries a wait reported, checking they are
    /// `next`, `next + 1`, ...
    fn reap(&self, n: u32, next: &mut u64, k: usize, seed: u64) {
        let h = self.head.0.load(Ordering::Relaxed);
        let t = self.tail.0.load(Ordering::Acquire);
        assert!(
            t.wrapping_sub(h) >= n && n > 0,
            "ring {k}: a wait reported {n} entries, {} there (seed {seed})",
            t.wrapping_sub(h)
        );
        for i in 0..n {
            let v = self.slots[(h.wrapping_add(i) % CAP) as usize].load(Ordering::Relaxed);
            assert_eq!(
                v, *next,
                "ring {k}: lost, duplicated or reordered (seed {seed})"
            );
            *next += 1;
        }
        self.head.0.store(h.wrapping_add(n), Ordering::Release);
    }
}

/// A ring as its producer sees it: the ring, and the handle to call when
/// it calls.
type Fed = (Arc<UserRing>, Option<RingProducer>);

/// Push values 0..per into every ring, in order per ring, rings in random
/// order, in bursts with random spins and sleeps between them.
fn produce(rings: &[Fed], per: u64, seed: u64, cpu: u32) {
    fastwake::cpu::pin(cpu).unwrap();
    common::produce_bursts(rings.len(), per, 8, seed, |k, v| {
        let (r, p) = &rings[k];
        r.try_push(v, p.as_ref())
    });
}

/// `n` rings whose producers make `calls`.
fn rings(n: usize, calls: Calls) -> (Vec<Fed>, Vec<ExternalRing>) {
    (0..n)
        .map(|_| {
            let r = UserRing::new();
            let (src, p) = r.source(calls);
            ((r, p), src)
        })
        .unzip()
}

/// `n` dispatch-mode threads on one CPU with a dispatcher made from
/// `cfg`, thread `k` waiting on ring `k` for `per` values in order, fed
/// by one producer on the other CPU. Returns the dispatcher's counters
/// once every notice the producer pushed has been popped.
fn threads_on_rings(n: usize, per: u64, calls: Calls, cfg: Config, seed: u64) -> DispatchStats {
    let (pcpu, wcpu) = common::two_cpus();
    let disp = Dispatcher::start(Config { cpu: wcpu, ..cfg }).expect("start dispatcher");
    let (rings, srcs) = rings(n, calls);
    let start = Arc::new(std::sync::Barrier::new(n + 1));
    let waiters: Vec<_> = srcs
        .into_iter()
        .enumerate()
        .map(|(k, mut src)| {
            let (start, ring) = (start.clone(), rings[k].0.clone());
            std::thread::spawn(move || {
                fastwake::cpu::pin(wcpu).unwrap();
                let mut w = Waiter::new(WaitMode::Dispatch);
                start.wait();
                let mut next = 0;
                while next < per {
                    let got = w
                        .wait_timeout(&mut src, Duration::from_secs(20))
                        .unwrap()
                        .unwrap_or_else(|| panic!("ring {k}: {next} lost (seed {seed})"));
                    ring.reap(got, &mut next, k, seed);
                }
                w.stats()
            })
        })
        .collect();
    start.wait();
    produce(&rings, per, seed, pcpu);
    let (mut handoffs, mut fallbacks) = (0, 0);
    for w in waiters {
        let s = w.join().unwrap();
        handoffs += s.handoffs;
        fallbacks += s.dispatch_fallbacks;
    }
    // The dispatcher publishes its late-notice count every few hundred
    // empty passes: give it a few milliseconds of them.
    std::thread::sleep(Duration::from_millis(20));
    let ds = disp.stats();
    eprintln!(
        "threads, {n} rings x {per}, {calls:?}: {handoffs} hand-offs, {fallbacks} fallbacks; dispatcher {ds:?} (seed {seed})"
    );
    drop(disp);
    drop(rings);
    ds
}

/// Threads on rings whose producer calls `published`, with a dispatcher
/// that never idles and never lets a waiter relay: every hand-off is the
/// dispatcher's, and every notice it gets is counted, so a safety-net
/// find without a (late) notice is a lost notice.
#[test]
fn threads_are_handed_off_through_ring_notices() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("ring");
    let cfg = always_dispatching();
    let ds = threads_on_rings(16, 1_500, Calls::Published, cfg, seed);
    assert!(ds.notices > 0, "no hand-off came through a notice: {ds:?}");
    few_without_a_notice(ds.notices, ds.scan_found, ds.late_notices, seed);
}

/// Not `scan_found == late_notices`, as for a channel: a ring's producer
/// stores its tail and then calls `published`, and the safety net may find
/// the entry in between (the producer preempted there); if the owner has
/// asked again by the time the call runs, the call owes nothing and no
/// late notice follows (seen once in CI's C test: 7 finds, 4 late, 287
/// notices). Lost notices show as many finds (a producer that never
/// calls: hundreds, `a_ring_whose_producer_forgets_the_call_...`).
fn few_without_a_notice(notices: u64, found: u64, late: u64, seed: u64) {
    assert!(
        found <= late + 2 + notices / 50,
        "the safety net found {found} waits without a notice ({late} came late, {notices} notices): lost notices (seed {seed})"
    );
}

/// A dispatcher on CPU 0 that never goes idle and with no relays: every
/// wait is its own to hand off, so its counters tell the whole story.
fn always_dispatching() -> Config {
    let mut cfg = Config::new(0);
    cfg.idle_after = None;
    cfg.relay = None;
    cfg
}

/// The same with the default dispatcher (idle after 2 ms, relays): waits
/// handed back to interrupt mode sleep on the ring's eventfd, relays pop
/// notices; nothing lost.
#[test]
fn threads_on_ring_notices_survive_idle_and_relays() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("ring");
    let ds = threads_on_rings(16, 1_000, Calls::Published, Config::new(0), seed);
    assert!(ds.notices > 0, "no hand-off came through a notice: {ds:?}");
}

/// A ring without notices (`ExternalRing::new`) is peeked every pass:
/// served, with no notice.
#[test]
fn a_ring_without_notices_is_peeked() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("ring");
    let cfg = always_dispatching();
    let ds = threads_on_rings(4, 400, Calls::Plain, cfg, seed);
    assert!(ds.handoffs > 0, "never handed off: {ds:?}");
    assert_eq!(ds.notices, 0, "notices from a ring without them: {ds:?}");
    assert_eq!(ds.scan_found, 0, "{ds:?}");
}

/// A ring with notices whose producer never calls `published`: no pass
/// peeks it, so the safety net hands its waits off (besides the one peek
/// when a waiter registers, and the waiter's own re-check); they are
/// served (late), never lost, and counted as finds without a notice.
#[test]
fn a_ring_whose_producer_forgets_the_call_is_found_by_the_safety_net() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("ring");
    let cfg = always_dispatching();
    let ds = threads_on_rings(4, 400, Calls::Forgotten, cfg, seed);
    assert_eq!(ds.notices, 0, "a notice nobody pushed: {ds:?}");
    assert_eq!(ds.late_notices, 0, "{ds:?}");
    assert!(
        ds.scan_found > 0,
        "the safety net never served the forgotten ring: {ds:?}"
    );
}

/// Tasks on rings whose producer calls `published`: handed off through
/// notices; the safety net finds nothing a notice did not name.
#[test]
fn tasks_are_handed_off_through_ring_notices() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("ring");
    let (n, per) = (64usize, 800u64);
    let (pcpu, wcpu) = common::two_cpus();
    let (rings, srcs) = rings(n, Calls::Published);
    let owned: Vec<Arc<UserRing>> = rings.iter().map(|(r, _)| r.clone()).collect();
    let rt = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut rt = Runtime::new(TaskConfig {
            // Short, so idle periods (naps: a ring cannot raise a summary
            // flag) happen in the producer's sleeps.
            idle_after: Some(Duration::from_micros(200)),
            ..TaskConfig::default()
        })
        .unwrap();
        for (k, (mut src, ring)) in srcs.into_iter().zip(owned).enumerate() {
            rt.spawn(move |cx| {
                let mut next = 0;
                while next < per {
                    let got = cx.wait(&mut src)?;
                    ring.reap(got, &mut next, k, seed);
                }
                Ok(())
            })
            .unwrap();
        }
        let st = rt.run().unwrap();
        let errors = rt.take_errors();
        assert!(errors.is_empty(), "tasks failed: {errors:?}");
        st
    });
    produce(&rings, per, seed, pcpu);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rt.is_finished() {
        assert!(Instant::now() < deadline, "not done in 60 s (seed {seed})");
        std::thread::sleep(Duration::from_millis(5));
    }
    let ts = rt.join().unwrap();
    eprintln!("tasks, {n} rings x {per}: {ts:?} (seed {seed})");
    assert!(ts.notices > 0, "no hand-off came through a notice: {ts:?}");
    few_without_a_notice(ts.notices, ts.scan_found, ts.late_notices, seed);
}
