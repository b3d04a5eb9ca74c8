//! Extended CQs served on the host: a fake provider whose extended CQ is
//! read in `start_poll` batches and polled by `poll_cq`, driven through the
//! shim's wrapped pointers as a program's inline `ibv_start_poll` /
//! `ibv_next_poll` / `ibv_end_poll` / `ibv_wc_read_*` would, while the
//! shim's looks (`event::channel_ready`) stash CQEs. Every CQE must reach
//! the program once, in order, with every field, and the provider must
//! never be entered by a look during a batch (it counts overlaps).

use super::*;
use crate::verbs::event;
use fastwake::stall::QpKey;
use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_WITH_IMM, ibv_qp, ibv_send_wr};
use std::collections::VecDeque;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::AtomicU64;

/// The fake CQ's entries: the provider's ring.
static RING: StdMutex<VecDeque<ibv_wc>> = StdMutex::new(VecDeque::new());
/// The provider is inside a batch or a poll (its lock, as a flag).
static INSIDE: AtomicBool = AtomicBool::new(false);
/// Times the provider was entered while already inside: must stay 0.
static OVERLAPS: AtomicU64 = AtomicU64::new(0);
/// The batch's current entry was consumed by a next_poll that hit ENOENT.
static SPENT: AtomicBool = AtomicBool::new(false);
/// One test at a time: the fake provider and the monitor are global.
use crate::verbs::monitor_tests::FAKE_PROVIDERS as SERIAL;
use crate::verbs::monitor_tests::FakeSends;

fn enter() {
    if INSIDE.swap(true, Ordering::AcqRel) {
        OVERLAPS.fetch_add(1, Ordering::Relaxed);
    }
}

fn front() -> ibv_wc {
    *RING.lock().unwrap().front().expect("a read outside a CQE")
}

unsafe extern "C" fn fake_poll(_cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    enter();
    let mut got = 0;
    {
        let mut q = RING.lock().unwrap();
        while got < n
            && let Some(w) = q.pop_front()
        {
            // SAFETY: room for n entries.
            unsafe { wc.add(got as usize).write(w) };
            got += 1;
        }
    }
    INSIDE.store(false, Ordering::Release);
    got
}

unsafe extern "C" fn fake_notify(_cq: *mut ibv_cq, _s: c_int) -> c_int {
    0
}

