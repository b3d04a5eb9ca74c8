//! What a dispatcher pass costs with N idle sources whose completions come
//! through one shared queue (`source::demux`, the per-core shared CQ
//! without the NIC) against N idle sources with a queue each, every one
//! polled every pass (today's per-connection CQs). Each source is
//! waited on by a task of one task runtime (notices on, never idle) on
//! the last CPU, with nothing to do: after a while another thread gives
//! every source one completion, the tasks end, and the runtime's pass
//! count over that while gives the cost of a pass. Then the same for the
//! thread dispatcher, with dispatch-mode threads asleep on the sources.
//!
//! ```sh
//! cargo run --release --example demux_pass -- [MS]
//! ```
//!
//! The per-source queue here is the in-memory `MemQueue`, whose poll takes
//! a mutex: polling an empty verbs CQ costs a different amount (a read of
//! the next CQE for mlx5), which cannot be measured without RDMA
//! hardware. What is shown is the shape: flat in N with one shared queue,
//! linear with a queue per source.

use fastwake::dispatch::{Runtime, TaskConfig};
use fastwake::source::demux::{Demux, MemQueue};
use std::time::{Duration, Instant};

type Q = MemQueue<u64>;

/// ns per pass with `n` idle inboxes spread over `queues` shared queues,
/// measured over `ms` milliseconds.
fn pass_ns(n: usize, queues: usize, ms: u64) -> f64 {
    let demuxes: Vec<Demux<Q>> = (0..queues)
        .map(|_| Demux::new(MemQueue::new().unwrap()))
        .collect();
    let inboxes: Vec<_> = (0..n)
        .map(|k| demuxes[k % queues].inbox(k as u64).unwrap())
        .collect();
    let cpu = fastwake::cpu::online().saturating_sub(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let rt = std::thread::spawn(move || {
        fastwake::cpu::pin(cpu).unwrap();
        let mut rt = Runtime::new(TaskConfig {
            idle_after: None,
            ..TaskConfig::default()
        })
        .unwrap();
        for mut inbox in inboxes {
            rt.spawn(move |cx| cx.wait(&mut inbox).map(drop)).unwrap();
        }
        tx.send(Instant::now()).unwrap();
        rt.run().unwrap().passes
    });
    let t0 = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(ms));
    let t1 = Instant::now();
    for k in 0..n {
        demuxes[k % queues].queue().push(k as u64, 0);
    }
    let passes = rt.join().unwrap();
    (t1 - t0).as_nanos() as f64 / passes as f64
}

/// The same for a thread dispatcher (never idle) on the last CPU, with
/// `n` dispatch-mode threads asleep on the inboxes: ns per pass from its
/// pass count over `ms` milliseconds.
fn threads_pass_ns(n: usize, queues: usize, ms: u64) -> f64 {
    use fastwake::dispatch::{Config, Dispatcher};
    use fastwake::{WaitMode, Waiter};
    let cpu = fastwake::cpu::online().saturating_sub(1);
    let mut cfg = Config::new(cpu);
    cfg.idle_after = None;
    let disp = Dispatcher::start(cfg).unwrap();
    let demuxes: Vec<Demux<Q>> = (0..queues)
        .map(|_| Demux::new(MemQueue::new().unwrap()))
        .collect();
    let waiters: Vec<_> = (0..n)
        .map(|k| {
            let mut inbox = demuxes[k % queues].inbox(k as u64).unwrap();
            std::thread::spawn(move || {
                fastwake::cpu::pin(cpu).unwrap();
                Waiter::new(WaitMode::Dispatch).wait(&mut inbox).unwrap();
            })
        })
        .collect();
    // Every thread registered and asleep on its slot.
    while disp.stats().registered < n as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20));
    let (p0, t0) = (disp.stats().passes, Instant::now());
    std::thread::sleep(Duration::from_millis(ms));
    let (p1, t1) = (disp.stats().passes, Instant::now());
    for k in 0..n {
        demuxes[k % queues].queue().push(k as u64, 0);
    }
    waiters.into_iter().for_each(|w| w.join().unwrap());
    (t1 - t0).as_nanos() as f64 / (p1 - p0).max(1) as f64
}

fn main() {
    let ms: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    fastwake::cpu::pin(0).unwrap();
    println!("task runtime");
    println!("idle sources | ns/pass, one shared queue | ns/pass, a queue per source");
    for n in [1usize, 16, 64, 256, 1024] {
        let shared = pass_ns(n, 1, ms);
        let per = pass_ns(n, n, ms);
        println!("{n:>12} | {shared:>25.1} | {per:>29.1}");
    }
    println!("thread dispatcher");
    println!("idle sources | ns/pass, one shared queue | ns/pass, a queue per source");
    for n in [1usize, 16, 64, 256] {
        let shared = threads_pass_ns(n, 1, ms);
        let per = threads_pass_ns(n, n, ms);
        println!("{n:>12} | {shared:>25.1} | {per:>29.1}");
    }
}
