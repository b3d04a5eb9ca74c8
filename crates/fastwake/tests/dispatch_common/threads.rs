//! Helpers of the tests that run kernel threads in dispatch mode: one
//! dispatcher-spinning test at a time, the CPUs to use, a consumer thread,
//! a dispatcher that never idles, a CPU hog.
#![allow(dead_code)] // each test binary uses its own subset

use fastwake::dispatch::{Config, Dispatcher};
use fastwake::source::channel::Receiver;
use fastwake::{WaitMode, Waiter};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

pub static SPIN: Mutex<()> = Mutex::new(());

pub fn spin_lock() -> std::sync::MutexGuard<'static, ()> {
    SPIN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CPU the waiters and their dispatcher share, and the producer's.
pub fn cpus() -> (u32, u32) {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
    if n >= 2 { (1, 0) } else { (0, 0) }
}

/// [`cpus`], or `None` (saying SKIPPED for `test`) on a single CPU.
pub fn two_cpus(test: &str) -> Option<(u32, u32)> {
    let (wcpu, pcpu) = cpus();
    if wcpu == pcpu {
        eprintln!("SKIPPED {test}: needs 2 CPUs");
        return None;
    }
    Some((wcpu, pcpu))
}

pub const WAIT: Duration = Duration::from_secs(10);

/// A waiter thread: takes `n` completions in order on `rx`, returns its
/// waiter (for stats). Fails loudly on a gap, duplicate or timeout.
pub fn consumer(
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

/// A dispatcher on `cpu` that never goes idle.
pub fn never_idle(cpu: u32) -> Dispatcher {
    let mut cfg = Config::new(cpu);
    cfg.idle_after = None;
    Dispatcher::start(cfg).expect("start dispatcher")
}

/// A busy normal-priority thread on a CPU (which a `SCHED_IDLE`
/// dispatcher there yields to), for at most [`WAIT`].
pub struct Hog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Hog {
    pub fn start(cpu: u32) -> Hog {
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

    pub fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// Spin on this thread for `d`.
pub fn compute(d: Duration) {
    let t0 = Instant::now();
    let mut x = 0u64;
    while t0.elapsed() < d {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_add(i * i));
        }
    }
}
