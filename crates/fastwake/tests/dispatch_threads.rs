//! Kernel threads waiting in dispatch mode: delivery, fairness, idle policy,
//! and survival of exiting threads and dying dispatchers.
//!
//! The dispatcher spins: tests here take `SPIN` so two never run at once,
//! and every wait is bounded in time.

mod dispatch_common;

use dispatch_common::{chan, produce_random};
use fastwake::dispatch::{Config, Dispatcher, State};
use fastwake::source::channel::{Receiver, Sender};
use fastwake::{WaitMode, Waiter};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

static SPIN: Mutex<()> = Mutex::new(());

fn spin_lock() -> std::sync::MutexGuard<'static, ()> {
    SPIN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CPU the waiters and their dispatcher share, and the producer's.
fn cpus() -> (u32, u32) {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
    if n >= 2 { (1, 0) } else { (0, 0) }
}

/// [`cpus`], or `None` (saying SKIPPED for `test`) on a single CPU.
fn two_cpus(test: &str) -> Option<(u32, u32)> {
    let (wcpu, pcpu) = cpus();
    if wcpu == pcpu {
        eprintln!("SKIPPED {test}: needs 2 CPUs");
        return None;
    }
    Some((wcpu, pcpu))
}

const WAIT: Duration = Duration::from_secs(10);

/// A waiter thread: takes `n` completions in order on `rx`, returns its
/// waiter (for stats). Fails loudly on a gap, duplicate or timeout.
fn consumer(
    cpu: u32,
    mut rx: Receiver,
    n: u64,
    start: Arc<Barrier>,
) -> std::thread::JoinHandle<fastwake::wait::WaitStats> {
    std::thread::spawn(move || {
        fastwake::cpu::pin(cpu).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        start.wait();
        for expect in 0..n {
            let m = w
                .wait_timeout(&mut rx, WAIT)
                .unwrap()
                .unwrap_or_else(|| panic!("completion {expect} not delivered within {WAIT:?}"));
            assert_eq!(m.tag, expect, "lost or duplicated completion");
        }
        w.stats()
    })
}

/// Start `threads` consumers of `n` completions each on `cpu`; returns
/// their senders and handles.
fn consumers(
    cpu: u32,
    threads: usize,
    n: u64,
    start: &Arc<Barrier>,
) -> (
    Vec<Sender>,
    Vec<std::thread::JoinHandle<fastwake::wait::WaitStats>>,
) {
    let mut txs = Vec::new();
    let mut hs = Vec::new();
    for _ in 0..threads {
        let (tx, rx) = chan();
        txs.push(tx);
        hs.push(consumer(cpu, rx, n, start.clone()));
    }
    (txs, hs)
}

fn produce(cpu: u32, txs: Vec<Sender>, n: u64, start: Arc<Barrier>) {
    fastwake::cpu::pin(cpu).unwrap();
    start.wait();
    produce_random(txs, n);
}

/// Random arrival order over many threads, below and above the point where
/// the dispatcher switches to the readiness summary (32 sources).
#[test]
fn many_threads_no_loss_no_starvation() {
    let _g = spin_lock();
    for threads in [24, 48] {
        stress(threads, 300);
    }
}

fn stress(threads: usize, n: u64) {
    let (wcpu, pcpu) = cpus();
    let mut cfg = Config::new(wcpu);
    cfg.idle_after = Some(Duration::from_millis(1));
    let d = Dispatcher::start(cfg).expect("start dispatcher");
    let start = Arc::new(Barrier::new(threads + 1));
    let (txs, hs) = consumers(wcpu, threads, n, &start);
    let t0 = Instant::now();
    produce(pcpu, txs, n, start);
    let mut handoffs = 0;
    for h in hs {
        // Each join proves that thread got all N: no starvation.
        let s = h.join().expect("consumer failed");
        assert_eq!(s.completions, n);
        handoffs += s.handoffs;
    }
    eprintln!(
        "{threads} threads × {n}: {:?}, hand-offs {handoffs}, dispatcher {:?}",
        t0.elapsed(),
        d.stats()
    );
    assert!(handoffs > 0, "no wait was served by the dispatcher");
}

#[test]
fn exiting_thread_leaves_others_working() {
    let _g = spin_lock();
    let (wcpu, pcpu) = cpus();
    let d = Dispatcher::start(Config::new(wcpu)).expect("start dispatcher");
    // A thread registers, waits once, and exits while registered (its
    // waiter is forgotten, so it never unregisters), another exits
    // normally (unregisters on drop).
    for leak in [true, false] {
        let (mut tx, mut rx) = chan();
        let h = std::thread::spawn(move || {
            fastwake::cpu::pin(wcpu).unwrap();
            let mut w = Waiter::new(WaitMode::Dispatch);
            w.wait_timeout(&mut rx, WAIT)
                .unwrap()
                .expect("first completion");
            if leak {
                std::mem::forget(w);
            }
        });
        std::thread::sleep(Duration::from_millis(5));
        tx.send(0, b"x").unwrap();
        h.join().unwrap();
        drop(tx);
    }
    let start = Arc::new(Barrier::new(5));
    let (txs, hs) = consumers(wcpu, 4, 200, &start);
    produce(pcpu, txs, 200, start);
    for h in hs {
        assert_eq!(h.join().unwrap().completions, 200);
    }
    assert_ne!(d.state(), State::Dead);
}

