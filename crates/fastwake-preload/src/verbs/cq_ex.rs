//! Extended CQs (`ibv_create_cq_ex`): served like the others, by showing
//! a stashed CQE to the program's `start_poll` batch.
//!
//! The shim sees a CQE without losing it by moving it to the CQ's stash
//! (`event::stash_one`, the provider's `poll_cq`; rdma-core's providers
//! poll an extended CQ through `poll_cq` too, on the same consumer index).
//! A program reads an extended CQ with `ibv_start_poll` / `ibv_next_poll`
//! / `ibv_end_poll`, which call function pointers in the CQ itself
//! (`struct ibv_cq_ex`), and reads the current CQE's fields through its
//! `read_*` pointers. So for each CQ it serves the shim replaces the three
//! batch pointers at creation (before the program has the CQ) and, only
//! while a batch stands on a stashed CQE, the `read_*` pointers the
//! provider set, with readers of the stashed `struct ibv_wc`:
//!
//! - `start_poll`: the stash's first CQE if there is one (`wr_id`,
//!   `status` written into the CQ as the provider does), else the
//!   provider's `start_poll`;
//! - `next_poll`: the shown CQE is consumed; the next stashed one, or the
//!   provider's readers back and the provider's `start_poll` (its batch
//!   starts here; `ENOENT` ends ours as it would have ended the provider's);
//! - `end_poll`: the shown CQE is consumed; the provider's `end_poll` only
//!   if its batch was started.
//!
//! The stall monitor judges what each batch returns, as it judges what the
//! wrapped `poll_cq` returns: a stashed CQE whole, a provider's CQE when the
//! CQ was created with `IBV_WC_EX_WITH_QP_NUM` (the monitor keys by QP).
//! While the monitor is on, it judges the batches of the CQs passed
//! through too (below): their `start_poll` and `next_poll` are the
//! provider's, followed by the same look at the CQE.
//!
//! The CQEs come back in the provider's order, once each. A look never
//! polls the CQ during a batch: the batch and the look exclude each other
//! through one word per CQ ([`Ex::busy`]), so the provider's `start_poll`
//! and a look's `poll_cq` never overlap, even on a CQ created
//! `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (no provider lock).
//!
//! Passed through (counted, said once under `FASTWAKE_VERBOSE=1`): a CQ
//! asking for fields a `struct ibv_wc` does not carry (`wc_flags` beyond
//! `IBV_WC_STANDARD_FLAGS`: timestamps, VLAN, flow tag, tag matching),
//! which a stashed CQE could not show; a CQ without a completion channel
//! (nothing to wait for); and a CQ that finds the tables full. While the
//! stall monitor is on, such a CQ is still judged when it can tell a
//! CQE's QP (`judge_only`).
//!
//! `ibv_create_cq_ex` is `static inline` in verbs.h and calls the
//! `create_cq_ex` slot of the context's `verbs_context`; the shim wraps that
//! slot when the context's `sz` says it has one.

use super::stats;
use super::table::{self, STASHED};
use fastwake_verbs_sys::{
    CreateCqExFn, EndPollFn, IBV_WC_STANDARD_FLAGS, NextPollFn, Read8Fn, Read32Fn, StartPollFn,
    VERBS_CONTEXT_CREATE_CQ_EX_BACK, VERBS_CONTEXT_CREATE_CQ_EX_SZ, ibv_comp_channel, ibv_context,
    ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_poll_cq_attr, ibv_wc,
};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

const MAX: usize = super::table::MAX_CTX;

/// (context, its provider's create_cq_ex), for the contexts wrapped.
static REAL: [(AtomicUsize, AtomicUsize); MAX] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX];
static SAID_PASSED: AtomicBool = AtomicBool::new(false);

/// [`Ex::busy`]: nobody polls the CQ.
const FREE: u8 = 0;
/// The program is in a batch (`start_poll` succeeded, `end_poll` not yet).
const BATCH: u8 = 1;
/// A look is polling the CQ.
const PEEK: u8 = 2;

