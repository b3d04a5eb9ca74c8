//! The stall monitor end to end on the host: a fake provider
//! whose post_send queues completions that its poll_cq hands back in order,
//! driven through the shim's wrapped ops, as a program's inline
//! `ibv_post_send` / `ibv_poll_cq` would. A module of its own so that it
//! may use both `ops` and `monitor` (which `ops` uses).

use super::monitor::{self, set_threshold_ns, wrap};
use super::{ops, table};
use fastwake::stall::QpKey;
/// A fake provider: a context whose post_send queues completions that its
/// poll_cq hands back in order, so the wrapped ops run end to end on the
/// host without RDMA.
use fastwake_verbs_sys::{IBV_WC_SEND, ibv_send_wr};
use fastwake_verbs_sys::{PostSendFn, ibv_context, ibv_cq, ibv_qp, ibv_wc};
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::Ordering;

static FAKE_CQ: StdMutex<VecDeque<ibv_wc>> = StdMutex::new(VecDeque::new());
static SENDS: FakeSends = FakeSends::new(&FAKE_CQ);
use std::sync::atomic::AtomicBool;

/// A fake NIC's send side: each posted send completes into `cq` at once,
/// unless the sends are held (then they complete at `release`). Shared by
/// the fake providers of this file and of `cq_ex`'s tests.
pub(super) struct FakeSends {
    cq: &'static StdMutex<VecDeque<ibv_wc>>,
    held: AtomicBool,
    held_wc: StdMutex<Vec<ibv_wc>>,
}

impl FakeSends {
    pub(super) const fn new(cq: &'static StdMutex<VecDeque<ibv_wc>>) -> FakeSends {
        FakeSends {
            cq,
            held: AtomicBool::new(false),
            held_wc: StdMutex::new(Vec::new()),
        }
    }