/// Waiters of a dispatcher that `kill` ends mid-stream fall back to
/// interrupt mode and finish; then a new dispatcher serves the CPU again.
fn waiters_survive_a_dying_dispatcher(what: &str, kill: impl FnOnce(Dispatcher)) {
    let (wcpu, pcpu) = cpus();
    let d = Dispatcher::start(Config::new(wcpu)).expect("start dispatcher");
    const THREADS: usize = 8;
    const N: u64 = 400;
    let start = Arc::new(Barrier::new(THREADS + 2));
    let (txs, hs) = consumers(wcpu, THREADS, N, &start);
    let s2 = start.clone();
    let p = std::thread::spawn(move || produce(pcpu, txs, N, s2));
    start.wait();
    std::thread::sleep(Duration::from_millis(3));
    kill(d);
    p.join().unwrap();
    let mut fallbacks = 0;
    for h in hs {
        let s = h
            .join()
            .expect("a waiter hung or failed after the dispatcher died");
        assert_eq!(s.completions, N);
        fallbacks += s.dispatch_fallbacks;
    }
    eprintln!("{what}: waits after death in interrupt mode: {fallbacks}");
    let d = Dispatcher::start(Config::new(wcpu)).expect("restart dispatcher");
    assert_ne!(d.state(), State::Dead);
}

/// A dispatcher dropped mid-stream.
#[test]
fn dropped_dispatcher_falls_back() {
    let _g = spin_lock();
    waiters_survive_a_dying_dispatcher("dropped", drop);
}

/// A dispatcher thread that panics mid-stream.
#[cfg(feature = "fault-injection")]
#[test]
fn crashed_dispatcher_falls_back() {
    let _g = spin_lock();
    waiters_survive_a_dying_dispatcher("crashed", |mut d| {
        d.inject_crash();
        d.join();
        assert_eq!(d.state(), State::Dead);
    });
}

#[cfg(not(feature = "fault-injection"))]
#[test]
fn crashed_dispatcher_falls_back() {
    eprintln!("SKIPPED crashed_dispatcher_falls_back: needs --features fastwake/fault-injection");
}

/// From `cpu`, send completion 0 to a waiting `consumer`; its stats and
/// how long it took to get it.
fn send_one_after(
    cpu: u32,
    tx: &mut Sender,
    consumer: std::thread::JoinHandle<fastwake::wait::WaitStats>,
) -> (fastwake::wait::WaitStats, Duration) {
    fastwake::cpu::pin(cpu).unwrap();
    let t0 = Instant::now();
    tx.send(0, b"x").unwrap();
    let s = consumer.join().expect("consumer failed");
    (s, t0.elapsed())
}

/// A dispatcher on `cpu` that never goes idle.
fn never_idle(cpu: u32) -> Dispatcher {
    let mut cfg = Config::new(cpu);
    cfg.idle_after = None;
    Dispatcher::start(cfg).expect("start dispatcher")
}

/// A dispatcher on `cpu` that sleeps after 2 ms without work.
fn idle_after_2ms(cpu: u32) -> Dispatcher {
    let mut cfg = Config::new(cpu);
    cfg.idle_after = Some(Duration::from_millis(2));
    Dispatcher::start(cfg).expect("start dispatcher")
}