/// The provider's pointers of one served extended CQ, and its batch state.
pub struct Ex {
    cq: AtomicUsize,
    /// [`FREE`], [`BATCH`] or [`PEEK`].
    busy: AtomicU8,
    /// The batch stands on a stashed CQE (the readers are the shim's).
    /// Only the batch's thread touches this and `provider_batch`.
    showing: AtomicBool,
    /// The provider's `start_poll` succeeded in this batch: its
    /// `end_poll` is owed.
    provider_batch: AtomicBool,
    /// `start_poll`, `next_poll`, `end_poll`, then the readers in
    /// [`READERS`] order (0: the provider left it NULL).
    real: [AtomicUsize; 3 + READERS],
}

/// The `read_*` pointers a stashed `struct ibv_wc` can answer.
const READERS: usize = 10;
/// Where [`Ex::real`] keeps the provider's `read_opcode` and `read_qp_num`.
const REAL_OPCODE: usize = 3;
const REAL_QP_NUM: usize = 3 + 4;

#[allow(clippy::declare_interior_mutable_const)]
const EX_EMPTY: Ex = Ex {
    cq: AtomicUsize::new(0),
    busy: AtomicU8::new(FREE),
    showing: AtomicBool::new(false),
    provider_batch: AtomicBool::new(false),
    real: [const { AtomicUsize::new(0) }; 3 + READERS],
};
static EXS: [Ex; table::MAX_CQ] = [EX_EMPTY; table::MAX_CQ];

/// The served extended CQ `cq`, if it is one.
pub fn slot(cq: *mut ibv_cq) -> Option<&'static Ex> {
    let k = cq as usize;
    if k == 0 {
        return None;
    }
    let h = table::home(k);
    (0..table::MAX_CQ)
        .map(|i| &EXS[(h + i) % table::MAX_CQ])
        .find(|e| e.cq.load(Ordering::Acquire) == k)
}

impl Ex {
    /// Claim the CQ for a look's `poll_cq`; false while a batch runs (or
    /// another look polls): the look skips the CQ and comes back.
    pub fn try_peek(&self) -> bool {
        self.busy
            .compare_exchange(FREE, PEEK, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The look is done with the CQ.
    pub fn end_peek(&self) {
        self.busy.store(FREE, Ordering::Release);
    }

    /// Claim the CQ for the program's batch. A look holds it for one
    /// `poll_cq` of one entry; a batch of another program thread holds it
    /// as the provider's own lock would.
    fn begin_batch(&self) {
        let mut spins = 0u32;
        while self
            .busy
            .compare_exchange_weak(FREE, BATCH, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // A look preempted while it holds the CQ (2 CPUs).
                std::thread::yield_now();
            }
        }
    }

    fn end_batch(&self) {
        self.provider_batch.store(false, Ordering::Relaxed);
        self.busy.store(FREE, Ordering::Release);
    }

    fn real(&self, i: usize) -> usize {
        self.real[i].load(Ordering::Relaxed)
    }

    fn start(&self) -> StartPollFn {
        // SAFETY: stored by `serve` from the CQ's non-null start_poll.
        unsafe { std::mem::transmute::<usize, StartPollFn>(self.real(0)) }
    }

    fn next(&self) -> NextPollFn {
        // SAFETY: stored by `serve` from the CQ's non-null next_poll.
        unsafe { std::mem::transmute::<usize, NextPollFn>(self.real(1)) }
    }

    fn end(&self) -> EndPollFn {
        // SAFETY: stored by `serve` from the CQ's non-null end_poll.
        unsafe { std::mem::transmute::<usize, EndPollFn>(self.real(2)) }
    }
}

/// The readers, as (the CQ's field, the stash's reader) pairs applied by
/// [`readers`]. One place lists them, so showing and restoring agree.
macro_rules! for_each_reader {
    ($m:ident) => {
        $m!(0, read_opcode, Read32Fn, show_opcode);
        $m!(1, read_vendor_err, Read32Fn, show_vendor_err);
        $m!(2, read_byte_len, Read32Fn, show_byte_len);
        $m!(3, read_imm_data, Read32Fn, show_imm_data);
        $m!(4, read_qp_num, Read32Fn, show_qp_num);
        $m!(5, read_src_qp, Read32Fn, show_src_qp);
        $m!(6, read_wc_flags, Read32Fn, show_wc_flags);
        $m!(7, read_slid, Read32Fn, show_slid);
        $m!(8, read_sl, Read8Fn, show_sl);
        $m!(9, read_dlid_path_bits, Read8Fn, show_dlid_path_bits);
    };
}

/// The stashed CQE a batch stands on (the first of the CQ's stash).
fn shown<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&ibv_wc) -> T) -> T {
    table::cq_slot(cq.cast())
        .and_then(|s| {
            let st = table::lock(s);
            (st.len > 0).then(|| f(&st.stash[st.head]))
        })
        .unwrap_or_default()
}

