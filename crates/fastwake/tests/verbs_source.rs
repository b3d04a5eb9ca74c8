//! The verbs source against a real RDMA device (Soft-RoCE in the rxe-test
//! guest). Without libibverbs or a device every test but the first prints
//! `SKIPPED <name>: <why>` and returns.
//!
//! `FASTWAKE_TEST_VERBS_DEV` picks the device (default: the first one).

use fastwake::source::verbs::{CqConfig, Device, Mr, RcQp, Vector, VerbsCq};
use fastwake::{Source, WaitMode, Waiter};
use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_SUCCESS};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Spinning tests must not run concurrently (2 CPUs).
static SPIN: Mutex<()> = Mutex::new(());

const DEPTH: u32 = 64;
const SIZE: usize = 8;
const WAIT: Duration = Duration::from_secs(10);

mod common;

fn device(test: &str) -> Option<Arc<Device>> {
    common::verbs_device(test)
}

/// One side: QP (dropped first), its CQs, its memory.
struct Side {
    qp: RcQp,
    rcq: VerbsCq,
    scq: VerbsCq,
    mr: Mr,
    sent: u64,
    unreaped: u32,
}

impl Side {
    fn new(dev: &Arc<Device>, cpu: u32, ack_batch: u32) -> Side {
        let cfg = CqConfig {
            entries: DEPTH * 2,
            vector: Vector::ForCpu(Some(cpu)),
            ack_batch,
            ..CqConfig::default()
        };
        let rcq = VerbsCq::new(dev, cfg).expect("recv CQ");
        let scq = VerbsCq::new(dev, cfg).expect("send CQ");
        let qp = RcQp::new(&scq, &rcq, DEPTH, 64).expect("QP");
        let mr = Mr::new(dev, SIZE * (1 + DEPTH as usize)).expect("MR");
        Side {
            qp,
            rcq,
            scq,
            mr,
            sent: 0,
            unreaped: 0,
        }
    }

    fn post_all_recvs(&self) {
        for i in 0..DEPTH as u64 {
            self.qp
                .post_recv(i, &self.mr, SIZE * (1 + i as usize), SIZE)
                .expect("post_recv");
        }
    }

    fn send(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            while let Some(wc) = self.scq.try_take().expect("poll send CQ") {
                assert_eq!(wc.status, IBV_WC_SUCCESS, "send completion");
                self.unreaped -= 1;
            }
            if self.unreaped < DEPTH / 2 {
                break;
            }
            assert!(Instant::now() < deadline, "send queue never drained");
        }
        self.qp
            .post_send(self.sent, &self.mr, 0, SIZE, self.sent as u32, true)
            .expect("post_send");
        self.sent += 1;
        self.unreaped += 1;
    }

    /// Wait for the receive with sequence number `want` and repost its buffer.
    fn recv(&mut self, w: &mut Waiter, want: u64) {
        let wc = w
            .wait_timeout(&mut self.rcq, WAIT)
            .expect("wait")
            .unwrap_or_else(|| panic!("message {want} never arrived ({})", w.mode()));
        assert_eq!(wc.status, IBV_WC_SUCCESS, "recv status");
        assert_eq!(wc.opcode, IBV_WC_RECV);
        assert_eq!(wc.imm_data, want as u32, "lost, duplicated or reordered");
        assert_eq!(wc.byte_len as usize, SIZE);
        self.qp
            .post_recv(wc.wr_id, &self.mr, SIZE * (1 + wc.wr_id as usize), SIZE)
            .expect("repost");
    }
}

fn connected(dev: &Arc<Device>, ack_batch: u32) -> (Side, Side) {
    let a = Side::new(dev, 0, ack_batch);
    let b = Side::new(dev, 1 % fastwake::cpu::online(), ack_batch);
    a.qp.connect(&b.qp.endpoint()).expect("connect a");
    b.qp.connect(&a.qp.endpoint()).expect("connect b");
    a.post_all_recvs();
    b.post_all_recvs();
    (a, b)
}