#[test]
fn idle_dispatcher_sleeps_and_wakes() {
    let _g = spin_lock();
    let (wcpu, pcpu) = cpus();
    let d = idle_after_2ms(wcpu);
    let (mut tx, rx) = chan();
    let start = Arc::new(Barrier::new(2));
    let h = consumer(wcpu, rx, 3, start.clone());
    start.wait();
    fastwake::cpu::pin(pcpu).unwrap();
    tx.send(0, b"x").unwrap();
    // Idle past the threshold: the dispatcher must go to sleep and stop
    // using CPU while the consumer waits (in interrupt mode).
    let t0 = Instant::now();
    while d.state() != State::Sleeping {
        assert!(t0.elapsed() < WAIT, "dispatcher never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
    let c0 = d.cpu_time().expect("dispatcher clock");
    std::thread::sleep(Duration::from_millis(200));
    let used = d.cpu_time().expect("dispatcher clock") - c0;
    eprintln!("idle dispatcher used {used:?} CPU in 200 ms");
    assert!(
        used < Duration::from_millis(20),
        "idle dispatcher burned {used:?} of 200 ms"
    );
    // First event: the consumer gets it (interrupt mode) and wakes the
    // dispatcher, which polls again.
    tx.send(1, b"x").unwrap();
    tx.send(2, b"x").unwrap();
    let s = h.join().unwrap();
    assert_eq!(s.completions, 3);
    assert!(
        s.dispatch_paused >= 1,
        "the wait was not handed back: {s:?}"
    );
    let t0 = Instant::now();
    while d.state() != State::Polling && d.stats().idle_sleeps < 2 {
        assert!(t0.elapsed() < WAIT, "dispatcher never woke");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn no_dispatcher_means_interrupt_mode() {
    let _g = spin_lock();
    // Serve a CPU nobody runs on: the waiter's CPU has no dispatcher.
    let (mut tx, mut rx) = chan();
    let h = std::thread::spawn(move || {
        let mut w = Waiter::new(WaitMode::Dispatch);
        let m = w.wait_timeout(&mut rx, WAIT).unwrap().unwrap();
        (m.tag, w.stats())
    });
    std::thread::sleep(Duration::from_millis(5));
    tx.send(7, b"x").unwrap();
    let (tag, s) = h.join().unwrap();
    assert_eq!(tag, 7);
    // (On a busy machine the thread may start after the send and find the
    // completion without waiting at all.)
    assert!(s.dispatch_fallbacks + s.without_sleep >= 1, "{s:?}");
    assert_eq!(s.handoffs, 0);
}

#[test]
fn second_dispatcher_for_a_cpu_is_refused() {
    let _g = spin_lock();
    let (wcpu, _) = cpus();
    let _d = Dispatcher::start(Config::new(wcpu)).unwrap();
    let e = Dispatcher::start(Config::new(wcpu)).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    let e = Dispatcher::start(Config::new(4096)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

/// One waiter, a new source each time (typically at the same stack
/// address): every wait must be served, none may watch a stale source.
#[test]
fn new_source_each_wait() {
    let _g = spin_lock();
    let (wcpu, pcpu) = cpus();
    let _d = Dispatcher::start(Config::new(wcpu)).expect("start dispatcher");
    let (to_prod, from_waiter) = std::sync::mpsc::channel::<Sender>();
    let p = std::thread::spawn(move || {
        fastwake::cpu::pin(pcpu).unwrap();
        for (k, mut tx) in from_waiter.into_iter().enumerate() {
            // Below the 2 ms idle threshold, so the dispatcher serves it.
            std::thread::sleep(Duration::from_micros(300));
            tx.send(k as u64, b"x").unwrap();
        }
    });
    let h = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        for k in 0..20u64 {
            let (tx, mut rx) = chan();
            to_prod.send(tx).unwrap();
            let m = w
                .wait_timeout(&mut rx, WAIT)
                .unwrap()
                .unwrap_or_else(|| panic!("wait {k} on a fresh source was never served"));
            assert_eq!(m.tag, k);
        }
        w.stats()
    });
    let s = h.join().unwrap();
    p.join().unwrap();
    // (A machine busy enough to starve the dispatcher sends waits to
    // interrupt mode instead; they are still served.)
    assert!(
        s.handoffs + s.dispatch_fallbacks + s.dispatch_paused > 0,
        "{s:?}"
    );
}

/// A busy normal-priority thread on a CPU (which a `SCHED_IDLE`
/// dispatcher there yields to), for at most [`WAIT`].
struct Hog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Hog {
    fn start(cpu: u32) -> Hog {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            fastwake::cpu::pin(cpu).unwrap();
            let t0 = Instant::now();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) && t0.elapsed() < WAIT {
                std::hint::spin_loop();
            }
        });
        Hog { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// One wait on `wcpu` that announces and sleeps while the dispatcher is
/// healthy, after which a busy thread takes the dispatcher's core; the
/// completion comes from `pcpu` 20 ms later. The consumer's stats and how
/// long the completion took to reach it.
fn starved_wait(wcpu: u32, pcpu: u32) -> (fastwake::wait::WaitStats, Duration) {
    let (mut tx, rx) = chan();
    let start = Arc::new(Barrier::new(2));
    let h = consumer(wcpu, rx, 1, start.clone());
    start.wait();
    // Let the consumer announce and sleep while the dispatcher is healthy.
    std::thread::sleep(Duration::from_millis(20));
    let hog = Hog::start(wcpu);
    std::thread::sleep(Duration::from_millis(20));
    let (s, took) = send_one_after(pcpu, &mut tx, h);
    hog.stop();
    (s, took)
}

/// A dispatcher starved of CPU (a busy normal thread on its core, which
/// SCHED_IDLE yields to) must not strand a thread that went to sleep
/// trusting it: the watchdog serves it.
#[test]
fn watchdog_rescues_a_starved_dispatcher() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("watchdog_rescues_a_starved_dispatcher") else {
        return;
    };
    let d = never_idle(wcpu);
    let (s, took) = starved_wait(wcpu, pcpu);
    eprintln!(
        "served after {took:?} with the dispatcher starved: {:?}",
        d.stats()
    );
    assert_eq!(s.completions, 1);
    // Without the watchdog a SCHED_IDLE dispatcher next to a spinning
    // normal thread gets a few ms of CPU per second at best.
    assert!(took < Duration::from_millis(250), "stranded for {took:?}");
}

/// Context switches so far of this process's threads named `name`
/// (`/proc/self/task/*/comm`): (voluntary, involuntary). A helper thread
/// that wakes up and goes back to sleep counts one voluntary switch.
fn switches(name: &str) -> (u64, u64) {
    let mut total = (0, 0);
    for e in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = e.expect("task entry").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        for line in status.lines() {
            let n = |p: &str| {
                line.strip_prefix(p)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(v) = n("voluntary_ctxt_switches:") {
                total.0 += v;
            } else if let Some(v) = n("nonvoluntary_ctxt_switches:") {
                total.1 += v;
            }
        }
    }
    total
}

/// Spin on this thread for `d`.
fn compute(d: Duration) {
    let t0 = Instant::now();
    let mut x = 0u64;
    while t0.elapsed() < d {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_add(i * i));
        }
    }
}

/// Issue 15: a program that computes between its waits must not be
/// disturbed by the dispatcher's helper threads. After one dispatched
/// wait, the waiter computes on the dispatcher's own CPU (the dispatcher,
/// `SCHED_IDLE`, is starved there and stays POLLING until it gets a
/// turn). Measured over 2.5 s, after a 100 ms settle: the watchdog must
/// not wake (the old one woke every ms while the dispatcher polled,
/// waiting or not) and the dispatcher at most once (its one turn, in
/// which it goes to its idle sleep; the old one also woke every second
/// from that sleep). Then a wait must still be served.
#[test]
fn helpers_sleep_while_nobody_waits() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("helpers_sleep_while_nobody_waits") else {
        return;
    };
    let d = Dispatcher::start(Config::new(wcpu)).expect("start dispatcher");
    let (mut tx, mut rx) = chan();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        fastwake::cpu::pin(wcpu).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        let names = (format!("fw-dispatch{wcpu}"), format!("fw-watchdog{wcpu}"));
        let mut got = Vec::new();
        let mut helpers = Vec::new();
        for round in 0..2u64 {
            ready_tx.send(()).unwrap();
            let m = w.wait_timeout(&mut rx, WAIT).unwrap().expect("served");
            got.push(m.tag);
            compute(Duration::from_millis(100));
            let (d0, w0) = (switches(&names.0), switches(&names.1));
            compute(Duration::from_millis(2500));
            let (d1, w1) = (switches(&names.0), switches(&names.1));
            helpers.push((round, d1.0 - d0.0, d1.1 - d0.1, w1.0 - w0.0, w1.1 - w0.1));
        }
        (got, helpers, w.stats())
    });
    fastwake::cpu::pin(pcpu).unwrap();
    for k in 0..2u64 {
        ready_rx.recv().unwrap();
        // The waiter announces and sleeps trusting the dispatcher.
        std::thread::sleep(Duration::from_millis(1));
        tx.send(k, b"x").unwrap();
    }
    let (got, helpers, s) = h.join().expect("waiter failed");
    eprintln!(
        "helper switches over 2.5 s of computing (round, dispatcher vol/invol, watchdog vol/invol): {helpers:?}; {s:?}; {:?}",
        d.stats()
    );
    assert_eq!(got, vec![0, 1], "lost or reordered completion");
    for (round, dv, _di, wv, wi) in helpers {
        assert!(
            wv + wi == 0,
            "round {round}: the watchdog woke {} times while nobody waited",
            wv + wi
        );
        assert!(
            dv <= 1,
            "round {round}: the dispatcher woke {dv} times while nobody waited"
        );
    }
}