macro_rules! shower {
    ($name:ident, $t:ty, |$w:ident| $e:expr) => {
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            shown(cq, |$w| $e)
        }
    };
}
shower!(show_opcode, u32, |w| w.opcode);
shower!(show_vendor_err, u32, |w| w.vendor_err);
shower!(show_byte_len, u32, |w| w.byte_len);
shower!(show_imm_data, u32, |w| w.imm_data);
shower!(show_qp_num, u32, |w| w.qp_num);
shower!(show_src_qp, u32, |w| w.src_qp);
shower!(show_wc_flags, u32, |w| w.wc_flags);
shower!(show_slid, u32, |w| u32::from(w.slid));
shower!(show_sl, u8, |w| w.sl);
shower!(show_dlid_path_bits, u8, |w| w.dlid_path_bits);

/// Point the CQ's readers the provider set at the stash (`stash`) or back
/// at the provider's.
///
/// # Safety
/// `cq` is a live served CQ and the caller's thread runs its batch.
unsafe fn readers(e: &Ex, cq: *mut ibv_cq_ex, stash: bool) {
    macro_rules! set {
        ($i:expr, $field:ident, $ty:ty, $show:ident) => {
            let real = e.real(3 + $i);
            if real != 0 {
                let f: $ty = if stash {
                    $show
                } else {
                    // SAFETY: stored by `serve` from this non-null field.
                    unsafe { std::mem::transmute::<usize, $ty>(real) }
                };
                // SAFETY: a live CQ whose readers only this batch uses.
                unsafe { (*cq).$field = Some(f) };
            }
        };
    }
    for_each_reader!(set);
}

/// Stand the batch on the stash's first CQE, if the CQ has one.
///
/// # Safety
/// As [`readers`].
unsafe fn show(e: &Ex, cq: *mut ibv_cq_ex) -> bool {
    if STASHED.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(s) = table::cq_slot(cq.cast()) else {
        return false;
    };
    let st = table::lock(s);
    if st.len == 0 {
        return false;
    }
    let w = st.stash[st.head];
    drop(st);
    // SAFETY: the caller's contract; the provider writes these two the same
    // way at each start_poll/next_poll.
    unsafe {
        (*cq).wr_id = w.wr_id;
        (*cq).status = w.status;
    }
    if !e.showing.swap(true, Ordering::Relaxed) {
        // SAFETY: the caller's contract.
        unsafe { readers(e, cq, true) };
    }
    // What the program gets now, as the wrapped poll_cq judges it (a
    // stashed CQE is a whole `struct ibv_wc`, QP number included).
    // SAFETY: one completion of the live CQ.
    unsafe { super::monitor::polled(cq.cast(), &w, 1) };
    true
}

/// The batch moves past the stashed CQE it stood on: it is consumed.
fn consume_shown(cq: *mut ibv_cq_ex) {
    if let Some(s) = table::cq_slot(cq.cast()) {
        let mut st = table::lock(s);
        if st.pop().is_some() {
            STASHED.fetch_sub(1, Ordering::AcqRel);
            stats::add(|s| &s.stash_delivered, 1);
        }
    }
}

/// Give the provider its readers back.
///
/// # Safety
/// As [`readers`].
unsafe fn unshow(e: &Ex, cq: *mut ibv_cq_ex) {
    if e.showing.swap(false, Ordering::Relaxed) {
        // SAFETY: the caller's contract.
        unsafe { readers(e, cq, false) };
    }
}

/// Start the provider's batch (within the program's).
///
/// # Safety
/// As [`readers`].
unsafe fn provider_start(e: &Ex, cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the provider's start_poll on its live CQ, the caller's attr
    // (or a zeroed one, all that verbs.h defines today).
    let r = unsafe { (e.start())(cq, attr) };
    if r == 0 {
        e.provider_batch.store(true, Ordering::Relaxed);
    }
    r
}