#[test]
fn missing_device_is_one_line() {
    let e = match Device::open(Some("fastwake-no-such-dev0"), None) {
        Ok(_) => panic!("opened a device that does not exist"),
        Err(e) => e.to_string(),
    };
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.contains("not found") || e.contains("no RDMA") || e.contains("libibverbs"),
        "{e}"
    );
}

#[test]
fn pingpong_in_every_mode() {
    let Some(dev) = device("pingpong_in_every_mode") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    for mode in ["poll", "interrupt", "hybrid"] {
        let mode: WaitMode = mode.parse().unwrap();
        let (mut a, mut b) = connected(&dev, 16);
        const N: u64 = 300;
        let pong = std::thread::spawn(move || {
            let mut w = Waiter::new(mode);
            for i in 0..N {
                b.recv(&mut w, i);
                b.send();
            }
            (b, w)
        });
        let mut w = Waiter::new(mode);
        for i in 0..N {
            a.send();
            a.recv(&mut w, i);
        }
        let (b, wb) = pong.join().expect("pong thread");
        assert_eq!(w.stats().completions, N);
        assert_eq!(wb.stats().completions, N);
        if mode == WaitMode::Interrupt {
            let ev = a.rcq.stats().events + b.rcq.stats().events;
            assert!(ev > 0, "interrupt mode never used a completion event");
        }
        eprintln!(
            "{mode}: ping {:?} cq {:?}; placement {}",
            w.stats(),
            a.rcq.stats(),
            a.rcq.placement()
        );
        drop((a, b));
    }
}

#[test]
fn random_bursts_lose_and_duplicate_nothing() {
    let Some(dev) = device("random_bursts_lose_and_duplicate_nothing") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    let (mut a, mut b) = connected(&dev, 7);
    const N: u64 = 2000;
    let seed: u64 = rand::rng().random();
    eprintln!("seed {seed}");
    let sender = std::thread::spawn(move || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut sent = 0;
        while sent < N {
            // Never more in flight than the receiver has buffers posted:
            // bursts stay under DEPTH and the receiver reposts as it goes.
            let burst = rng.random_range(1..=8).min(N - sent);
            for _ in 0..burst {
                a.send();
                sent += 1;
            }
            let pause = rng.random_range(0..150);
            if pause > 100 {
                std::thread::sleep(Duration::from_micros(pause));
            }
        }
        a
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 1);
    let modes = [
        WaitMode::Interrupt,
        WaitMode::Hybrid {
            budget: Duration::from_micros(5),
        },
        WaitMode::Poll,
    ];
    let mut waiters: Vec<Waiter> = modes.iter().map(|m| Waiter::new(*m)).collect();
    let start = Instant::now();
    for i in 0..N {
        let w = &mut waiters[rng.random_range(0..modes.len())];
        b.recv(w, i);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "stress took too long"
        );
    }
    let a = sender.join().expect("sender");
    // Nothing extra: no duplicate shows up later.
    let mut w = Waiter::new(WaitMode::Interrupt);
    let extra = w
        .wait_timeout(&mut b.rcq, Duration::from_millis(50))
        .expect("wait");
    assert!(
        extra.is_none(),
        "a completion beyond the {N} sent: {extra:?}"
    );
    let total: u64 = waiters.iter().map(|w| w.stats().completions).sum();
    assert_eq!(total, N);
    let spurious: u64 = waiters.iter().map(|w| w.stats().spurious).sum();
    eprintln!(
        "received {N} in order; spurious wake-ups {spurious}; cq {:?}",
        b.rcq.stats()
    );
    drop((a, b));
}