/// The watchdog parked (nobody waited for a while) must be woken by the
/// next wait itself: that wait trusts the dispatcher, which may then be
/// starved by a busy thread on its core, and only the watchdog can rescue
/// it before the dispatcher's next turn (hundreds of ms for a
/// `SCHED_IDLE` thread next to a spinning one).
#[test]
fn parked_watchdog_rescues_the_next_wait() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("parked_watchdog_rescues_the_next_wait") else {
        return;
    };
    let d = never_idle(wcpu);
    // Nobody waits: the watchdog parks within a few ms.
    std::thread::sleep(Duration::from_millis(50));
    let name = format!("fw-watchdog{wcpu}");
    let w0 = switches(&name);
    std::thread::sleep(Duration::from_millis(100));
    let parked = switches(&name) == w0;
    let (s, took) = starved_wait(wcpu, pcpu);
    eprintln!(
        "parked={parked}; served after {took:?}: {s:?}; {:?}",
        d.stats()
    );
    assert!(parked, "the watchdog kept waking while nobody waited");
    assert_eq!(s.completions, 1);
    assert!(took < Duration::from_millis(250), "stranded for {took:?}");
}

/// A wait that wakes an idle (sleeping) dispatcher which then does not
/// get the CPU (a SCHED_IDLE thread next to a busy one; here made
/// deterministic with a stall after each wake-up): the waiter announces
/// and sleeps trusting the dispatcher it just kicked, so the watchdog,
/// asleep while the dispatcher slept, must be woken by the kick itself.
#[cfg(feature = "fault-injection")]
#[test]
fn kicking_a_stalled_sleeping_dispatcher_wakes_the_watchdog() {
    let _g = spin_lock();
    let (wcpu, pcpu) = cpus();
    let d = idle_after_2ms(wcpu);
    d.inject_wake_stall(400);
    let t0 = Instant::now();
    while d.state() != State::Sleeping {
        assert!(t0.elapsed() < WAIT, "dispatcher never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut tx, rx) = chan();
    let start = Arc::new(Barrier::new(2));
    let h = consumer(wcpu, rx, 1, start.clone());
    start.wait();
    // The consumer kicks the sleeping dispatcher and goes to sleep.
    std::thread::sleep(Duration::from_millis(20));
    let (s, took) = send_one_after(pcpu, &mut tx, h);
    eprintln!("kicked wait served after {took:?}: {s:?}; {:?}", d.stats());
    assert_eq!(s.completions, 1);
    assert!(
        s.dispatch_fallbacks == 0 && s.dispatch_paused == 0,
        "the wait did not go to sleep trusting the dispatcher: {s:?}"
    );
    // The watchdog looks every millisecond; the stall is 400 ms.
    assert!(took < Duration::from_millis(100), "stranded for {took:?}");
}

#[cfg(not(feature = "fault-injection"))]
#[test]
fn kicking_a_stalled_sleeping_dispatcher_wakes_the_watchdog() {
    eprintln!(
        "SKIPPED kicking_a_stalled_sleeping_dispatcher_wakes_the_watchdog: needs --features fastwake/fault-injection"
    );
}

/// A dispatcher that learns its idle threshold (`learn_idle`): completions
/// 5 ms apart (200/s) are not worth polling for, so it learns to sleep
/// soon after each hand-off and uses a fraction of the CPU a fixed 2 ms
/// threshold does; completions 20 µs apart are, so it keeps polling
/// through them.
#[test]
fn learned_idle_threshold_follows_the_gaps() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("learned_idle_threshold_follows_the_gaps") else {
        return;
    };
    // Returns (dispatcher CPU over the stream, its stats at the end).
    let run = |learn: bool, gap: Duration, n: u64| {
        let mut cfg = Config::new(wcpu);
        if learn {
            cfg.learn_idle = Some(fastwake::adaptive::Config::default());
        }
        let d = Dispatcher::start(cfg).expect("start dispatcher");
        let (mut tx, rx) = chan();
        let start = Arc::new(Barrier::new(2));
        let h = consumer(wcpu, rx, n, start.clone());
        start.wait();
        fastwake::cpu::pin(pcpu).unwrap();
        let c0 = d.cpu_time().expect("dispatcher clock");
        for i in 0..n {
            let t = Instant::now();
            while t.elapsed() < gap {
                std::hint::spin_loop();
            }
            tx.send(i, b"x").unwrap();
        }
        let s = h.join().expect("consumer failed");
        assert_eq!(s.completions, n);
        (d.cpu_time().expect("dispatcher clock") - c0, d.stats())
    };
    let slow = Duration::from_millis(5);
    let (fixed_cpu, _) = run(false, slow, 60);
    let (learned_cpu, st) = run(true, slow, 60);
    eprintln!("200/s: fixed 2 ms threshold {fixed_cpu:?}, learned {learned_cpu:?}; {st:?}");
    // Steady gaps are pre-woken: the dispatcher sleeps right after each
    // hand-off (threshold 0) and, once its timer has fired, polls until
    // the plan's spin end, which is what `idle_after` reads in that
    // stretch (~5 ms after the last hand-off). Stats read that late (a
    // test thread held up; once in CI) see the spin end, not a learned
    // threshold: with pre-wakes, the CPU check below is what tells.
    assert!(
        st.idle_after
            .is_some_and(|t| t < Duration::from_micros(500))
            || st.prewakes > 0,
        "learned threshold for 5 ms gaps: {:?}, no pre-wakes: {st:?}",
        st.idle_after
    );
    assert!(
        learned_cpu * 2 < fixed_cpu,
        "learned idle used {learned_cpu:?}, fixed {fixed_cpu:?}"
    );
    let n = 3_000;
    let (_, st) = run(true, Duration::from_micros(20), n);
    eprintln!("50k/s: learned {st:?}");
    // It polls through the gaps (the threshold is about the 90th
    // percentile of them) and pauses its waiters rarely.
    assert!(
        st.idle_after
            .is_some_and(|t| t >= Duration::from_micros(10)),
        "learned threshold for 20 µs gaps: {:?}",
        st.idle_after
    );
    assert!(st.paused < n / 10, "paused {} of {n} waits", st.paused);
}

/// Echo servers on `wcpu` in dispatch mode; a client on `pcpu` sends `n`
/// requests round robin over them, one outstanding, and checks each reply.
/// Returns the dispatcher's counters.
fn relay_chain(
    relay: Option<Duration>,
    servers: usize,
    n: u64,
) -> fastwake::dispatch::DispatchStats {
    let (wcpu, pcpu) = cpus();
    let mut cfg = Config::new(wcpu);
    cfg.relay = relay;
    cfg.idle_after = None;
    let d = Dispatcher::start(cfg).expect("start dispatcher");
    let mut clients = Vec::new();
    let mut hs = Vec::new();
    for _ in 0..servers {
        let (to_server, mut from_client) = chan();
        let (mut to_client, from_server) = chan();
        hs.push(std::thread::spawn(move || {
            fastwake::cpu::pin(wcpu).unwrap();
            let mut w = Waiter::new(WaitMode::Dispatch);
            loop {
                match w.wait_timeout(&mut from_client, WAIT) {
                    Ok(Some(m)) => to_client.send(m.tag, &[1u8; 8]).unwrap(),
                    Ok(None) => panic!("request not delivered within {WAIT:?}"),
                    Err(e) if e.is_closed() => return w.stats(),
                    Err(e) => panic!("{e}"),
                }
            }
        }));
        clients.push((to_server, from_server));
    }
    fastwake::cpu::pin(pcpu).unwrap();
    let deadline = Instant::now() + WAIT;
    for k in 0..n {
        let (tx, rx) = &mut clients[(k % servers as u64) as usize];
        tx.send(k, &[0u8; 8]).unwrap();
        loop {
            if let Some(m) = fastwake::Source::try_take(rx).unwrap() {
                assert_eq!(m.tag, k, "reply for the wrong request");
                break;
            }
            assert!(Instant::now() < deadline, "reply {k} never came");
            std::hint::spin_loop();
        }
    }
    drop(clients);
    let stats: Vec<_> = hs
        .into_iter()
        .map(|h| h.join().expect("server failed"))
        .collect();
    let served: u64 = stats.iter().map(|s| s.completions).sum();
    assert_eq!(served, n, "lost or duplicated requests");
    d.stats()
}

/// A chain of requests to different threads of one core: the thread that
/// just answered relays the next request to its owner. The budget is
/// 200× the default so that a slow CI machine rarely makes a relay miss,
/// and the bound is loose (a tenth of the requests); loss and duplication
/// are checked per reply. (A budget of many ms would hurt instead: a woken
/// thread that does not preempt a spinning relayer waits out its budget.)
#[test]
fn relay_hands_off_between_threads() {
    let _g = spin_lock();
    let n = 3000;
    let st = relay_chain(Some(Duration::from_millis(1)), 6, n);
    eprintln!("relay chain: {st:?}");
    assert!(
        st.relayed >= n / 10,
        "relays should serve most requests of a chain, got {st:?}"
    );
}

/// With the relay off every hand-off is the dispatcher's.
#[test]
fn relay_off_means_dispatcher_only() {
    let _g = spin_lock();
    let st = relay_chain(None, 6, 1000);
    assert_eq!(st.relayed, 0);
    assert!(st.handoffs > 0, "{st:?}");
}

extern "C" fn on_usr2(_: libc::c_int) {}

/// SIGUSR2 handled by a no-op, without SA_RESTART: it interrupts sleeps.
fn install_usr2() {
    // SAFETY: a no-op handler, installed without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr2 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
}

/// A dispatch-mode wait asleep on its slot, hit by signals every 10 ms
/// from 50 ms on: returns (errno of the result or 0, elapsed, stats).
fn signalled_wait(interruptible: bool) -> (i32, Duration, fastwake::wait::WaitStats) {
    install_usr2();
    let (cpu, _) = cpus();
    let (_tx, mut rx) = chan();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let h = std::thread::spawn(move || {
        fastwake::cpu::pin(cpu).unwrap();
        // SAFETY: pthread_self has no preconditions.
        tid_tx
            .send(unsafe { libc::pthread_self() } as usize)
            .unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        w.set_interruptible(interruptible);
        let t = Instant::now();
        let r = w.wait_timeout(&mut rx, Duration::from_millis(400));
        done2.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = match r {
            Err(e) => e.errno(),
            Ok(_) => 0,
        };
        (e, t.elapsed(), w.stats())
    });
    let tid = tid_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: the waiting thread is alive until `done`.
        unsafe { libc::pthread_kill(tid as libc::pthread_t, libc::SIGUSR2) };
        std::thread::sleep(Duration::from_millis(10));
    }
    h.join().unwrap()
}