/// Write the current entry's wr_id and status, as a provider does.
fn current(cq: *mut ibv_cq_ex) -> c_int {
    match RING.lock().unwrap().front() {
        Some(w) => {
            // SAFETY: the test's live CQ.
            unsafe {
                (*cq).wr_id = w.wr_id;
                (*cq).status = w.status;
            }
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn fake_start(cq: *mut ibv_cq_ex, _a: *mut ibv_poll_cq_attr) -> c_int {
    enter();
    SPENT.store(false, Ordering::Relaxed);
    let r = current(cq);
    if r != 0 {
        INSIDE.store(false, Ordering::Release);
    }
    r
}

unsafe extern "C" fn fake_next(cq: *mut ibv_cq_ex) -> c_int {
    RING.lock().unwrap().pop_front();
    let r = current(cq);
    SPENT.store(r != 0, Ordering::Relaxed);
    r
}

unsafe extern "C" fn fake_end(_cq: *mut ibv_cq_ex) {
    if !SPENT.load(Ordering::Relaxed) {
        RING.lock().unwrap().pop_front();
    }
    INSIDE.store(false, Ordering::Release);
}

unsafe extern "C" fn fake_opcode(_cq: *mut ibv_cq_ex) -> u32 {
    front().opcode
}
unsafe extern "C" fn fake_byte_len(_cq: *mut ibv_cq_ex) -> u32 {
    front().byte_len
}
unsafe extern "C" fn fake_imm(_cq: *mut ibv_cq_ex) -> u32 {
    front().imm_data
}
unsafe extern "C" fn fake_qp_num(_cq: *mut ibv_cq_ex) -> u32 {
    front().qp_num
}
unsafe extern "C" fn fake_wc_flags(_cq: *mut ibv_cq_ex) -> u32 {
    front().wc_flags
}
unsafe extern "C" fn fake_sl(_cq: *mut ibv_cq_ex) -> u8 {
    front().sl
}

/// CQE number `i`: every field the fake CQ offers derived from it.
fn cqe(i: u64) -> ibv_wc {
    ibv_wc {
        wr_id: i,
        status: (i % 7 == 3) as u32 * 5,
        opcode: IBV_WC_RECV,
        byte_len: (i % 4096) as u32,
        imm_data: (i as u32).wrapping_mul(2_654_435_761),
        qp_num: 0x100 + (i % 3) as u32,
        wc_flags: IBV_WC_WITH_IMM,
        sl: (i % 16) as u8,
        ..ibv_wc::default()
    }
}

struct Fake {
    _ctx: Box<[u8]>,
    ctx: *mut ibv_context,
    channel: Box<u64>,
    cq: Box<ibv_cq_ex>,
}

impl Fake {
    fn new() -> Fake {
        let mut f = Fake::unserved();
        let attr = f.attr(fastwake_verbs_sys::IBV_WC_STANDARD_FLAGS);
        let cq = f.cq();
        // SAFETY: a live fake CQ nobody else uses yet.
        assert_eq!(unsafe { unservable(cq, &attr) }, None);
        // SAFETY: as above.
        assert!(unsafe { serve(cq, &attr, f.ctx) });
        f
    }

    /// The fake CQ as its provider made it: neither served nor judged.
    fn unserved() -> Fake {
        RING.lock().unwrap().clear();
        OVERLAPS.store(0, Ordering::Relaxed);
        INSIDE.store(false, Ordering::Relaxed);
        let mut buf = vec![0u8; 8 + std::mem::size_of::<ibv_context>()].into_boxed_slice();
        // 8 bytes of `sz` precede the context in the buffer.
        let ctx = buf[8..].as_mut_ptr().cast::<ibv_context>();
        assert!(table::add_ctx(ctx, fake_poll, fake_notify));
        // SAFETY: plain data: pointers, integers and pthread words, all
        // valid as zeros.
        let mut cq = Box::new(unsafe { std::mem::zeroed::<ibv_cq_ex>() });
        cq.context = ctx;
        cq.start_poll = Some(fake_start);
        cq.next_poll = Some(fake_next);
        cq.end_poll = Some(fake_end);
        cq.read_opcode = Some(fake_opcode);
        cq.read_byte_len = Some(fake_byte_len);
        cq.read_imm_data = Some(fake_imm);
        cq.read_qp_num = Some(fake_qp_num);
        cq.read_wc_flags = Some(fake_wc_flags);
        cq.read_sl = Some(fake_sl);
        Fake {
            _ctx: buf,
            ctx,
            channel: Box::new(0),
            cq,
        }
    }

    /// What the program asks for, read as the shim reads it.
    fn attr(&mut self, wc_flags: u64) -> Asked {
        let a = ibv_cq_init_attr_ex {
            cqe: 64,
            cq_context: std::ptr::null_mut(),
            channel: self.channel(),
            comp_vector: 0,
            wc_flags,
            comp_mask: 0,
            flags: 0,
            parent_domain: std::ptr::null_mut(),
        };
        // SAFETY: a whole init attr.
        unsafe { Asked::read(&a) }
    }

    fn channel(&mut self) -> *mut ibv_comp_channel {
        (&mut *self.channel as *mut u64).cast()
    }

    fn cq(&mut self) -> *mut ibv_cq_ex {
        &mut *self.cq
    }

    /// The program armed the CQ: what makes a look poll it.
    fn arm(&mut self) {
        let s = table::cq_slot(self.cq().cast()).expect("managed");
        table::lock(s).app_armed = true;
    }

    /// One look at the channel, as a spinning wait or a dispatcher does.
    fn look(&mut self) -> bool {
        self.arm();
        event::channel_ready(self.channel(), -1)
    }

    /// One program batch of at most `max` CQEs, each read whole.
    fn batch(&mut self, max: usize, out: &mut Vec<ibv_wc>) {
        let cq = self.cq();
        // SAFETY: the pointers the program would call, on the live CQ.
        unsafe {
            let mut attr = ibv_poll_cq_attr::default();
            if ((*cq).start_poll.unwrap())(cq, &mut attr) != 0 {
                return;
            }
            let mut taken = 0;
            loop {
                let c = &*cq;
                out.push(ibv_wc {
                    wr_id: c.wr_id,
                    status: c.status,
                    opcode: (c.read_opcode.unwrap())(cq),
                    byte_len: (c.read_byte_len.unwrap())(cq),
                    imm_data: (c.read_imm_data.unwrap())(cq),
                    qp_num: (c.read_qp_num.unwrap())(cq),
                    wc_flags: (c.read_wc_flags.unwrap())(cq),
                    sl: (c.read_sl.unwrap())(cq),
                    ..ibv_wc::default()
                });
                taken += 1;
                if taken == max || ((*cq).next_poll.unwrap())(cq) != 0 {
                    break;
                }
            }
            ((*cq).end_poll.unwrap())(cq);
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let cq = self.cq().cast::<ibv_cq>();
        if let Some(s) = table::cq_slot(cq) {
            table::remove_cq(s);
        }
        destroyed(cq);
        table::remove_ctx(self.ctx);
    }
}

fn check(got: &[ibv_wc], n: u64) {
    assert_eq!(got.len() as u64, n, "lost or duplicated CQEs");
    for (i, w) in got.iter().enumerate() {
        assert_eq!(*w, cqe(i as u64), "CQE {i} (in order, every field)");
    }
    assert_eq!(
        OVERLAPS.load(Ordering::Relaxed),
        0,
        "a look entered a batch"
    );
}

/// xorshift: the draws of the randomized interleavings.
fn rng(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn a_cq_asking_for_more_than_a_wc_carries_passes_through() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = Fake::new();
    let cq = f.cq();
    for extra in [1u64 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11] {
        let a = f.attr(fastwake_verbs_sys::IBV_WC_STANDARD_FLAGS | extra);
        // SAFETY: the live fake CQ.
        let why = unsafe { unservable(cq, &a) };
        assert!(why.is_some(), "wc_flags {extra:#x}");
    }
    let mut a = f.attr(0);
    a.channel = std::ptr::null_mut();
    // SAFETY: as above.
    assert!(unsafe { unservable(cq, &a) }.is_some(), "no channel");
}

#[test]
fn stashed_cqes_reach_start_poll_batches_once_in_order_with_every_field() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = Fake::new();
    let (mut s, mut next, mut got) = (0x9E37_79B9_7F4A_7C15u64, 0u64, Vec::new());
    for _ in 0..20_000 {
        match rng(&mut s) % 4 {
            0 => {
                for _ in 0..rng(&mut s) % 4 {
                    RING.lock().unwrap().push_back(cqe(next));
                    next += 1;
                }
            }
            1 => {
                f.look();
            }
            _ => {
                let max = 1 + (rng(&mut s) % 5) as usize;
                f.batch(max, &mut got);
            }
        }
    }
    // Bounded: a CQE the batches never get fails the check, not the clock.
    for _ in 0..next {
        if got.len() as u64 == next {
            break;
        }
        f.look();
        f.batch(8, &mut got);
    }
    check(&got, next);
    // Nothing left behind, and the provider's readers are back.
    let cq = f.cq();
    // SAFETY: the live fake CQ.
    let opcode = unsafe { (*cq).read_opcode }.map(|f| f as usize);
    assert_eq!(opcode, Some(fake_opcode as Read32Fn as usize));
}

#[test]
fn looks_from_another_thread_never_enter_a_batch() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Each run checks every CQE; a run whose looking thread never found one
    // (it got no CPU while the batches ran: three threads on two CPUs, with
    // other tests beside them) did not test the exclusion, so it runs again.
    for _ in 0..5 {
        if looks_beside_batches() > 0 {
            return;
        }
    }
    panic!("in 5 runs the looking thread never found a CQE: the test did not test");
}

/// One run of [`looks_from_another_thread_never_enter_a_batch`]: how many
/// looks found a CQE.
fn looks_beside_batches() -> u64 {
    let mut f = Fake::new();
    const N: u64 = 60_000;
    let stop = AtomicBool::new(false);
    let looks = AtomicU64::new(0);
    let channel = f.channel() as usize;
    let cq = f.cq() as usize;
    let mut got = Vec::new();
    /// Stops the looking thread however the test ends (a failed assertion
    /// must fail the test, not hang it).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|t| {
        // A dispatcher or another thread's spinning wait, looking on.
        t.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let s = table::cq_slot(cq as *mut ibv_cq).expect("managed");
                table::lock(s).app_armed = true;
                if event::channel_ready(channel as *mut ibv_comp_channel, -1) {
                    looks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        // The NIC.
        t.spawn(|| {
            for i in 0..N {
                RING.lock().unwrap().push_back(cqe(i));
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let _stop = Stop(&stop);
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        // Bounded: a lost CQE fails the check instead of hanging the test.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (got.len() as u64) < N && std::time::Instant::now() < deadline {
            let max = 1 + (rng(&mut s) % 6) as usize;
            f.batch(max, &mut got);
        }
    });
    check(&got, N);
    looks.load(Ordering::Relaxed)
}

/// What serving costs a program that polls an empty extended CQ: its
/// `start_poll` through the shim against the provider's own, alternated
/// in one run: a served CQ (a lookup and a claim of the CQ) with the stall
/// monitor off and on (then the empty batch is also a look), and a CQ
/// passed through that the monitor judges (a lookup and the look). Prints;
/// asserts nothing about time (run with `--ignored --nocapture`;
/// docs/guide/rdma.md quotes it).
#[test]
#[ignore]
fn cost_of_an_empty_start_poll() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const N: u32 = 2_000_000;
    let mut attr = ibv_poll_cq_attr::default();
    let attr_p: *mut ibv_poll_cq_attr = &mut attr;
    let time = |call: &dyn Fn() -> c_int| {
        let t = std::time::Instant::now();
        for _ in 0..N {
            assert_eq!(call(), libc::ENOENT);
        }
        t.elapsed().as_nanos() as f64 / f64::from(N)
    };
    let rounds = |what: &str, cq: *mut ibv_cq_ex| {
        for round in 0..5 {
            // SAFETY: the live fake CQ, outside a batch.
            let shim = time(&|| unsafe { ((*cq).start_poll.unwrap())(cq, attr_p) });
            // SAFETY: as above.
            let direct = time(&|| unsafe { fake_start(cq, attr_p) });
            println!(
                "{what}, round {round}: empty start_poll through the shim {shim:.1} ns, the provider's own {direct:.1} ns: +{:.1} ns",
                shim - direct
            );
        }
    };
    let mut f = Fake::new();
    super::super::monitor::set_threshold_ns(0);
    rounds("served, monitor off", f.cq());
    super::super::monitor::set_threshold_ns(50_000_000);
    rounds("served, monitor on", f.cq());
    drop(f);
    let mut f = Fake::unserved();
    let cq = f.cq();
    // SAFETY: the live fake CQ, not served.
    assert!(unsafe { judge_only(cq) });
    rounds("passed through, judged", cq);
}

/// The fake NIC's send side, completing into the fake CQ's ring.
static SENDS: FakeSends = FakeSends::new(&RING);

unsafe extern "C" fn fake_post(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the test's QP and WR chain.
    unsafe { SENDS.post(qp, wr) }
}

#[test]
fn the_stall_monitor_judges_what_batches_return() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    super::super::monitor::set_threshold_ns(50_000_000);
    stalls_named_through_batches(Fake::new(), 0x77, true);
}

#[test]
fn the_stall_monitor_judges_the_batches_of_a_cq_passed_through() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = Fake::unserved();
    let cq = f.cq();
    super::super::monitor::set_threshold_ns(0);
    // SAFETY: the live fake CQ, not served.
    assert!(!unsafe { judge_only(cq) }, "judged with the monitor off");
    assert_eq!(
        f.cq.start_poll.map(|p| p as usize),
        Some(fake_start as StartPollFn as usize),
        "changed with the monitor off"
    );
    super::super::monitor::set_threshold_ns(50_000_000);
    // A CQ that cannot tell a CQE's QP is left as it is.
    let qp_num = f.cq.read_qp_num.take();
    // SAFETY: as above.
    assert!(!unsafe { judge_only(cq) }, "judged without read_qp_num");
    f.cq.read_qp_num = qp_num;
    // SAFETY: as above.
    assert!(unsafe { judge_only(cq) });
    assert_eq!(
        f.cq.end_poll.map(|p| p as usize),
        Some(fake_end as EndPollFn as usize),
        "end_poll is the provider's"
    );
    stalls_named_through_batches(f, 0x78, false);
}