#[test]
fn stale_events_are_tolerated_and_destroy_never_hangs() {
    let Some(dev) = device("stale_events_are_tolerated_and_destroy_never_hangs") else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // ack_batch 16 and an odd number of events: some are still unacked
        // when the CQ is dropped, which must ack them before destroying.
        let (mut a, mut b) = connected(&dev, 16);
        let mut w = Waiter::new(WaitMode::Interrupt);
        for i in 0..37 {
            // Arm, then take the CQE by polling: the event raised for it stays
            // in the channel. The next interrupt-mode wait, with nothing
            // sent, must wake on that stale event, find no CQE, go back to
            // sleep and time out: no phantom completion.
            b.rcq.arm().expect("arm");
            a.send();
            let deadline = Instant::now() + WAIT;
            let wc = loop {
                if let Some(wc) = b.rcq.try_take().expect("poll") {
                    break wc;
                }
                assert!(Instant::now() < deadline, "message never arrived");
            };
            assert_eq!(wc.imm_data, 2 * i as u32);
            b.qp.post_recv(wc.wr_id, &b.mr, SIZE * (1 + wc.wr_id as usize), SIZE)
                .unwrap();
            let none = w
                .wait_timeout(&mut b.rcq, Duration::from_millis(20))
                .expect("wait");
            assert!(none.is_none(), "phantom completion {none:?}");
            a.send();
            b.recv(&mut w, 2 * i + 1);
        }
        let events = b.rcq.stats().events;
        let stats = w.stats();
        assert!(stats.spurious > 0, "no wake-up without a CQE: {stats:?}");
        drop((a, b));
        tx.send((events, stats)).unwrap();
    });
    let (events, stats) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the test hung (ibv_destroy_cq waiting for unacked events?)");
    assert!(events > 0, "no completion event was ever read");
    eprintln!("events {events}, waiter {stats:?}");
}

#[test]
fn dispatch_mode_hands_off_verbs_completions() {
    let Some(dev) = device("dispatch_mode_hands_off_verbs_completions") else {
        return;
    };
    // SAFETY: sysconf has no preconditions.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } < 2 {
        eprintln!("SKIPPED dispatch_mode_hands_off_verbs_completions: needs 2 CPUs");
        return;
    }
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    use fastwake::dispatch::{Config, Dispatcher};
    // One dispatcher per end's CPU; each end's waiter registers its CQ's
    // peek handle with the dispatcher of the CPU it runs on.
    let d0 = Dispatcher::start(Config::new(0)).expect("dispatcher 0");
    let d1 = Dispatcher::start(Config::new(1)).expect("dispatcher 1");
    let (mut a, mut b) = connected(&dev, 16);
    const N: u64 = 300;
    let pong = std::thread::spawn(move || {
        fastwake::cpu::pin(1).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        for i in 0..N {
            b.recv(&mut w, i);
            b.send();
        }
        (b, w.stats())
    });
    let ping = std::thread::spawn(move || {
        fastwake::cpu::pin(0).unwrap();
        let mut w = Waiter::new(WaitMode::Dispatch);
        for i in 0..N {
            a.send();
            a.recv(&mut w, i);
        }
        (a, w.stats())
    });
    let (a, sa) = ping.join().expect("ping");
    let (b, sb) = pong.join().expect("pong");
    assert_eq!(sa.completions + sb.completions, 2 * N);
    eprintln!("dispatch: ping {sa:?}\ndispatch: pong {sb:?}");
    assert!(
        sa.handoffs + sb.handoffs > 0,
        "no dispatcher ever handed off a verbs completion"
    );
    drop((a, b));
    drop((d0, d1));
}

/// How the server ends of [`shared_cq_round_trips`] wait.
#[derive(Debug, Clone, Copy)]
enum Servers {
    /// A thread per connection, waiting in this mode.
    Threads(WaitMode),
    /// A task per connection, on one task runtime.
    Tasks,
}