/// `Waiter::set_interruptible`: a signal ends a dispatch-mode sleep with
/// EINTR (what the preload shim's epoll_wait needs); without it the wait
/// sleeps on until its deadline.
#[test]
fn interruptible_dispatch_wait_ends_with_eintr() {
    let _g = spin_lock();
    if cpus().0 == cpus().1 {
        eprintln!("SKIPPED interruptible_dispatch_wait_ends_with_eintr: needs 2 CPUs");
        return;
    }
    // Never idle: a paused dispatcher hands its waiters to interrupt mode,
    // where the channel's own sleep decides what a signal does.
    let mut cfg = Config::new(cpus().0);
    cfg.idle_after = None;
    let d = Dispatcher::start(cfg).unwrap();
    // What is tested needs the wait to sleep in dispatch mode. A wait that
    // finds the dispatcher not seen running for 500 µs falls back to
    // interrupt mode by design (the starved-dispatcher rule), and a vCPU
    // the host deschedules that long makes that happen now and then (once
    // in CI): such a run says nothing about signals, so it is tried again,
    // and said. Three fallbacks in a row fail below.
    let (mut e, mut took, mut st) = signalled_wait(true);
    for attempt in 2..=3 {
        if st.dispatch_fallbacks == 0 {
            break;
        }
        eprintln!(
            "interruptible_dispatch_wait_ends_with_eintr: the wait fell back to interrupt mode (dispatcher not seen running: host noise), attempt {attempt}: {st:?}"
        );
        (e, took, st) = signalled_wait(true);
    }
    assert_eq!(e, libc::EINTR, "interruptible wait: {st:?}");
    assert!(took < Duration::from_millis(300), "took {took:?}");
    assert_eq!(
        st.dispatch_fallbacks, 0,
        "it slept in dispatch mode: {st:?}"
    );
    let (e, took, st) = signalled_wait(false);
    assert_eq!(e, 0, "plain wait must time out, not fail: {st:?}");
    assert!(took >= Duration::from_millis(400), "took {took:?}");
    drop(d);
}

