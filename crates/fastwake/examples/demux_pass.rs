//! What a dispatcher pass costs with N idle sources whose completions come
//! through one shared queue (`source::demux`, the per-core shared CQ
//! without the NIC) against N idle sources with a queue each, every one
//! polled every pass (today's per-connection CQs). Each source is
//! waited on by a task of one task runtime (notices on, never idle) on
//! the last CPU, with nothing to do: after a while another thread gives
//! every source one completion, the tasks end, and the runtime's pass
//! count over that while gives the cost of a pass.
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

fn main() {
    let ms: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    fastwake::cpu::pin(0).unwrap();
    println!("idle sources | ns/pass, one shared queue | ns/pass, a queue per source");
    for n in [1usize, 16, 64, 256, 1024] {
        let shared = pass_ns(n, 1, ms);
        let per = pass_ns(n, n, ms);
        println!("{n:>12} | {shared:>25.1} | {per:>29.1}");
    }
}