/// The stall monitor's view of a batch: the CQE the provider's batch stands
/// on, judged as the wrapped `poll_cq` judges what it returns. The monitor
/// keys completions by QP, so only a CQ created with
/// `IBV_WC_EX_WITH_QP_NUM` (a `read_qp_num`) can be judged.
///
/// # Safety
/// As [`readers`], the provider's batch on a CQE.
unsafe fn judge_current(e: &Ex, cq: *mut ibv_cq_ex) {
    if !super::monitor::on() {
        return;
    }
    let (opcode, qp_num) = (e.real(REAL_OPCODE), e.real(REAL_QP_NUM));
    if opcode == 0 || qp_num == 0 {
        return;
    }
    // SAFETY: the provider's readers of this CQ (stored by `keep_real`),
    // on the CQE its batch stands on. A failed CQE's opcode is undefined
    // (the monitor judges every failed one): not read.
    let w = unsafe {
        let status = (*cq).status;
        ibv_wc {
            wr_id: (*cq).wr_id,
            status,
            opcode: if status == 0 {
                std::mem::transmute::<usize, Read32Fn>(opcode)(cq)
            } else {
                0
            },
            qp_num: std::mem::transmute::<usize, Read32Fn>(qp_num)(cq),
            ..ibv_wc::default()
        }
    };
    // SAFETY: one completion of the live CQ.
    unsafe { super::monitor::polled(cq.cast(), &w, 1) };
}

/// The program found the CQ empty: a look, for the stall monitor.
fn judge_empty(cq: *mut ibv_cq_ex) {
    super::monitor::looked(cq.cast());
}

/// The wrapped `ibv_cq_ex.start_poll`.
///
/// # Safety
/// The provider's start_poll contract: a live CQ, outside a batch.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    let Some(e) = slot(cq.cast()) else {
        // Only reachable if the CQ was destroyed under the program's feet.
        return libc::EINVAL;
    };
    e.begin_batch();
    // SAFETY: the batch is this thread's now.
    if unsafe { show(e, cq) } {
        return 0;
    }
    // SAFETY: as above.
    let r = unsafe { provider_start(e, cq, attr) };
    if r == 0 {
        // SAFETY: the provider's batch stands on a CQE.
        unsafe { judge_current(e, cq) };
    } else {
        // No batch: the program will not call end_poll.
        e.end_batch();
        judge_empty(cq);
    }
    r
}

/// The wrapped `ibv_cq_ex.next_poll`.
///
/// # Safety
/// The provider's next_poll contract: inside a batch.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let Some(e) = slot(cq.cast()) else {
        return libc::EINVAL;
    };
    if !e.showing.load(Ordering::Relaxed) {
        // SAFETY: the provider's batch runs (its start_poll succeeded).
        let r = unsafe { (e.next())(cq) };
        if r == 0 {
            // SAFETY: as above, on its next CQE.
            unsafe { judge_current(e, cq) };
        }
        return r;
    }
    consume_shown(cq);
    // SAFETY: the batch is this thread's.
    if unsafe { show(e, cq) } {
        return 0;
    }
    // SAFETY: as above.
    unsafe { unshow(e, cq) };
    let mut attr = ibv_poll_cq_attr::default();
    // SAFETY: as above; ENOENT (or an error) ends the program's batch, which
    // then calls end_poll, with no provider batch owed.
    let r = unsafe { provider_start(e, cq, &mut attr) };
    if r == 0 {
        // SAFETY: the provider's batch stands on a CQE.
        unsafe { judge_current(e, cq) };
    }
    r
}

/// The wrapped `ibv_cq_ex.end_poll`.
///
/// # Safety
/// The provider's end_poll contract: ends a batch.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    let Some(e) = slot(cq.cast()) else {
        return;
    };
    if e.showing.load(Ordering::Relaxed) {
        consume_shown(cq);
        // SAFETY: the batch is this thread's.
        unsafe { unshow(e, cq) };
    }
    if e.provider_batch.load(Ordering::Relaxed) {
        // SAFETY: the provider's batch started in this batch.
        unsafe { (e.end())(cq) };
    }
    e.end_batch();
}

/// What the shim reads of `struct ibv_cq_init_attr_ex`: two fields of its
/// first version (a program built against an older verbs.h passes a shorter
/// struct, so the later ones are not read).
#[derive(Clone, Copy)]
struct Asked {
    channel: *mut ibv_comp_channel,
    wc_flags: u64,
}