/// Signals racing hand-offs: interruptible dispatch-mode waiters (what the
/// preload shim's epoll_wait uses) hit by signals at random while a
/// producer feeds them in random order. A signal that wins withdraws the
/// wait (EINTR, retried here as a program retries epoll_wait); one that
/// loses to a hand-off must not lose that completion. Every completion
/// arrives exactly once and in order.
#[test]
fn signals_racing_hand_offs_lose_nothing() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("signals_racing_hand_offs_lose_nothing") else {
        return;
    };
    install_usr2();
    let d = Dispatcher::start(Config::new(wcpu)).unwrap();
    let (threads, n) = (6usize, 3_000u64);
    let start = Arc::new(Barrier::new(threads + 1));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Consumers and the signaller meet here before any consumer exits, so
    // no signal is ever sent to a thread that has gone.
    let end = Arc::new(Barrier::new(threads + 1));
    let mut txs = Vec::new();
    let mut hs = Vec::new();
    for _ in 0..threads {
        let (tx, mut rx) = chan();
        txs.push(tx);
        let (start, tids, done, end) = (start.clone(), tids.clone(), done.clone(), end.clone());
        hs.push(std::thread::spawn(move || {
            fastwake::cpu::pin(wcpu).unwrap();
            // SAFETY: pthread_self has no preconditions.
            tids.lock()
                .unwrap()
                .push(unsafe { libc::pthread_self() } as usize);
            let mut w = Waiter::new(WaitMode::Dispatch);
            w.set_interruptible(true);
            start.wait();
            let mut eintr = 0u64;
            let mut expect = 0;
            while expect < n {
                match w.wait_timeout(&mut rx, WAIT) {
                    Ok(Some(m)) => {
                        assert_eq!(m.tag, expect, "lost or duplicated completion");
                        expect += 1;
                    }
                    Ok(None) => panic!("completion {expect} not delivered within {WAIT:?}"),
                    Err(e) if e.errno() == libc::EINTR => eintr += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            end.wait();
            (eintr, w.stats())
        }));
    }
    let signaller = {
        let (tids, done, end) = (tids.clone(), done.clone(), end.clone());
        std::thread::spawn(move || {
            fastwake::cpu::pin(pcpu).unwrap();
            let mut rng = 0x9e3779b97f4a7c15u64;
            while done.load(std::sync::atomic::Ordering::SeqCst) < threads {
                // xorshift: which thread, and how long until the next signal.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let t = tids.lock().unwrap();
                if !t.is_empty() {
                    // SAFETY: no consumer exits before this thread reaches
                    // `end`, after its last signal.
                    unsafe {
                        libc::pthread_kill(
                            t[rng as usize % t.len()] as libc::pthread_t,
                            libc::SIGUSR2,
                        )
                    };
                }
                drop(t);
                std::thread::sleep(Duration::from_micros(20 + rng % 80));
            }
            end.wait();
        })
    };
    fastwake::cpu::pin(pcpu).unwrap();
    start.wait();
    dispatch_common::produce_random(txs, n);
    let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    signaller.join().unwrap();
    fastwake::cpu::unpin().unwrap();
    drop(d);
    let eintr: u64 = results.iter().map(|r| r.0).sum();
    let handoffs: u64 = results.iter().map(|r| r.1.handoffs + r.1.relays).sum();
    let fallbacks: u64 = results.iter().map(|r| r.1.dispatch_fallbacks).sum();
    eprintln!(
        "{threads} threads × {n} with random signals: {eintr} EINTR, {handoffs} hand-offs, {fallbacks} fallbacks"
    );
    assert!(
        eintr > 0,
        "no signal ever interrupted a wait: the race was not exercised"
    );
    assert!(handoffs > 0, "no hand-off happened");
    // The slot protocol under this race (a withdrawal losing to a hand-off
    // must reclaim) is checked exhaustively by the loom model
    // `withdrawal_racing_a_hand_off_settles_once`: the window is too
    // narrow for a timed run to hit reliably.
}

/// Five times: send one completion from another thread after 300 µs
/// (the waiter is asleep by then, unless the host is slow; the dispatcher
/// is not yet idle) and take it with `w` on `cpu`. The waits' stats.
fn wait_five(w: &mut Waiter, cpu: u32, pcpu: u32) -> fastwake::wait::WaitStats {
    fastwake::cpu::pin(cpu).unwrap();
    let before = w.stats();
    for tag in 0..5 {
        let (mut tx, mut rx) = chan();
        let h = std::thread::spawn(move || {
            fastwake::cpu::pin(pcpu).unwrap();
            std::thread::sleep(Duration::from_micros(300));
            tx.send(tag, b"x").unwrap();
        });
        let m = w
            .wait_timeout(&mut rx, WAIT)
            .unwrap()
            .expect("no completion");
        assert_eq!(m.tag, tag);
        h.join().unwrap();
    }
    let mut s = w.stats();
    s.handoffs -= before.handoffs;
    s
}

/// fork without exec (a pre-fork server's workers): the parent's
/// dispatcher has no thread in the child, so a waiter registered with it
/// must not wait for it there (it falls back), the child may start its
/// own dispatcher for the same CPU (not refused as busy) and be handed
/// off by it, and dropping the parent's handle in the child returns.
#[test]
fn a_forked_child_starts_its_own_dispatcher() {
    let _g = spin_lock();
    let (wcpu, pcpu) = cpus();
    let parent_d = Dispatcher::start(Config::new(wcpu)).unwrap();
    let mut w = Waiter::new(WaitMode::Dispatch);
    let s = wait_five(&mut w, wcpu, pcpu);
    assert!(s.handoffs >= 1, "no hand-off in the parent: {s:?}");
    // SAFETY: the child only runs the checks below and leaves with
    // _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let s = wait_five(&mut w, wcpu, pcpu);
            assert_eq!(
                s.handoffs, 0,
                "handed off by a dispatcher with no thread: {s:?}"
            );
            let d = Dispatcher::start(Config::new(wcpu)).expect("the child's own dispatcher");
            let s = wait_five(&mut w, wcpu, pcpu);
            assert!(
                s.handoffs >= 1,
                "the child's dispatcher did not hand off: {s:?}"
            );
            drop(d);
            drop(parent_d);
        }))
        .map_or(1, |_| 0);
        // SAFETY: leave the child without running the parent's exit work.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    let t0 = Instant::now();
    let mut st = 0;
    // SAFETY: our own child, polled so a hang fails instead of blocking.
    while unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == 0 {
        if t0.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the forked child failed ({st:#x})"
    );
}

/// The dispatcher's pre-wake (`learn_idle` with `prewake=on`): completions
/// every 400 µs (+0-40 µs) are predictable, so the learned policy sleeps right
/// after each hand-off and has its waiter come back shortly before the
/// next completion, which is then handed off (caught) instead of waking
/// the waiter in interrupt mode; with `prewake=off` the same stream is
/// served by interrupt-mode wake-ups after each pause.
#[test]
fn a_learned_dispatcher_wakes_ahead_of_predictable_completions() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) =
        two_cpus("a_learned_dispatcher_wakes_ahead_of_predictable_completions")
    else {
        return;
    };
    let run = |prewake: bool, n: u64| {
        let mut cfg = Config::new(wcpu);
        cfg.learn_idle = Some(fastwake::adaptive::Config {
            prewake,
            ..fastwake::adaptive::Config::default()
        });
        let d = Dispatcher::start(cfg).expect("start dispatcher");
        let (mut tx, rx) = chan();
        let start = Arc::new(Barrier::new(2));
        let h = consumer(wcpu, rx, n, start.clone());
        start.wait();
        fastwake::cpu::pin(pcpu).unwrap();
        let gap = Duration::from_micros(400);
        let t0 = Instant::now();
        for i in 0..n {
            // A steady schedule, not gaps after each send: the stretches
            // the dispatcher sees are the schedule's.
            // 0-40 µs late, scattered: a service time of 400 µs + 10 %.
            let jitter = Duration::from_micros(i.wrapping_mul(2_654_435_761) % 41);
            let due = t0 + gap * (i as u32 + 1) + jitter;
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            tx.send(i, b"x").unwrap();
        }
        let s = h.join().expect("consumer failed");
        assert_eq!(s.completions, n);
        (s, d.stats())
    };
    let n = 1_500;
    let (off, off_d) = run(false, n);
    let (on, on_d) = run(true, n);
    eprintln!("prewake=off: {off:?}\n  {off_d:?}");
    eprintln!("prewake=on: {on:?}\n  {on_d:?}");
    assert_eq!(off_d.prewakes, 0, "prewake=off planned pre-wakes");
    assert_eq!(
        (off_d.prewake_pauses, off_d.margin_ns),
        (0, 0),
        "prewake=off paused pre-wakes or has a margin: {off_d:?}"
    );
    assert!(
        on_d.prewakes >= n / 2,
        "{} pre-wakes planned for {n} predictable completions",
        on_d.prewakes
    );
    assert!(
        on_d.prewake_caught * 2 >= on_d.prewakes,
        "caught {} of {} pre-wakes",
        on_d.prewake_caught,
        on_d.prewakes
    );
    assert!(
        on.dispatch_resumed > 0,
        "no paused wait came back at the resume time"
    );
    // Served by hand-off instead of interrupt-mode wake-ups after a pause.
    assert!(
        on.handoffs > off.handoffs + n / 4,
        "hand-offs with pre-wakes {} vs without {} of {n}",
        on.handoffs,
        off.handoffs
    );
}

