//! Tasks on a per-core runtime: delivery, fairness, failures, idle policy.
//!
//! The runtime spins: tests take `SPIN`, and every run is bounded in time
//! by a watchdog that fails the test instead of hanging it.

mod dispatch_common;

use dispatch_common::{chan, produce_random};
use fastwake::Fail;
use fastwake::dispatch::{Runtime, State, TaskConfig};
use fastwake::source::Source;
use fastwake::source::channel::{self, Receiver};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

static SPIN: Mutex<()> = Mutex::new(());

fn spin_lock() -> std::sync::MutexGuard<'static, ()> {
    SPIN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `f` on a thread; fail if it takes longer than `limit`.
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}"))
}

/// Many tasks (below and above the summary threshold), random arrival
/// order: every task gets every completion once, in order.
#[test]
fn many_tasks_no_loss_no_starvation() {
    let _g = spin_lock();
    for tasks in [8usize, 100] {
        const N: u64 = 300;
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..tasks).map(|_| chan()).unzip();
        let p = std::thread::spawn(move || produce_random(txs, N));
        let stats = bounded(Duration::from_secs(60), move || {
            let mut rt = Runtime::new(TaskConfig::default()).unwrap();
            let counts = Rc::new(RefCell::new(vec![0u64; tasks]));
            for (i, mut rx) in rxs.into_iter().enumerate() {
                let counts = counts.clone();
                rt.spawn(move |cx| {
                    for expect in 0..N {
                        let m = cx.wait(&mut rx)?;
                        if m.tag != expect {
                            return Err(Fail::new(
                                libc::EPROTO,
                                format!("task {i}: tag {} where {expect} expected", m.tag),
                            ));
                        }
                        counts.borrow_mut()[i] += 1;
                    }
                    Ok(())
                })
                .unwrap();
            }
            let s = rt.run().unwrap();
            let errs = rt.take_errors();
            assert!(errs.is_empty(), "task errors: {errs:?}");
            assert!(counts.borrow().iter().all(|&c| c == N), "a task starved");
            s
        });
        p.join().unwrap();
        eprintln!("{tasks} tasks: {stats:?}");
        // Completions that arrive together are taken in one resume.
        assert!(stats.handoffs > 0, "no hand-offs: {stats:?}");
    }
}

/// A failing or panicking task does not stop the others; a closed source
/// reaches its task as an error.
#[test]
fn failures_stay_in_their_task() {
    let _g = spin_lock();
    let (mut tx_ok, mut rx_ok) = chan();
    let (tx_closed, mut rx_closed) = chan();
    let p = std::thread::spawn(move || {
        drop(tx_closed);
        for i in 0..50 {
            tx_ok.send(i, b"x").unwrap();
        }
    });
    let r = bounded(Duration::from_secs(20), move || {
        let mut rt = Runtime::new(TaskConfig::default()).unwrap();
        rt.spawn(|_| -> fastwake::Result<()> { panic!("task panics on purpose") })
            .unwrap();
        rt.spawn(|_| Err(Fail::invalid("task fails on purpose")))
            .unwrap();
        rt.spawn(move |cx| cx.wait(&mut rx_closed).map(|_| ()))
            .unwrap();
        rt.spawn(move |cx| {
            for i in 0..50 {
                assert_eq!(cx.wait(&mut rx_ok)?.tag, i);
            }
            Ok(())
        })
        .unwrap();
        let s = rt.run().unwrap();
        (s, rt.take_errors())
    });
    p.join().unwrap();
    let (s, errs) = r;
    eprintln!("{s:?} {errs:?}");
    assert_eq!(s.failed, 3);
    assert!(errs.iter().any(|(_, e)| e.is_closed()));
}

/// A source without a peek handle still works (its task polls itself).
struct NoPeek(Receiver);

impl Source for NoPeek {
    type Completion = channel::Msg;
    fn name(&self) -> &'static str {
        "nopeek"
    }
    fn ready(&self) -> bool {
        self.0.ready()
    }
    fn try_take(&mut self) -> fastwake::Result<Option<channel::Msg>> {
        self.0.try_take()
    }
    fn arm(&mut self) -> fastwake::Result<()> {
        self.0.arm()
    }
    fn sleep(
        &mut self,
        _p: fastwake::source::Rechecked,
        _t: Option<Duration>,
    ) -> fastwake::Result<()> {
        unreachable!("a task never sleeps on its source")
    }
}

#[test]
fn source_without_peek_handle_is_polled() {
    let _g = spin_lock();
    let (tx, rx) = chan();
    let p = std::thread::spawn(move || produce_random(vec![tx], 200));
    let s = bounded(Duration::from_secs(20), move || {
        let mut rt = Runtime::new(TaskConfig::default()).unwrap();
        let mut src = NoPeek(rx);
        rt.spawn(move |cx| {
            for i in 0..200 {
                assert_eq!(cx.wait(&mut src)?.tag, i);
            }
            Ok(())
        })
        .unwrap();
        let s = rt.run().unwrap();
        assert!(rt.take_errors().is_empty());
        s
    });
    p.join().unwrap();
    assert!(s.resumes > 0);
}

/// Idle past the threshold, the runtime sleeps (≈0 CPU) and the first
/// completion wakes it; both below and above the summary threshold.
#[test]
fn idle_runtime_sleeps_and_wakes() {
    let _g = spin_lock();
    for tasks in [4usize, 40] {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..tasks).map(|_| chan()).unzip();
        let (cpu_tx, cpu_rx) = mpsc::channel();
        let h = std::thread::spawn(move || {
            let mut rt = Runtime::new(TaskConfig {
                idle_after: Some(Duration::from_millis(2)),
                ..TaskConfig::default()
            })
            .unwrap();
            for mut rx in rxs {
                rt.spawn(move |cx| {
                    cx.wait(&mut rx)?;
                    Ok(())
                })
                .unwrap();
            }
            let _ = cpu_tx.send((thread_clock(), rt.state()));
            let s = rt.run().unwrap();
            assert!(rt.take_errors().is_empty());
            s
        });
        let (clock, state) = cpu_rx.recv().unwrap();
        let t0 = Instant::now();
        while state.get() != State::Sleeping {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "runtime never went idle"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let c0 = clock_time(clock);
        std::thread::sleep(Duration::from_millis(200));
        let used = clock_time(clock) - c0;
        eprintln!("{tasks} tasks: idle runtime used {used:?} CPU in 200 ms");
        assert!(
            used < Duration::from_millis(20),
            "idle runtime burned {used:?} of 200 ms"
        );
        let t0 = Instant::now();
        for mut tx in txs {
            tx.send(1, b"x").unwrap();
        }
        let s = bounded(Duration::from_secs(10), move || h.join().unwrap());
        eprintln!("woke and finished in {:?}: {s:?}", t0.elapsed());
        assert!(s.idle_sleeps >= 1);
    }
}

fn thread_clock() -> libc::clockid_t {
    let mut id: libc::clockid_t = 0;
    // SAFETY: valid out-pointer, pthread_self is the calling thread.
    let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    assert_eq!(r, 0);
    id
}

fn clock_time(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { libc::clock_gettime(id, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