impl Asked {
    /// # Safety
    /// `attr` is the init attr a successful `create_cq_ex` was given.
    unsafe fn read(attr: *const ibv_cq_init_attr_ex) -> Asked {
        // SAFETY: the caller's contract; both fields are in every version.
        unsafe {
            Asked {
                channel: std::ptr::addr_of!((*attr).channel).read(),
                wc_flags: std::ptr::addr_of!((*attr).wc_flags).read(),
            }
        }
    }
}

/// Why an extended CQ cannot be served, if it cannot.
///
/// # Safety
/// `cq` is the live CQ just created as `attr` asked.
unsafe fn unservable(cq: *mut ibv_cq_ex, attr: &Asked) -> Option<&'static str> {
    if attr.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        return Some(
            "it asks for fields beyond a struct ibv_wc's (timestamps, VLAN, flow tag or tag matching), which a CQE the shim looked at could not show",
        );
    }
    if attr.channel.is_null() {
        return Some("it has no completion channel");
    }
    // SAFETY: the caller's contract.
    let c = unsafe { &*cq };
    if c.start_poll.is_none() || c.next_poll.is_none() || c.end_poll.is_none() {
        return Some("its provider set no start_poll/next_poll/end_poll");
    }
    None
}

/// Serve `cq`: manage it in the shim's table and wrap its batch pointers.
/// False when the tables are full (then nothing changed).
///
/// # Safety
/// `cq` is the live CQ just created on `channel` of the wrapped `ctx`; the
/// program has not seen it.
unsafe fn serve(cq: *mut ibv_cq_ex, attr: &Asked, ctx: *mut ibv_context) -> bool {
    let base = cq.cast::<ibv_cq>();
    let Some(e) = claim(cq) else {
        return false;
    };
    if !table::add_cq(base, attr.channel, ctx) {
        e.cq.store(0, Ordering::Release);
        return false;
    }
    if let Some(s) = table::cq_slot(base) {
        // Before any look can poll it: the program has not armed it yet.
        table::lock(s).ex = true;
    }
    // SAFETY: the caller's contract: a live CQ nobody else uses yet.
    let c = unsafe { &mut *cq };
    keep_real(e, c);
    e.cq.store(cq as usize, Ordering::Release);
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    true
}