/// One server end: answer requests 0..n on `qp`, taking its completions
/// (requests, and its replies' send completions) from `next`. Every
/// request is checked: imm = sequence number (none lost, duplicated or
/// reordered), and routed to this QP's inbox.
fn serve(qp: &RcQp, mr: &Mr, n: u64, mut next: impl FnMut() -> fastwake::source::verbs::Wc) {
    use fastwake_verbs_sys::IBV_WC_SEND;
    let mut unreaped = 0u32;
    let mut take = |unreaped: &mut u32| loop {
        let wc = next();
        assert_eq!(wc.status, IBV_WC_SUCCESS, "completion status");
        assert_eq!(wc.qp_num, qp.qp_num(), "routed to another QP's inbox");
        if wc.opcode != IBV_WC_SEND {
            break Some(wc);
        }
        *unreaped -= 1;
        if *unreaped == 0 {
            break None;
        }
    };
    for i in 0..n {
        let wc = loop {
            if let Some(wc) = take(&mut unreaped) {
                break wc;
            }
        };
        assert_eq!(wc.opcode, IBV_WC_RECV);
        assert_eq!(wc.imm_data, i as u32, "lost, duplicated or reordered");
        qp.post_recv(wc.wr_id, mr, SIZE * (1 + wc.wr_id as usize), SIZE)
            .expect("repost");
        assert!(unreaped < DEPTH, "send completions not coming back");
        qp.post_send(i, mr, 0, SIZE, i as u32, true).expect("reply");
        unreaped += 1;
    }
    while unreaped > 0 {
        assert!(take(&mut unreaped).is_none(), "a request nobody sent");
    }
}

/// Eight RC connections whose server ends share one CQ
/// (`fastwake::source::verbs::SharedCq`, routed by QP number), served on
/// CPU 1 as `servers` says, against a client on CPU 0 that sends request
/// `i` on every connection and then waits for the eight replies (see
/// [`serve`]). Returns the servers' hand-offs, the demultiplexer's and
/// the CQ's counters.
fn shared_cq_round_trips(
    dev: &Arc<Device>,
    servers: Servers,
) -> (
    u64,
    fastwake::source::demux::DemuxStats,
    fastwake::source::verbs::CqStats,
) {
    use fastwake::source::verbs::{Route, SharedCq};
    const QPS: usize = 8;
    const N: u64 = 150;
    let cfg = CqConfig {
        entries: QPS as u32 * DEPTH * 2,
        vector: Vector::ForCpu(Some(1)),
        ..CqConfig::default()
    };
    let shared = SharedCq::new(dev, cfg, Route::QpNum).expect("shared CQ");
    let ends: Vec<(RcQp, Mr)> = (0..QPS)
        .map(|_| {
            let qp = RcQp::new(&shared, &shared, DEPTH, 64).expect("QP on the shared CQ");
            (qp, Mr::new(dev, SIZE * (1 + DEPTH as usize)).expect("MR"))
        })
        .collect();
    let mut clients: Vec<Side> = (0..QPS).map(|_| Side::new(dev, 0, 16)).collect();
    for ((qp, mr), c) in ends.iter().zip(&clients) {
        qp.connect(&c.qp.endpoint()).expect("connect server");
        c.qp.connect(&qp.endpoint()).expect("connect client");
        for i in 0..DEPTH as u64 {
            qp.post_recv(i, mr, SIZE * (1 + i as usize), SIZE)
                .expect("post_recv");
        }
        c.post_all_recvs();
    }
    let ends: Vec<_> = ends
        .into_iter()
        .map(|(qp, mr)| {
            let inbox = shared.inbox(u64::from(qp.qp_num())).expect("inbox");
            (qp, mr, inbox)
        })
        .collect();
    let start = Arc::new(std::sync::Barrier::new(2));
    let server = {
        let start = start.clone();
        std::thread::spawn(move || -> u64 {
            fastwake::cpu::pin(1).unwrap();
            match servers {
                Servers::Threads(mode) => {
                    let inner = Arc::new(std::sync::Barrier::new(QPS + 1));
                    let threads: Vec<_> = ends
                        .into_iter()
                        .map(|(qp, mr, mut inbox)| {
                            let inner = inner.clone();
                            std::thread::spawn(move || {
                                fastwake::cpu::pin(1).unwrap();
                                let mut w = Waiter::new(mode);
                                inner.wait();
                                serve(&qp, &mr, N, || {
                                    w.wait_timeout(&mut inbox, WAIT)
                                        .expect("wait")
                                        .unwrap_or_else(|| {
                                            panic!("a request never arrived ({mode:?})")
                                        })
                                });
                                w.stats().handoffs
                            })
                        })
                        .collect();
                    inner.wait();
                    start.wait();
                    threads.into_iter().map(|t| t.join().expect("server")).sum()
                }
                Servers::Tasks => {
                    let mut rt = fastwake::dispatch::Runtime::new(Default::default()).unwrap();
                    for (qp, mr, mut inbox) in ends {
                        rt.spawn(move |cx| {
                            serve(&qp, &mr, N, || cx.wait(&mut inbox).expect("wait"));
                            Ok(())
                        })
                        .unwrap();
                    }
                    start.wait();
                    let st = rt.run().unwrap();
                    assert!(rt.take_errors().is_empty(), "a server task failed");
                    eprintln!("shared CQ, tasks: {st:?}");
                    st.handoffs
                }
            }
        })
    };
    start.wait();
    fastwake::cpu::pin(0).unwrap();
    let mut w = Waiter::new(WaitMode::Poll);
    for i in 0..N {
        clients.iter_mut().for_each(Side::send);
        clients.iter_mut().for_each(|c| c.recv(&mut w, i));
    }
    let handoffs = server.join().expect("servers");
    drop(clients);
    let st = shared.stats();
    assert_eq!(
        st.routed,
        2 * QPS as u64 * N,
        "every request and reply completion routed"
    );
    assert_eq!(st.unrouted, 0);
    (handoffs, st, shared.queue().stats())
}

