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

/// A hybrid wait does not spin while another thread of the process sleeps
/// in a wait on the same CPU (its completion would need the CPU the spin
/// holds); alone on the CPU, it spins.
#[test]
fn hybrid_does_not_spin_while_a_sibling_sleeps_on_its_cpu() {
    let cpu = common::two_cpus().1;
    let (mut tx_a, mut rx_a) = channel::channel(Config::default()).unwrap();
    let (mut tx_b, mut rx_b) = channel::channel(Config::default()).unwrap();
    let hybrid_wait = move |rx: &mut channel::Receiver| {
        fastwake::cpu::pin(cpu).unwrap();
        let mut w = Waiter::new(WaitMode::Hybrid {
            budget: Duration::from_micros(200),
        });
        w.wait_timeout(rx, Duration::from_secs(5))
            .unwrap()
            .expect("delivered");
        w.stats()
    };
    // A sleeps in interrupt mode on `cpu` until we send to it.
    let a = std::thread::spawn(move || {
        fastwake::cpu::pin(cpu).unwrap();
        let mut w = Waiter::new(WaitMode::Interrupt);
        w.wait_timeout(&mut rx_a, Duration::from_secs(5))
            .unwrap()
            .expect("delivered");
    });
    std::thread::sleep(Duration::from_millis(30));
    let b = std::thread::spawn(move || hybrid_wait(&mut rx_b));
    std::thread::sleep(Duration::from_millis(30));
    tx_b.send(1, b"").unwrap();
    let with_sibling = b.join().unwrap();
    tx_a.send(1, b"").unwrap();
    a.join().unwrap();
    assert_eq!(with_sibling.spin_skipped_siblings, 1, "{with_sibling:?}");
    // Alone on the CPU now: the same wait spins first.
    let (mut tx_c, mut rx_c) = channel::channel(Config::default()).unwrap();
    let c = std::thread::spawn(move || hybrid_wait(&mut rx_c));
    std::thread::sleep(Duration::from_millis(30));
    tx_c.send(1, b"").unwrap();
    let alone = c.join().unwrap();
    assert_eq!(alone.spin_skipped_siblings, 0, "{alone:?}");
}
