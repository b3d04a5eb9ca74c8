//! What `RingProducer::published` costs a caller-owned ring's producer
//! (`source::ring::producer`: a SeqCst fence and a load when nobody
//! waits; also a compare-exchange and a notice push when the owner
//! waits).
//!
//! ```sh
//! flock -x /tmp/fw-cpu.lock cargo run --release --example ring_published -- [ROUNDS]
//! ```
//!
//! Two parts:
//!
//! 1. **Alone**: one thread publishes into a ring nobody reads (the
//!    counters stay in its cache): ns per publish over a tight loop, the
//!    tail store alone against the store and the call.
//! 2. **With an owner** on the other CPU, a one-slot ring, ping-pong: the
//!    producer waits for the slot, then publishes; the owner takes the
//!    entry and frees the slot. The producer's publish (tail store, and
//!    the call) is timed with the TSC, per round; the median and p90 are
//!    printed. Three cases: the owner polls the tail and never asks for a
//!    notice (`bare store`, `published, owner not waiting`), or it asks
//!    for one before it frees the slot and then spins on its notice ring
//!    (`published, owner waiting`: every call answers a request and
//!    pushes a notice). The owner polling the tail holds its line, so the
//!    store misses: the bare store retires into the store buffer, while
//!    the fence waits for the line (the cost the module docs describe).
//!
//! Needs 2 CPUs and x86-64 (the TSC) for part 2; says SKIPPED otherwise.

use fastwake::source::ring::{ExternalRing, RingFd, RingProducer};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

#[repr(align(64))]
struct Line(AtomicU32);

struct Counters {
    head: Line,
    tail: Line,
}

/// A ring with notices over `c`, its producer handle.
fn ring(c: &Counters, efd: &std::os::fd::OwnedFd) -> (ExternalRing, RingProducer) {
    // SAFETY: the counters and the eventfd outlive the ring (the caller
    // keeps them until the ring is dropped).
    let r = unsafe {
        ExternalRing::with_notices(
            c.head.0.as_ptr().cast_const(),
            c.tail.0.as_ptr().cast_const(),
            efd.as_raw_fd(),
            RingFd::EventFd,
        )
    }
    .unwrap();
    let p = r.producer().unwrap();
    (r, p)
}

/// Part 1: ns per publish, alone, with and without the call.
fn alone(rounds: u32, efd: &std::os::fd::OwnedFd) {
    let c = Counters {
        head: Line(AtomicU32::new(0)),
        tail: Line(AtomicU32::new(0)),
    };
    let (_r, p) = ring(&c, efd);
    for run in 1..=3 {
        let t0 = Instant::now();
        for i in 0..rounds {
            c.tail.0.store(i, Ordering::Release);
            std::hint::black_box(&c.tail);
        }
        let bare = t0.elapsed().as_nanos() as f64 / rounds as f64;
        let t0 = Instant::now();
        for i in 0..rounds {
            c.tail.0.store(i, Ordering::Release);
            p.published();
        }
        let called = t0.elapsed().as_nanos() as f64 / rounds as f64;
        println!(
            "alone, run {run}: tail store {bare:.2} ns, tail store + published() {called:.2} ns per publish ({rounds} publishes)"
        );
    }
}

/// Part 2 (x86-64 only: the TSC).
#[cfg(target_arch = "x86_64")]
mod with_owner {
    use super::{Counters, Line, ring};
    use fastwake::Source;
    use fastwake::source::notice::NoticeRing;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    pub(super) fn tsc() -> u64 {
        // SAFETY: rdtscp and lfence exist on every x86-64 CPU; they read the
        // time stamp counter and order instructions, nothing else.
        unsafe {
            let mut aux = 0;
            let t = std::arch::x86_64::__rdtscp(&mut aux);
            std::arch::x86_64::_mm_lfence();
            t
        }
    }

    /// TSC ticks per ns, over 100 ms of the monotonic clock.
    pub(super) fn ticks_per_ns() -> f64 {
        let (t0, c0) = (Instant::now(), tsc());
        std::thread::sleep(Duration::from_millis(100));
        (tsc() - c0) as f64 / t0.elapsed().as_nanos() as f64
    }