/// Skips (printing why) without a device or a second CPU.
fn shared_cq_device(test: &str) -> Option<Arc<Device>> {
    let dev = device(test)?;
    if fastwake::cpu::online() < 2 {
        eprintln!("SKIPPED {test}: needs 2 CPUs");
        return None;
    }
    Some(dev)
}

#[test]
fn shared_cq_serves_eight_qps_in_dispatch_mode() {
    let Some(dev) = shared_cq_device("shared_cq_serves_eight_qps_in_dispatch_mode") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    // SCHED_OTHER, not the default SCHED_IDLE: under the guest's TCG the
    // eight server threads on CPU 1 starve a SCHED_IDLE dispatcher so
    // often that their waits fall back to interrupt mode (in 2 of 7 guest
    // runs 1 and 8 hand-offs, 0 through notices; 334-1,194 in the
    // others), and this test is about the shared CQ, not the policy.
    let mut cfg = fastwake::dispatch::Config::new(1);
    cfg.policy = fastwake::dispatch::SchedPolicy::Normal;
    let d = fastwake::dispatch::Dispatcher::start(cfg).expect("dispatcher");
    let (handoffs, st, cq) = shared_cq_round_trips(&dev, Servers::Threads(WaitMode::Dispatch));
    let ds = d.stats();
    eprintln!(
        "shared CQ, dispatch: {handoffs} hand-offs; dispatcher {ds:?}; demux {st:?}; cq {cq:?}"
    );
    assert!(handoffs > 0, "no wait on the shared CQ was handed off");
    assert!(ds.notices > 0, "no hand-off came through a routed notice");
    assert!(
        st.notices > 0,
        "routing never answered a dispatch-mode wait"
    );
}

#[test]
fn shared_cq_serves_eight_qps_in_interrupt_mode() {
    let Some(dev) = shared_cq_device("shared_cq_serves_eight_qps_in_interrupt_mode") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    let (_, st, cq) = shared_cq_round_trips(&dev, Servers::Threads(WaitMode::Interrupt));
    eprintln!("shared CQ, interrupt: demux {st:?}; cq {cq:?}");
    assert!(
        cq.events > 0,
        "no completion event was read from the shared channel"
    );
    // Acked in batches of `ack_batch` (16); the rest when the CQ goes.
    assert_eq!(cq.ack_calls, cq.events / 16, "events not acked in batches");
}

#[test]
fn shared_cq_serves_eight_qps_as_tasks() {
    let Some(dev) = shared_cq_device("shared_cq_serves_eight_qps_as_tasks") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    let (handoffs, st, cq) = shared_cq_round_trips(&dev, Servers::Tasks);
    eprintln!("shared CQ, tasks: {handoffs} hand-offs; demux {st:?}; cq {cq:?}");
    assert!(handoffs > 0, "no task was switched into for a completion");
    assert!(st.notices > 0, "routing never answered a task's wait");
}