/// An entry of [`EXS`] for `cq` (marked taken, not yet findable).
fn claim(cq: *mut ibv_cq_ex) -> Option<&'static Ex> {
    let h = table::home(cq as usize);
    (0..table::MAX_CQ)
        .map(|i| &EXS[(h + i) % table::MAX_CQ])
        .find(|e| {
            e.cq.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
}

/// Keep the provider's batch and reader pointers of `c` in `e`, with the
/// batch state reset.
fn keep_real(e: &Ex, c: &ibv_cq_ex) {
    let ptr = |f: Option<usize>| f.unwrap_or(0);
    e.real[0].store(ptr(c.start_poll.map(|f| f as usize)), Ordering::Relaxed);
    e.real[1].store(ptr(c.next_poll.map(|f| f as usize)), Ordering::Relaxed);
    e.real[2].store(ptr(c.end_poll.map(|f| f as usize)), Ordering::Relaxed);
    macro_rules! save {
        ($i:expr, $field:ident, $ty:ty, $show:ident) => {
            e.real[3 + $i].store(ptr(c.$field.map(|f| f as usize)), Ordering::Relaxed);
        };
    }
    for_each_reader!(save);
    e.busy.store(FREE, Ordering::Relaxed);
    e.showing.store(false, Ordering::Relaxed);
    e.provider_batch.store(false, Ordering::Relaxed);
}

/// Judge a CQ the shim passes through: while the stall monitor is on, its
/// `start_poll` and `next_poll` become the provider's followed by the
/// monitor's look at the CQE they stand on (`end_poll` stays the
/// provider's). A polling program's CQs have no channel and are never
/// served, and they are the ones whose stalls cost the most to find.
/// False, and nothing changed, when the monitor is off, the provider set
/// no batch pointers, the CQ cannot tell a CQE's QP (created without
/// `IBV_WC_EX_WITH_QP_NUM`: nothing to judge, so nothing is wrapped) or
/// the tables are full.
///
/// # Safety
/// `cq` is a live extended CQ just created; the program has not seen it.
unsafe fn judge_only(cq: *mut ibv_cq_ex) -> bool {
    // SAFETY: the caller's contract: a live CQ nobody else uses yet.
    let c = unsafe { &mut *cq };
    let judged = super::monitor::on() && c.read_opcode.is_some() && c.read_qp_num.is_some();
    // A busy-polling thread's empty start_poll may sleep on the CQ's
    // shim-owned channel (`crate::pollers`).
    let polled = super::owned::channel_of(cq.cast()).is_some();
    if !(judged || polled) || c.start_poll.is_none() || c.next_poll.is_none() {
        return false;
    }
    let Some(e) = claim(cq) else {
        return false;
    };
    keep_real(e, c);
    e.cq.store(cq as usize, Ordering::Release);
    c.start_poll = Some(judged_start_poll);
    c.next_poll = Some(judged_next_poll);
    true
}

/// `start_poll` of a CQ the shim only judges ([`judge_only`]).
///
/// # Safety
/// The provider's start_poll contract.
unsafe extern "C" fn judged_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    let Some(e) = slot(cq.cast()) else {
        // Only reachable if the CQ was destroyed under the program's feet.
        return libc::EINVAL;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let mut r = unsafe { (e.start())(cq, attr) };
    if crate::pollers::on() {
        let base: *mut ibv_cq = cq.cast();
        if r == 0 {
            crate::pollers::completion();
        } else if r == libc::ENOENT
            && !matches!(
                crate::pollers::empty(crate::pollset::Key::Cq(base as usize), |s| s.add_cq(base)),
                crate::pollers::Next::Empty
            )
        {
            // SAFETY: as above: the thread slept outside any batch; the
            // caller's start_poll, made again.
            r = unsafe { (e.start())(cq, attr) };
            if r == 0 {
                crate::pollers::completion();
            }
        }
    }
    if r == 0 {
        // SAFETY: the provider's batch stands on a CQE.
        unsafe { judge_current(e, cq) };
    } else {
        judge_empty(cq);
    }
    r
}

/// `next_poll` of a CQ the shim only judges ([`judge_only`]).
///
/// # Safety
/// The provider's next_poll contract.
unsafe extern "C" fn judged_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let Some(e) = slot(cq.cast()) else {
        return libc::EINVAL;
    };
    // SAFETY: forwarding the caller's argument unchanged.
    let r = unsafe { (e.next())(cq) };
    if r == 0 {
        // SAFETY: as above, on its next CQE.
        unsafe { judge_current(e, cq) };
    }
    r
}

/// Forget a destroyed CQ (after the provider's destroy succeeded).
pub fn destroyed(cq: *mut ibv_cq) {
    if let Some(e) = slot(cq) {
        e.cq.store(0, Ordering::Release);
    }
}

/// The `create_cq_ex` slot of `ctx`, if its `verbs_context` has one.
///
/// # Safety
/// `ctx` is a live context that `super::understood` accepted (rdma-core's
/// `verbs_context` layout, `sz` readable just before it).
unsafe fn create_slot(ctx: *mut ibv_context) -> Option<*mut Option<CreateCqExFn>> {
    // SAFETY: the caller's contract: `sz` is the size_t before the context.
    let sz = unsafe { *(ctx as *const usize).sub(1) };
    (sz >= VERBS_CONTEXT_CREATE_CQ_EX_SZ).then(|| {
        // SAFETY: inside the provider's verbs_context, which `sz` says
        // reaches this far back (verbs.h's verbs_get_ctx_op test).
        unsafe { (ctx as *mut u8).sub(VERBS_CONTEXT_CREATE_CQ_EX_BACK) }.cast()
    })
}

/// Wrap `ctx`'s `create_cq_ex` (from `ibv_open_device`, before the program
/// sees the context).
///
/// # Safety
/// As for [`create_slot`]; no other thread has the context yet.
pub(super) unsafe fn wrap(ctx: *mut ibv_context) {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { create_slot(ctx) }) else {
        return;
    };
    // SAFETY: a slot inside the live verbs_context.
    let Some(real) = (unsafe { p.read() }) else {
        return;
    };
    let Some(e) = REAL.iter().find(|e| {
        e.0.compare_exchange(0, ctx as usize, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            || e.0.load(Ordering::Acquire) == ctx as usize
    }) else {
        return;
    };
    e.1.store(real as usize, Ordering::Release);
    // SAFETY: as above; the program has not seen the context yet.
    unsafe { p.write(Some(create_cq_ex)) };
}

