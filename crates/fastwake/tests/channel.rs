//! The shared-memory channel, one behaviour per test.

mod common;

use fastwake::source::channel::{self, Config, Doorbell, Receiver, Sender, SharedChannel};
use fastwake::{Source, WaitMode, Waiter};
use std::time::{Duration, Instant};

fn cfg(capacity: u32, slot: u32, doorbell: Doorbell) -> Config {
    Config {
        capacity,
        slot_size: slot,
        doorbell,
    }
}

#[test]
fn delivers_in_order_with_payload() {
    let (mut tx, mut rx) = channel::channel(cfg(8, 32, Doorbell::Futex)).unwrap();
    for t in 0..5u64 {
        assert!(tx.try_send(t, &common::payload_for(t, 20)).unwrap());
    }
    for t in 0..5u64 {
        assert!(rx.ready());
        let m = rx.try_take().unwrap().expect("a completion");
        assert_eq!(m.tag, t);
        assert_eq!(rx.payload(), &common::payload_for(t, 20)[..]);
    }
    assert!(!rx.ready());
    assert!(rx.try_take().unwrap().is_none());
}

#[test]
fn peek_does_not_consume() {
    let (mut tx, mut rx) = channel::channel(Config::default()).unwrap();
    tx.try_send(7, b"x").unwrap();
    for _ in 0..3 {
        assert!(rx.ready());
    }
    assert_eq!(rx.pending(), 1);
    assert_eq!(rx.try_take().unwrap().unwrap().tag, 7);
    assert_eq!(rx.pending(), 0);
}

/// The dispatcher's prefetch hint must name the slot the owner reads next,
/// across wrap-arounds and for slots of more than one line; a wrong hint
/// would not break anything, only silently cost the prefetch its point.
#[test]
fn next_at_names_the_slot_of_the_next_completion() {
    for slot in [8, 64, 200] {
        let (mut tx, mut rx) = channel::channel(cfg(4, slot, Doorbell::Futex)).unwrap();
        let peek = rx.peek().expect("channels are peekable").clone();
        let c = peek.counters().expect("channels offer counters");
        let at = c.next_at.expect("channels know their next slot");
        for t in 0..11u64 {
            tx.try_send(1000 + t, b"x").unwrap();
            let consumed = c.consumed.load(std::sync::atomic::Ordering::Acquire);
            let p = at
                .base
                .wrapping_add((consumed & at.mask) as usize * at.stride);
            // SAFETY: the hint points into the channel's mapping, which
            // `peek` keeps alive; the slot was published above and is not
            // written again before it is consumed below.
            let tag = unsafe { p.cast::<u64>().read_volatile() };
            assert_eq!(tag, 1000 + t, "slot size {slot}, completion {t}");
            at.prefetch(consumed);
            assert_eq!(rx.try_take().unwrap().unwrap().tag, 1000 + t);
        }
    }
}

#[test]
fn full_ring_refuses_then_accepts_after_consume() {
    let (mut tx, mut rx) = channel::channel(cfg(4, 8, Doorbell::Futex)).unwrap();
    for t in 0..4 {
        assert!(tx.try_send(t, b"").unwrap());
    }
    assert!(!tx.try_send(4, b"").unwrap(), "a 4-slot ring holds 4");
    rx.try_take().unwrap().unwrap();
    assert!(tx.try_send(4, b"").unwrap());
}