/// Poll `cq` until it returns a completion (at most `WAIT`).
fn take_within(cq: &mut VerbsCq) -> fastwake::source::verbs::Wc {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(wc) = cq.try_take().expect("poll") {
            return wc;
        }
        assert!(Instant::now() < deadline, "no completion within {WAIT:?}");
    }
}

/// The stall monitor of the library's own verbs source (docs/design/stall-monitor.md): a
/// SEND whose peer posts its receive 120 ms late (RNR NAKs, retried for
/// ever: `rnr_retry` 7) while the sender polls its CQ is one stall, one
/// episode, reported once with its QP and `wr_id`; a send on time ends
/// the episode; with the monitor off nothing is counted.
#[test]
fn stall_monitor_names_a_send_its_peer_received_late() {
    let Some(dev) = device("stall_monitor_names_a_send_its_peer_received_late") else {
        return;
    };
    let _g = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    fastwake::source::verbs::set_stall_threshold(Some(Duration::from_millis(50)));
    let mut a = Side::new(&dev, 0, 16);
    let b = Side::new(&dev, 1 % fastwake::cpu::online(), 16);
    a.qp.connect(&b.qp.endpoint()).expect("connect a");
    b.qp.connect(&a.qp.endpoint()).expect("connect b");
    const LATE: Duration = Duration::from_millis(120);
    a.qp.post_send(0x51, &a.mr, 0, SIZE, 1, true)
        .expect("post_send");
    let t0 = Instant::now();
    while t0.elapsed() < LATE {
        assert!(
            a.scq.try_take().expect("poll").is_none(),
            "the send completed before its peer posted a receive"
        );
    }
    b.qp.post_recv(0, &b.mr, SIZE, SIZE).expect("post_recv");
    let wc = take_within(&mut a.scq);
    assert_eq!((wc.status, wc.wr_id), (IBV_WC_SUCCESS, 0x51));
    let s = a.scq.stall_stats();
    assert_eq!(
        (s.completions, s.stalls, s.episodes, s.unobserved),
        (1, 1, 1, 0),
        "{s:?}"
    );
    assert!(s.max >= LATE, "{s:?}");
    let r = a.scq.take_stalls();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].qp_num, r[0].wr_id), (a.qp.qp_num(), 0x51));
    assert!(r[0].waited >= LATE, "{:?}", r[0]);
    assert!(
        r[0].line.starts_with("stall: ") && r[0].line.contains("wr_id 0x51"),
        "{}",
        r[0].line
    );
    eprintln!("stall report: {}", r[0].line);
    assert!(a.scq.take_stalls().is_empty(), "each report is taken once");
    // On time: the episode ends, nothing new is reported.
    b.qp.post_recv(1, &b.mr, SIZE, SIZE).expect("post_recv");
    a.qp.post_send(0x52, &a.mr, 0, SIZE, 2, true)
        .expect("post_send");
    assert_eq!(take_within(&mut a.scq).wr_id, 0x52);
    let s = a.scq.stall_stats();
    assert_eq!((s.completions, s.stalls, s.episodes), (2, 1, 1), "{s:?}");
    // Off: neither dated nor judged.
    fastwake::source::verbs::set_stall_threshold(None);
    b.qp.post_recv(2, &b.mr, SIZE, SIZE).expect("post_recv");
    a.qp.post_send(0x53, &a.mr, 0, SIZE, 3, true)
        .expect("post_send");
    assert_eq!(take_within(&mut a.scq).wr_id, 0x53);
    assert_eq!(a.scq.stall_stats().completions, 2);
    fastwake::source::verbs::set_stall_threshold(Some(Duration::from_millis(
        fastwake::stall::DEFAULT_THRESHOLD_MS,
    )));
    eprintln!("stall monitor: {:?}", a.scq.stall_stats());
}
