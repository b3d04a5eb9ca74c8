//! Wait modes, one behaviour per test. Spinning tests hold the spin lock.

mod common;

use fastwake::source::channel::{self, Config};
use fastwake::{WaitMode, Waiter};
use std::time::Duration;

fn echo_through(mode: WaitMode, cpus: (u32, u32), n: u64) -> fastwake::wait::WaitStats {
    let (mut tx, mut rx) = channel::channel(Config::default()).unwrap();
    let prod = std::thread::spawn(move || {
        fastwake::cpu::pin(cpus.0).unwrap();
        for t in 0..n {
            if t % 50 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            tx.send(t, b"").unwrap();
        }
    });
    fastwake::cpu::pin(cpus.1).unwrap();
    let mut w = Waiter::new(mode);
    for t in 0..n {
        let m = w
            .wait_timeout(&mut rx, Duration::from_secs(10))
            .unwrap()
            .expect("stalled");
        assert_eq!(m.tag, t);
    }
    prod.join().unwrap();
    fastwake::cpu::unpin().unwrap();
    w.stats()
}

#[test]
fn poll_receives_everything() {
    let _g = common::spin_lock();
    let s = echo_through(WaitMode::Poll, common::two_cpus(), 2000);
    assert_eq!(s.completions, 2000);
    assert_eq!(s.sleeps, 0, "poll mode never sleeps");
}

#[test]
fn interrupt_receives_everything_and_sleeps() {
    let s = echo_through(WaitMode::Interrupt, common::two_cpus(), 2000);
    assert_eq!(s.completions, 2000);
    assert!(s.sleeps > 0);
}

#[test]
fn hybrid_receives_everything() {
    let _g = common::spin_lock();
    let s = echo_through(
        WaitMode::Hybrid {
            budget: Duration::from_micros(20),
        },
        common::two_cpus(),
        2000,
    );
    assert_eq!(s.completions, 2000);
}

#[test]
fn hybrid_does_not_spin_against_a_producer_on_its_cpu() {
    let _g = common::spin_lock();
    let s = echo_through(
        WaitMode::Hybrid {
            budget: Duration::from_millis(5),
        },
        (0, 0),
        300,
    );
    assert!(
        s.spin_skipped_same_cpu > 0,
        "hybrid spun against a same-CPU producer: {s:?}"
    );
}

#[test]
fn mode_names_parse_and_print() {
    for (s, m) in [
        ("poll", WaitMode::Poll),
        ("interrupt", WaitMode::Interrupt),
        (
            "hybrid",
            WaitMode::Hybrid {
                budget: fastwake::wait::DEFAULT_BUDGET,
            },
        ),
        (
            "hybrid:5us",
            WaitMode::Hybrid {
                budget: Duration::from_micros(5),
            },
        ),
    ] {
        let p: WaitMode = s.parse().unwrap();
        assert_eq!(p, m);
        assert_eq!(p.to_string(), s);
    }
    for bad in ["", "spin", "hybrid:abc", "hybrid:-1us"] {
        let e = bad.parse::<WaitMode>().unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(!e.to_string().contains('\n'));
    }
}

#[test]
fn poll_with_deadline_returns_none() {
    let _g = common::spin_lock();
    let (_tx, mut rx) = channel::channel(Config::default()).unwrap();
    let mut w = Waiter::new(WaitMode::Poll);
    let r = w.wait_timeout(&mut rx, Duration::from_millis(5)).unwrap();
    assert!(r.is_none());
}
