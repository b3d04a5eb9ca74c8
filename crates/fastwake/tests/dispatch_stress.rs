//! Randomised stress of the dispatchers over many sources with random
//! ready patterns: the ready notices (most sources idle at any moment, a
//! few busy, bursts landing on random sets of sources, pauses long enough
//! for waiters to sleep), for the task runtime and for kernel threads in
//! dispatch mode. Every completion is checked per source: none lost (each
//! waiter gets its full count within a bound), none handed off twice or
//! reordered (tags arrive in order, once). The notices' safety net must
//! have found nothing that did not turn out to be a late notice.
//!
//! The seed is printed; set FW_STRESS_SEED to replay a run.

mod common;
mod dispatch_common;

use dispatch_common::chan;
use fastwake::dispatch::{Config, Dispatcher, Runtime, TaskConfig};
use fastwake::source::Source;
use fastwake::source::channel::Sender;
use fastwake::{WaitMode, Waiter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// Senders, each owed tags 0..per in order.
struct Feed {
    txs: Vec<Sender>,
    per: u64,
    sent: Vec<u64>,
    /// Senders with tags still to send.
    open: Vec<usize>,
}

impl Feed {
    fn new(txs: Vec<Sender>, per: u64) -> Feed {
        let n = txs.len();
        Feed {
            txs,
            per,
            sent: vec![0; n],
            open: (0..n).collect(),
        }
    }

    fn done(&self) -> bool {
        self.open.is_empty()
    }

    /// One completion each to up to `n` open senders picked at random.
    fn burst(&mut self, rng: &mut StdRng, n: usize) {
        for _ in 0..n.min(self.open.len()) {
            let k = rng.random_range(0..self.open.len());
            let i = self.open[k];
            self.txs[i].send(self.sent[i], &[0u8; 8]).unwrap();
            self.sent[i] += 1;
            if self.sent[i] == self.per {
                self.open.swap_remove(k);
            }
        }
    }
}

/// Send `per` tags (0..per) to every sender in random ready patterns:
/// a burst picks a random set of sources (one, a few, or many), sends one
/// completion to each, and now and then pauses (spinning or sleeping) so
/// that the waiters go back to waiting, or the dispatcher to sleep.
fn produce(txs: Vec<Sender>, per: u64, seed: u64, cpu: u32) {
    fastwake::cpu::pin(cpu).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut feed = Feed::new(txs, per);
    while !feed.done() {
        let burst = match rng.random_range(0..4) {
            0 => 1,
            1 => rng.random_range(1..=4),
            2 => rng.random_range(1..=32),
            _ => rng.random_range(1..=feed.open.len()),
        };
        feed.burst(&mut rng, burst);
        match rng.random_range(0..64) {
            0 => std::thread::sleep(Duration::from_micros(rng.random_range(1..300))),
            1..=8 => {
                let until = Instant::now() + Duration::from_micros(rng.random_range(1..20));
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            _ => {}
        }
    }
    // Senders drop here: the waiters see the close after their last tag.
}

/// Tasks: `sources` tasks on one runtime, each expecting `per` tags.
fn tasks_run(sources: usize, per: u64, seed: u64) {
    let (wcpu, pcpu) = {
        let (a, b) = common::two_cpus();
        (b, a)
    };
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..sources).map(|_| chan()).unzip();
    let prod = std::thread::spawn(move || produce(txs, per, seed, pcpu));
    let st = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut rt = Runtime::new(TaskConfig {
            // Short, so the idle path (summary attached to noticed
            // sources) runs during the producer's sleeps.
            idle_after: Some(Duration::from_micros(200)),
            ..TaskConfig::default()
        })
        .unwrap();
        for (k, mut rx) in rxs.into_iter().enumerate() {
            rt.spawn(move |cx| {
                for expect in 0..per {
                    let m = cx.wait(&mut rx)?;
                    assert_eq!(m.tag, expect, "source {k}: lost, duplicated or reordered");
                }
                // Nothing more, then the close.
                assert!(
                    cx.wait(&mut rx).unwrap_err().is_closed(),
                    "source {k}: extra"
                );
                Ok(())
            })
            .unwrap();
        }
        let st = rt.run().unwrap();
        let errors = rt.take_errors();
        assert!(errors.is_empty(), "tasks failed: {errors:?}");
        st
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !st.is_finished() {
        assert!(
            Instant::now() < deadline,
            "tasks: not done in 60 s (a lost completion), seed {seed}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    prod.join().unwrap();
    let st = st.join().unwrap();
    eprintln!("stress tasks, {sources} sources x {per}: {st:?} (seed {seed})");
    assert!(st.notices > 0, "the notices were never used");
    assert_eq!(
        st.scan_found, st.late_notices,
        "the safety net found waits whose notice never came (seed {seed})"
    );
}

/// Like [`produce`], but in bursts on a steady schedule (every 300 µs,
/// most of them on time, some up to 100 µs early or late, a few pauses of
/// several periods): gaps a learned dispatcher finds predictable, so it
/// plans pre-wakes, with completions arriving early, caught and late.
fn produce_steady(txs: Vec<Sender>, per: u64, seed: u64, cpu: u32) {
    fastwake::cpu::pin(cpu).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut feed = Feed::new(txs, per);
    let period = Duration::from_micros(300);
    let mut due = Instant::now();
    while !feed.done() {
        due += period;
        let at = match rng.random_range(0..16) {
            0 => due - Duration::from_micros(rng.random_range(1..100)),
            1 => due + Duration::from_micros(rng.random_range(1..100)),
            2 => {
                due += period * rng.random_range(1..4);
                due
            }
            _ => due,
        };
        while Instant::now() < at {
            std::hint::spin_loop();
        }
        let burst = rng.random_range(1..=4usize);
        feed.burst(&mut rng, burst);
    }
}

/// Threads: `sources` threads in dispatch mode on one CPU with its
/// dispatcher, each expecting `per` tags.
fn threads_run(sources: usize, per: u64, seed: u64) {
    let s = threads_run_with(sources, per, seed, None, produce);
    assert!(s.notices > 0, "the notices were never used");
}

/// Threads with a dispatcher configured by `learn` (its learned idle
/// policy), fed by `producer`; returns its stats.
fn threads_run_with(
    sources: usize,
    per: u64,
    seed: u64,
    learn: Option<fastwake::adaptive::Config>,
    producer: fn(Vec<Sender>, u64, u64, u32),
) -> fastwake::dispatch::DispatchStats {
    let (pcpu, wcpu) = common::two_cpus();
    let mut cfg = Config::new(wcpu);
    cfg.learn_idle = learn;
    let d = Dispatcher::start(cfg).expect("start dispatcher");
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..sources).map(|_| chan()).unzip();
    let start = std::sync::Arc::new(std::sync::Barrier::new(sources + 1));
    let waiters: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(k, mut rx)| {
            let start = start.clone();
            std::thread::spawn(move || {
                fastwake::cpu::pin(wcpu).unwrap();
                let mut w = Waiter::new(WaitMode::Dispatch);
                start.wait();
                for expect in 0..per {
                    let m = w
                        .wait_timeout(&mut rx, Duration::from_secs(20))
                        .unwrap_or_else(|e| panic!("source {k}: {e} (seed {seed})"))
                        .unwrap_or_else(|| panic!("source {k}: tag {expect} lost (seed {seed})"));
                    assert_eq!(
                        m.tag, expect,
                        "source {k}: lost, duplicated or reordered (seed {seed})"
                    );
                }
                assert!(rx.try_take().is_ok_and(|m| m.is_none()) || !rx.ready());
                w.stats()
            })
        })
        .collect();
    start.wait();
    producer(txs, per, seed, pcpu);
    let mut handoffs = 0;
    for w in waiters {
        handoffs += w.join().unwrap().handoffs;
    }
    let s = d.stop();
    eprintln!(
        "stress threads, {sources} sources x {per}: {handoffs} hand-offs; dispatcher {s:?} (seed {seed})"
    );
    // Every notice has been popped (`stop` drains the ring), by the
    // dispatcher or by a relaying thread: the ring counts both.
    assert_eq!(
        s.scan_found, s.late_notices,
        "the safety net found waits whose notice never came (seed {seed})"
    );
    s
}

#[test]
fn many_sources_random_ready_patterns_tasks() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("dispatch stress");
    tasks_run(16, 5_000, seed);
    tasks_run(300, 600, seed ^ 1);
}

#[test]
fn many_sources_random_ready_patterns_threads() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("dispatch stress");
    threads_run(64, 600, seed);
}

/// The dispatcher's pre-wake under stress: a learned idle policy on a
/// steady schedule with early, late and paused bursts over 8 threads
/// plans pre-wakes whose completions come early, in the spin and late;
/// every completion still arrives once, in order.
#[test]
fn steady_bursts_with_prewakes_threads() {
    let _g = common::spin_lock();
    let seed = common::stress_seed("dispatch stress");
    let s = threads_run_with(
        8,
        400,
        seed,
        Some(fastwake::adaptive::Config::default()),
        produce_steady,
    );
    assert!(s.prewakes > 0, "no pre-wake planned (seed {seed}): {s:?}");
    assert!(
        s.prewake_caught > 0,
        "no pre-wake caught its completion (seed {seed}): {s:?}"
    );
}