/// Forget a closed context.
pub(super) fn forget(ctx: *mut ibv_context) {
    for e in REAL.iter() {
        if e.0.load(Ordering::Acquire) == ctx as usize {
            e.1.store(0, Ordering::Relaxed);
            e.0.store(0, Ordering::Release);
        }
    }
}

/// The wrapped `verbs_context.create_cq_ex`: the provider's, then served
/// (or counted as passed through, and said once).
///
/// # Safety
/// The provider's `create_cq_ex` contract.
unsafe extern "C" fn create_cq_ex(ctx: *mut ibv_context, attr: *mut c_void) -> *mut c_void {
    let real = REAL
        .iter()
        .find(|e| e.0.load(Ordering::Acquire) == ctx as usize)
        .map(|e| e.1.load(Ordering::Acquire))
        .unwrap_or(0);
    if real == 0 {
        // Only reachable if the context was closed under the program's feet.
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
        return std::ptr::null_mut();
    }
    // SAFETY: the provider's function, stored by `wrap` from this context.
    let real = unsafe { std::mem::transmute::<usize, CreateCqExFn>(real) };
    // A CQ made without a channel gets one of the shim's when polling
    // threads may sleep (`crate::pollers`): given in the caller's attr for
    // the call, the caller's null put back after it.
    let own = if !attr.is_null() && crate::pollers::on() {
        // SAFETY: the caller's init attr (readable, as the provider reads
        // it); `channel` is in every version of it.
        let ch = unsafe { std::ptr::addr_of_mut!((*attr.cast::<ibv_cq_init_attr_ex>()).channel) };
        // SAFETY: as above.
        if unsafe { ch.read() }.is_null() {
            let own = super::owned::create(ctx);
            // SAFETY: as above, the caller's own memory for the call.
            unsafe { ch.write(own) };
            Some((ch, own)).filter(|(_, o)| !o.is_null())
        } else {
            None
        }
    } else {
        None
    };
    // SAFETY: forwarding the caller's arguments (with the shim's channel
    // where the caller gave none).
    let mut cq = unsafe { real(ctx, attr) };
    if let Some((ch, own)) = own {
        // SAFETY: put the caller's null back.
        unsafe { ch.write(std::ptr::null_mut()) };
        if cq.is_null() {
            super::owned::abandon(own);
            // SAFETY: exactly the caller's call.
            cq = unsafe { real(ctx, attr) };
        } else {
            let _ = super::owned::add(cq.cast(), own);
        }
    }
    if cq.is_null() || attr.is_null() {
        return cq;
    }
    let cq_ex = cq.cast::<ibv_cq_ex>();
    // SAFETY: the create succeeded, so attr was a readable init attr.
    let a = unsafe { Asked::read(attr.cast()) };
    let served = crate::guarded(
        || {
            // SAFETY: a live CQ just created as `a` asked on the wrapped
            // `ctx`; the program has not seen it.
            if let Some(why) = unsafe { unservable(cq_ex, &a) } {
                return Err(why);
            }
            // SAFETY: as above.
            if unsafe { serve(cq_ex, &a, ctx) } {
                Ok(())
            } else {
                Err("the shim's CQ tables are full")
            }
        },
        || Err("the shim failed to wrap it"),
    );
    match served {
        Ok(()) => {
            stats::add(|s| &s.cqs, 1);
            stats::add(|s| &s.cqs_ex_served, 1);
        }
        Err(why) => {
            stats::add(|s| &s.cqs_ex, 1);
            // SAFETY: the live CQ just created; the program has not seen it.
            let judged = crate::guarded(|| unsafe { judge_only(cq_ex) }, || false);
            if crate::config::verbose() && !SAID_PASSED.swap(true, Ordering::Relaxed) {
                let monitor = if judged && super::monitor::on() {
                    "; the stall monitor still judges its start_poll batches"
                } else {
                    ""
                };
                crate::diag(&format!(
                    "verbs: an extended CQ (ibv_create_cq_ex) passes through: {why}; its waits see only the kernel's events{monitor}"
                ));
            }
        }
    }
    cq
}

#[cfg(test)]
#[path = "cq_ex_tests.rs"]
mod tests;