/// A thread that computes on the dispatcher's core between its waits keeps
/// the `SCHED_IDLE` dispatcher off the CPU while it runs, so every wait
/// starts with a heartbeat as old as the computation. That silence is the
/// waiter's own doing, not starvation: the waits must still be handed off
/// (they all fell back to interrupt mode when the computation lasted over
/// the 500 µs staleness limit: found by the C ABI's verbs check in the
/// Soft-RoCE guest, whose round trips take about that long under TCG).
#[test]
fn a_waiter_that_computes_between_waits_is_still_handed_off() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("a_waiter_that_computes_between_waits_is_still_handed_off")
    else {
        return;
    };
    let d = never_idle(wcpu);
    const N: u64 = 150;
    let (mut req_tx, mut req_rx) = chan();
    let (mut rep_tx, mut rep_rx) = chan();
    // The server: polls for each request (bounded by WAIT), replies 30 µs
    // later, so the reply lands while the client waits.
    let server = std::thread::spawn(move || {
        fastwake::cpu::pin(pcpu).unwrap();
        let mut w = Waiter::new(WaitMode::Poll);
        for i in 0..N {
            let m = w.wait_timeout(&mut req_rx, WAIT).unwrap().expect("request");
            assert_eq!(m.tag, i, "lost or duplicated request");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(30) {
                std::hint::spin_loop();
            }
            rep_tx.send(i, b"r").unwrap();
        }
    });
    fastwake::cpu::pin(wcpu).unwrap();
    let mut w = Waiter::new(WaitMode::Dispatch);
    for i in 0..N {
        compute(Duration::from_millis(1));
        req_tx.send(i, b"q").unwrap();
        let m = w
            .wait_timeout(&mut rep_rx, WAIT)
            .unwrap()
            .unwrap_or_else(|| panic!("reply {i} not delivered within {WAIT:?}"));
        assert_eq!(m.tag, i, "lost or duplicated reply");
    }
    server.join().expect("server failed");
    let s = w.stats();
    eprintln!(
        "1 ms of computing between waits: {s:?}; dispatcher {:?}",
        d.stats()
    );
    assert_eq!(s.completions, N);
    // Most waits are handed off; a few may find the reply already there
    // or be rescued when the host preempts the dispatcher's vCPU.
    assert!(
        s.handoffs >= N / 2,
        "{} of {N} waits handed off ({} fallbacks to interrupt mode)",
        s.handoffs,
        s.dispatch_fallbacks
    );
}