#[test]
fn oversized_payload_is_an_error() {
    let (mut tx, _rx) = channel::channel(cfg(4, 8, Doorbell::Futex)).unwrap();
    let e = tx.try_send(0, &[0u8; 9]).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn bad_config_is_rejected() {
    for c in [
        cfg(3, 8, Doorbell::Futex),
        cfg(0, 8, Doorbell::Futex),
        cfg(8, 1 << 21, Doorbell::Futex),
    ] {
        let e = channel::channel(c).err().expect("invalid config");
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    }
}

#[test]
fn producer_close_drains_then_reports_closed() {
    let (mut tx, mut rx) = channel::channel(Config::default()).unwrap();
    tx.try_send(1, b"a").unwrap();
    drop(tx);
    assert_eq!(rx.try_take().unwrap().unwrap().tag, 1);
    let e = rx.try_take().unwrap_err();
    assert!(e.is_closed(), "{e}");
}

#[test]
fn producer_close_wakes_a_sleeping_consumer() {
    let (tx, mut rx) = channel::channel(Config::default()).unwrap();
    let h = std::thread::spawn(move || {
        let mut w = Waiter::new(WaitMode::Interrupt);
        w.wait(&mut rx).map(|m| m.tag)
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(tx);
    let r = h.join().unwrap();
    assert!(r.unwrap_err().is_closed());
}

#[test]
fn consumer_close_makes_full_sender_fail() {
    let (mut tx, rx) = channel::channel(cfg(2, 8, Doorbell::Futex)).unwrap();
    tx.try_send(0, b"").unwrap();
    tx.try_send(1, b"").unwrap();
    drop(rx);
    assert!(tx.try_send(2, b"").unwrap_err().is_closed());
}

#[test]
fn second_producer_or_consumer_is_refused() {
    let sc = SharedChannel::create(Config::default()).unwrap();
    let _tx = sc.sender().unwrap();
    let _rx = sc.receiver().unwrap();
    assert_eq!(sc.sender().err().unwrap().errno(), libc::EBUSY);
    assert_eq!(sc.receiver().err().unwrap().errno(), libc::EBUSY);
}

#[test]
fn interrupt_wait_times_out_with_nothing_sent() {
    let (_tx, mut rx) = channel::channel(Config::default()).unwrap();
    let mut w = Waiter::new(WaitMode::Interrupt);
    let t0 = Instant::now();
    let r = w.wait_timeout(&mut rx, Duration::from_millis(30)).unwrap();
    let el = t0.elapsed();
    assert!(r.is_none());
    assert!(el >= Duration::from_millis(30), "returned early: {el:?}");
    assert!(el < Duration::from_secs(2), "overslept: {el:?}");
}

/// A sleeper learns its wake-up latency from the producer's dated ring;
/// a wait that never slept, or slept on a ring dated before its arm,
/// reports none.
#[test]
fn a_ring_is_dated_so_the_sleeper_measures_its_wake_up() {
    use fastwake::source::{BlockReport, block_until_ready};
    for doorbell in [Doorbell::Futex, Doorbell::EventFd] {
        let (mut tx, mut rx) = channel::channel(cfg(8, 8, doorbell)).unwrap();
        // The consumer must be asleep when the message goes out; on a
        // loaded machine it may not be after one delay, so try longer ones
        // (a try where it did not sleep proves nothing either way).
        let mut slept = None;
        for attempt in 1..=5u64 {
            let h = std::thread::spawn(move || {
                let mut rep = BlockReport::default();
                let deadline = Instant::now() + Duration::from_secs(10);
                let t0 = Instant::now();
                let m = block_until_ready(&mut rx, Some(deadline), &mut rep).unwrap();
                (m.map(|m| m.tag), rep, t0.elapsed(), rx)
            });
            std::thread::sleep(Duration::from_millis(30 * attempt));
            tx.send(attempt, b"").unwrap();
            let (tag, rep, took, back) = h.join().unwrap();
            rx = back;
            assert_eq!(tag, Some(attempt));
            if rep.sleeps >= 1 {
                slept = Some((rep, took));
                break;
            }
        }
        let (rep, took) = slept.unwrap_or_else(|| panic!("{doorbell:?}: never slept in 5 tries"));
        let wake = rep
            .wake_ns
            .unwrap_or_else(|| panic!("{doorbell:?}: no dated ring: {rep:?}"));
        assert!(
            wake > 0 && wake < took.as_nanos() as u64,
            "{doorbell:?}: wake-up {wake} ns outside (0, {took:?})"
        );
        // Ready before the call: no sleep, and the old ring is not reused.
        tx.send(99, b"").unwrap();
        let mut rep = BlockReport::default();
        let m = block_until_ready(&mut rx, None, &mut rep).unwrap().unwrap();
        assert_eq!(m.tag, 99);
        assert_eq!((rep.sleeps, rep.wake_ns), (0, None), "{doorbell:?}");
    }
}

fn doorbell_wakes_sleeper(doorbell: Doorbell) {
    let (mut tx, mut rx) = channel::channel(cfg(16, 8, doorbell)).unwrap();
    let h = std::thread::spawn(move || {
        let mut w = Waiter::new(WaitMode::Interrupt);
        let mut tags = Vec::new();
        for _ in 0..100 {
            tags.push(w.wait(&mut rx).unwrap().tag);
        }
        (tags, w.stats())
    });
    for t in 0..100u64 {
        if t % 10 == 0 {
            // Give the consumer time to fall asleep so the doorbell is used.
            std::thread::sleep(Duration::from_millis(2));
        }
        tx.send(t, b"").unwrap();
    }
    let (tags, stats) = h.join().unwrap();
    assert_eq!(tags, (0..100).collect::<Vec<_>>());
    assert!(stats.sleeps > 0, "the consumer never slept: {stats:?}");
}

#[test]
fn futex_doorbell_wakes_sleeper() {
    doorbell_wakes_sleeper(Doorbell::Futex);
}

#[test]
fn eventfd_doorbell_wakes_sleeper() {
    doorbell_wakes_sleeper(Doorbell::EventFd);
}

#[test]
fn eventfd_doorbell_exposes_a_pollable_fd() {
    let (_tx, rx) = channel::channel(cfg(4, 8, Doorbell::EventFd)).unwrap();
    assert!(rx.notify_fd().is_some());
    let (_tx2, rx2) = channel::channel(cfg(4, 8, Doorbell::Futex)).unwrap();
    assert!(rx2.notify_fd().is_none());
}

#[test]
fn polling_consumer_costs_producer_no_doorbell() {
    // With the consumer never arming, the producer must never ring: the
    // eventfd counter stays zero.
    let (mut tx, mut rx) = channel::channel(cfg(64, 8, Doorbell::EventFd)).unwrap();
    for t in 0..50 {
        tx.try_send(t, b"").unwrap();
        rx.try_take().unwrap().unwrap();
    }
    let fd = rx.notify_fd().unwrap();
    rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(rustix::io::read(fd, &mut b), Err(rustix::io::Errno::AGAIN));
}

#[test]
fn attach_rejects_a_foreign_fd() {
    let f = rustix::fs::memfd_create("not-a-channel", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&f, 4096).unwrap();
    let e = Receiver::attach(f, None).err().expect("must refuse");
    assert_eq!(e.errno(), libc::EINVAL);
    let empty = rustix::fs::memfd_create("empty", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    assert!(Sender::attach(empty, None).is_err());
}

/// Cross-process: the test re-runs its own binary as the producer, handing
/// it the channel memfd by inheritance.
#[test]
fn works_between_processes() {
    const N: u64 = 20_000;
    if let Ok(fd) = std::env::var("FW_TEST_CHILD_FD") {
        use std::os::fd::FromRawFd;
        // SAFETY: the parent passed us this fd number, open and owned by no
        // one else in this process.
        let mem = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd.parse().unwrap()) };
        let mut tx = Sender::attach(mem, None).unwrap();
        for t in 0..N {
            tx.send(t, &common::payload_for(t, 16)).unwrap();
        }
        return;
    }
    let sc = SharedChannel::create(cfg(128, 16, Doorbell::Futex)).unwrap();
    let mut rx = sc.receiver().unwrap();
    let raw = {
        use std::os::fd::AsRawFd;
        sc.memory_fd().as_raw_fd()
    };
    // The memfd is CLOEXEC; give the child a non-CLOEXEC duplicate.
    let dup = rustix::io::fcntl_dupfd_cloexec(sc.memory_fd(), 100).unwrap();
    rustix::io::fcntl_setfd(&dup, rustix::io::FdFlags::empty()).unwrap();
    let _ = raw;
    let child_fd = {
        use std::os::fd::AsRawFd;
        dup.as_raw_fd()
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "works_between_processes", "--nocapture"])
        .env("FW_TEST_CHILD_FD", child_fd.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(dup);
    let mut w = Waiter::new(WaitMode::Interrupt);
    for t in 0..N {
        let m = w
            .wait_timeout(&mut rx, Duration::from_secs(20))
            .unwrap()
            .expect("child stalled");
        assert_eq!(m.tag, t);
        assert_eq!(rx.payload(), &common::payload_for(t, 16)[..]);
    }
    assert!(child.wait().unwrap().success());
}