    #[derive(Clone, Copy, PartialEq, Debug)]
    pub(super) enum Case {
        Bare,
        NotWaiting,
        Waiting,
    }

    /// Part 2, one case: the producer's publish times, in ticks, per round.
    pub(super) fn ping_pong(case: Case, rounds: u32, efd: &std::os::fd::OwnedFd) -> Vec<u64> {
        let c = Arc::new(Counters {
            head: Line(AtomicU32::new(0)),
            tail: Line(AtomicU32::new(0)),
        });
        let (r, p) = ring(&c, efd);
        let notices = NoticeRing::new(1);
        let peek = r.peek().unwrap().clone();
        assert!(peek.attach_notices(notices.notifier(0)));
        let go = Arc::new(Barrier::new(2));
        let stop = Arc::new(AtomicBool::new(false));
        let owner = {
            let (c, go, stop) = (c.clone(), go.clone(), stop.clone());
            std::thread::spawn(move || {
                fastwake::cpu::pin(1).unwrap();
                go.wait();
                let mut head = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if case == Case::Waiting {
                        // Waits only through its notice ring.
                        if notices.pop().is_none() {
                            std::hint::spin_loop();
                            continue;
                        }
                        if c.tail.0.load(Ordering::Acquire) == head {
                            continue; // a stale notice
                        }
                        // Ask for the next notice before freeing the slot: the
                        // producer's next publish answers it.
                        peek.arm_notice();
                    } else if c.tail.0.load(Ordering::Acquire) == head {
                        std::hint::spin_loop();
                        continue;
                    }
                    head = head.wrapping_add(1);
                    c.head.0.store(head, Ordering::Release);
                }
            })
        };
        fastwake::cpu::pin(0).unwrap();
        if case == Case::Waiting {
            // The first request.
            r.peek().unwrap().arm_notice();
        }
        go.wait();
        let mut times = Vec::with_capacity(rounds as usize);
        for t in 1..=rounds {
            while c.head.0.load(Ordering::Acquire) != t - 1 {
                std::hint::spin_loop();
            }
            let t0 = tsc();
            c.tail.0.store(t, Ordering::Release);
            if case != Case::Bare {
                p.published();
            }
            times.push(tsc() - t0);
        }
        while c.head.0.load(Ordering::Acquire) != rounds {
            std::hint::spin_loop();
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        times
    }
}

fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap();
    // Read before the pin below: it counts the CPUs this thread may use.
    let cpus = fastwake::cpu::online();
    fastwake::cpu::pin(cpus.saturating_sub(1)).unwrap();
    alone(rounds * 50, &efd);
    #[cfg(not(target_arch = "x86_64"))]
    println!("SKIPPED with an owner: the timing uses the x86-64 TSC");
    #[cfg(target_arch = "x86_64")]
    {
        use with_owner::{Case, ping_pong, ticks_per_ns, tsc};
        if cpus < 2 {
            println!("SKIPPED with an owner: needs 2 CPUs");
            return;
        }
        let per_ns = ticks_per_ns();
        let ns = |t: u64| t as f64 / per_ns;
        // What the timing itself reads with nothing between: subtract it.
        let mut empty: Vec<u64> = (0..10_000).map(|_| tsc().wrapping_neg() + tsc()).collect();
        empty.sort_unstable();
        println!(
            "with an owner: an empty timing reads median {:.0} ns, p90 {:.0} ns",
            ns(empty[empty.len() / 2]),
            ns(empty[empty.len() * 9 / 10])
        );
        let rounds = rounds / 4;
        for run in 1..=3 {
            for case in [Case::Bare, Case::NotWaiting, Case::Waiting] {
                let mut t = ping_pong(case, rounds, &efd);
                t.sort_unstable();
                let what = match case {
                    Case::Bare => "tail store alone (owner polls)",
                    Case::NotWaiting => "tail store + published(), owner not waiting (polls)",
                    Case::Waiting => "tail store + published(), owner waiting (answer + push)",
                };
                println!(
                    "with an owner, run {run}: {what}: median {:.0} ns, p90 {:.0} ns ({rounds} rounds, TSC {per_ns:.3}/ns)",
                    ns(t[t.len() / 2]),
                    ns(t[t.len() * 9 / 10])
                );
            }
        }
    }
}