/// The other side of trusting a silent dispatcher: when a busy thread did
/// take its core, the watchdog serves the one wait that trusted it, and
/// that wait ends untrusted, so the next ones fall back to interrupt mode
/// instead of each waiting for the watchdog.
#[test]
fn a_starved_dispatcher_is_trusted_for_one_wait_only() {
    let _g = spin_lock();
    let Some((wcpu, pcpu)) = two_cpus("a_starved_dispatcher_is_trusted_for_one_wait_only") else {
        return;
    };
    let d = never_idle(wcpu);
    const STARVED: u64 = 5;
    let (mut tx, rx) = chan();
    let start = Arc::new(Barrier::new(2));
    let h = consumer(wcpu, rx, 1 + STARVED, start.clone());
    start.wait();
    fastwake::cpu::pin(pcpu).unwrap();
    // A healthy hand-off first: the consumer trusts the dispatcher.
    std::thread::sleep(Duration::from_millis(20));
    tx.send(0, b"x").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let hog = Hog::start(wcpu);
    for i in 1..=STARVED {
        std::thread::sleep(Duration::from_millis(20));
        tx.send(i, b"x").unwrap();
    }
    let s = h.join().expect("consumer failed");
    hog.stop();
    let ds = d.stats();
    eprintln!("{STARVED} waits next to a busy thread: {s:?}; dispatcher {ds:?}");
    assert_eq!(s.completions, 1 + STARVED);
    // Trusted forever, every starved wait would wait for the watchdog.
    // The dispatcher gets the odd slice next to the hog (SCHED_IDLE's
    // weight is not 0), so one more trusted wait is allowed.
    assert!(
        ds.rescued <= 2 && s.dispatch_fallbacks >= STARVED - 2,
        "starved waits: {} rescued by the watchdog, {} fell back",
        ds.rescued,
        s.dispatch_fallbacks
    );
}
