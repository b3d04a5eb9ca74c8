//! loom models of the arm → re-check → sleep protocol and the conditional
//! doorbell, on the real channel code (atomics and the futex come from
//! `fastwake::sync`, which loom replaces under `--cfg loom`).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p fastwake --test loom_channel`
//! (scripts/test does, in its own target dir). A lost wake-up shows as a
//! loom deadlock; a lost or duplicated completion as a failed assertion.
#![cfg(loom)]

use fastwake::source::channel::{self, Config, Doorbell};
use fastwake::{WaitMode, Waiter};

fn cfg() -> Config {
    Config {
        capacity: 2,
        slot_size: 8,
        doorbell: Doorbell::Futex,
    }
}

/// Two completions from a producer thread, consumer in interrupt mode: every
/// interleaving of send/flush with arm/re-check/sleep must deliver both, in
/// order, and never sleep forever.
#[test]
fn interrupt_wait_never_loses_a_wakeup() {
    loom::model(|| {
        let (mut tx, mut rx) = channel::channel(cfg()).unwrap();
        let p = loom::thread::spawn(move || {
            tx.send(1, b"").unwrap();
            tx.send(2, b"").unwrap();
            // Keep the sender alive until the end so the close path does
            // not mask a lost doorbell.
            tx
        });
        let mut w = Waiter::new(WaitMode::Interrupt);
        assert_eq!(w.wait(&mut rx).unwrap().tag, 1);
        assert_eq!(w.wait(&mut rx).unwrap().tag, 2);
        drop(p.join().unwrap());
    });
}

/// A consumer asleep when the producer goes away must wake and see "closed".
#[test]
fn close_wakes_a_sleeper() {
    loom::model(|| {
        let (tx, mut rx) = channel::channel(cfg()).unwrap();
        let p = loom::thread::spawn(move || drop(tx));
        let mut w = Waiter::new(WaitMode::Interrupt);
        assert!(w.wait(&mut rx).unwrap_err().is_closed());
        p.join().unwrap();
    });
}