/// Sends on QP `qpn` (one QP number per test: the monitor keeps what it
/// learnt of a QP) whose completions a program reads in `start_poll`
/// batches of `f`'s CQ (`served`: and one through a look's stash): on
/// time, then one held 60 ms while the batches find nothing, which the
/// monitor must name as a stall.
fn stalls_named_through_batches(mut f: Fake, qpn: u32, served: bool) {
    // SAFETY: the fake context: its ops, then the monitor's wrap of
    // post_send, as the shim's ibv_open_device hook does.
    unsafe { (*f.ctx).ops.post_send = Some(fake_post) };
    super::super::monitor::wrap(f.ctx, "fakeex0");
    // SAFETY: plain C struct.
    let mut qp: Box<ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
    qp.context = f.ctx;
    qp.qp_num = qpn;
    let mut send = |f: &mut Fake, wr_id: u64| {
        // SAFETY: plain C struct.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = fastwake_verbs_sys::IBV_WR_SEND;
        let mut bad = std::ptr::null_mut();
        // SAFETY: the wrapped op, as the program's inline ibv_post_send.
        let rc = unsafe { (*f.ctx).ops.post_send.unwrap()(&mut *qp, &mut wr, &mut bad) };
        assert_eq!(rc, 0);
    };
    let counts = |f: &Fake| {
        super::super::monitor::qp_counts(QpKey {
            ctx: f.ctx as usize,
            qpn,
        })
        .unwrap_or_default()
    };
    let mut got = Vec::new();
    // On time, through the provider's batches and through a stashed CQE.
    send(&mut f, 1);
    f.batch(4, &mut got);
    send(&mut f, 2);
    if served {
        assert!(f.look());
    }
    f.batch(4, &mut got);
    assert_eq!(got.len(), 2);
    assert_eq!(counts(&f), (2, 0, 0));
    // Held 60 ms while the program's batches keep finding nothing: a stall.
    SENDS.hold();
    send(&mut f, 3);
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(60) {
        f.batch(4, &mut got);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    SENDS.release();
    f.batch(4, &mut got);
    assert_eq!(got.len(), 3);
    assert_eq!(counts(&f), (3, 1, 1));
    super::super::monitor::unwrap(f.ctx);
}