    /// The provider's `post_send`: one completion per WR of the chain.
    ///
    /// # Safety
    /// `qp` and the chain at `wr` are the test's, live.
    pub(super) unsafe fn post(&self, qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> c_int {
        let mut w = wr;
        while !w.is_null() {
            // SAFETY: the test's WR chain.
            let r = unsafe { &*w };
            let wc = ibv_wc {
                wr_id: r.wr_id,
                opcode: IBV_WC_SEND,
                // SAFETY: the test's QP.
                qp_num: unsafe { (*qp).qp_num },
                ..ibv_wc::default()
            };
            if self.held.load(Ordering::Relaxed) {
                self.held_wc.lock().unwrap().push(wc);
            } else {
                self.cq.lock().unwrap().push_back(wc);
            }
            w = r.next;
        }
        0
    }

    /// Hold the completions of the sends posted from now on.
    pub(super) fn hold(&self) {
        self.held.store(true, Ordering::Relaxed);
    }

    /// Complete the held sends, in order, and stop holding.
    pub(super) fn release(&self) {
        self.held.store(false, Ordering::Relaxed);
        self.cq
            .lock()
            .unwrap()
            .extend(self.held_wc.lock().unwrap().drain(..));
    }
}

unsafe extern "C" fn fake_post(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the test's QP and WR chain.
    unsafe { SENDS.post(qp, wr) }
}

unsafe extern "C" fn fake_poll(_cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let mut q = FAKE_CQ.lock().unwrap();
    let mut got = 0;
    while got < n
        && let Some(w) = q.pop_front()
    {
        // SAFETY: room for n entries.
        unsafe { wc.add(got as usize).write(w) };
        got += 1;
    }
    got
}

unsafe extern "C" fn fake_notify(_cq: *mut ibv_cq, _s: c_int) -> c_int {
    0
}

struct Fake {
    ctx: Box<[u8]>,
    cq: Box<ibv_cq>,
    qp: Box<ibv_qp>,
}

impl Fake {
    fn ctx(&self) -> *mut ibv_context {
        // SAFETY: 8 bytes of `sz` precede the context in the buffer.
        unsafe { self.ctx.as_ptr().add(8) as *mut ibv_context }
    }
}

/// One fake context (with rdma-core's `sz` word before it), CQ and QP.
fn fake(qpn: u32) -> Fake {
    let size = std::mem::size_of::<ibv_context>();
    let mut ctx = vec![0u8; size + 8].into_boxed_slice();
    ctx[..8].copy_from_slice(&size.to_ne_bytes());
    let p = ctx.as_mut_ptr().wrapping_add(8) as *mut ibv_context;
    // SAFETY: p points at a zeroed ibv_context-sized, aligned region.
    unsafe {
        (*p).ops.poll_cq = Some(fake_poll);
        (*p).ops.req_notify_cq = Some(fake_notify);
        (*p).ops.post_send = Some(fake_post);
    }
    // SAFETY: plain C structs, zero is a valid value.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: as above.
    let mut qp: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = p;
    qp.context = p;
    qp.qp_num = qpn;
    qp.send_cq = &mut *cq;
    assert!(table::add_ctx(p, fake_poll, fake_notify));
    // What the shim's ibv_open_device hook does to a context it wraps.
    // SAFETY: as above.
    unsafe { (*p).ops.poll_cq = Some(ops::poll_cq) };
    set_threshold_ns(50_000_000);
    wrap(p, "fake0");
    // SAFETY: as above.
    let wrapped = unsafe { (*p).ops.post_send };
    assert!(wrapped.is_some_and(|f| f as usize != fake_post as PostSendFn as usize));
    Fake { ctx, cq, qp }
}

fn send(f: &mut Fake, wr_id: u64) {
    let mut wr: ibv_send_wr = {
        // SAFETY: plain C struct.
        unsafe { std::mem::zeroed() }
    };
    wr.wr_id = wr_id;
    wr.opcode = fastwake_verbs_sys::IBV_WR_SEND;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the wrapped op on the fake QP; the program's inline
    // ibv_post_send would call exactly this slot.
    let rc = unsafe { (*f.ctx()).ops.post_send.unwrap()(&mut *f.qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0);
}

fn poll(f: &mut Fake) -> c_int {
    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: the wrapped op on the fake CQ.
    unsafe { (*f.ctx()).ops.poll_cq.unwrap()(&mut *f.cq, 4, wc.as_mut_ptr()) }
}

fn stalls(f: &Fake, qpn: u32) -> (u64, u64, u64) {
    monitor::qp_counts(QpKey {
        ctx: f.ctx() as usize,
        qpn,
    })
    .unwrap()
}

/// Tests that set the monitor's process-wide threshold or drive a fake
/// provider run one at a time (this file's and `cq_ex`'s).
pub(super) static FAKE_PROVIDERS: StdMutex<()> = StdMutex::new(());

// One test drives the fake provider (its CQ is process-wide).
#[test]
fn wrapped_ops_date_match_and_flag_stalls() {
    let _g = FAKE_PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = fake(0x42);
    // 1000 prompt completions: matched, none late.
    for i in 0..1000 {
        send(&mut f, i);
        assert_eq!(poll(&mut f), 1);
    }
    assert_eq!(stalls(&f, 0x42), (1000, 0, 0));
    // A completion held back 60 ms while the program keeps polling:
    // one stall, one episode.
    SENDS.hold();
    send(&mut f, 7);
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(60) {
        assert_eq!(poll(&mut f), 0);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    SENDS.release();
    assert_eq!(poll(&mut f), 1);
    assert_eq!(stalls(&f, 0x42), (1001, 1, 1));
    // Late again, but the program did not look for 60 ms: unobserved.
    send(&mut f, 8);
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert_eq!(poll(&mut f), 1);
    assert_eq!(stalls(&f, 0x42), (1002, 1, 1));
    // Off: nothing is dated.
    set_threshold_ns(0);
    send(&mut f, 9);
    assert_eq!(poll(&mut f), 1);
    assert_eq!(stalls(&f, 0x42).0, 1002);
    set_threshold_ns(50_000_000);

    // The monitor's cost per operation (post + poll of one completion),
    // monitor on vs off, through the wrapped ops with the fake provider
    // (whose own work is a mutex and a VecDeque). Timing: only with
    // FASTWAKE_TEST_MONITOR_COST=1, under `flock -x /tmp/fw-cpu.lock`.
    if std::env::var_os("FASTWAKE_TEST_MONITOR_COST").is_some() {
        let n = 2_000_000;
        let mut per = [0f64; 2];
        for round in 0..6 {
            let on = round % 2 == 0;
            set_threshold_ns(if on { 50_000_000 } else { 0 });
            let t = std::time::Instant::now();
            for i in 0..n {
                send(&mut f, i);
                poll(&mut f);
            }
            let ns = t.elapsed().as_nanos() as f64 / n as f64;
            let k = usize::from(!on);
            per[k] = if per[k] == 0.0 { ns } else { per[k].min(ns) };
        }
        let mut empty = [0f64; 2];
        for (k, on) in [(0, true), (1, false)] {
            set_threshold_ns(if on { 50_000_000 } else { 0 });
            let t = std::time::Instant::now();
            for _ in 0..n {
                poll(&mut f);
            }
            empty[k] = t.elapsed().as_nanos() as f64 / n as f64;
        }
        set_threshold_ns(50_000_000);
        eprintln!(
            "monitor cost: post+poll {:.1} ns on, {:.1} ns off: {:.1} ns per operation; empty poll {:.1} ns on, {:.1} ns off",
            per[0],
            per[1],
            per[0] - per[1],
            empty[0],
            empty[1]
        );
    }
}
