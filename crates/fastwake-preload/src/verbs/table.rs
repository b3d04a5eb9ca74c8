//! The shim's bookkeeping: which contexts it wrapped, which CQs it manages,
//! and each CQ's event accounting and CQE stash.
//!
//! Fixed-size static tables (no allocation on hook paths, nothing to free at
//! exit). A CQ that does not fit, or that belongs to a context the shim did
//! not wrap, is simply not managed: every hook passes it through.

use fastwake_verbs_sys::{PollCqFn, ReqNotifyCqFn, ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

pub const MAX_CTX: usize = 32;
pub const MAX_CQ: usize = 256;
/// CQEs one CQ's stash holds. The shim stashes at most one per look (it only
/// needs to know a CQE is there), so this is plenty.
pub const STASH: usize = 16;

/// A wrapped context: its provider's real data-path ops.
pub struct CtxSlot {
    pub ctx: AtomicUsize,
    pub poll: AtomicUsize,
    pub notify: AtomicUsize,
    /// Set when the program used a direct-verbs API (mlx5dv_init_obj) on
    /// this context: it may read CQ buffers itself, so the shim stops
    /// stashing, synthesizing and skipping arms for all its CQs.
    pub hands_off: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const CTX_EMPTY: CtxSlot = CtxSlot {
    ctx: AtomicUsize::new(0),
    poll: AtomicUsize::new(0),
    notify: AtomicUsize::new(0),
    hands_off: AtomicBool::new(false),
};
pub static CTXS: [CtxSlot; MAX_CTX] = [CTX_EMPTY; MAX_CTX];

/// Find the slot of `ctx`.
pub fn ctx_slot(ctx: *mut ibv_context) -> Option<&'static CtxSlot> {
    let k = ctx as usize;
    CTXS.iter().find(|s| s.ctx.load(Ordering::Acquire) == k)
}

/// The real poll_cq / req_notify_cq of `ctx`.
pub fn real_ops(ctx: *mut ibv_context) -> Option<(PollCqFn, ReqNotifyCqFn)> {
    let s = ctx_slot(ctx)?;
    let (p, n) = (
        s.poll.load(Ordering::Relaxed),
        s.notify.load(Ordering::Relaxed),
    );
    if p == 0 || n == 0 {
        return None;
    }
    // SAFETY: both were copied from the provider's ops table of this context
    // (non-null function pointers of these types) before it was published.
    unsafe {
        Some((
            std::mem::transmute::<usize, PollCqFn>(p),
            std::mem::transmute::<usize, ReqNotifyCqFn>(n),
        ))
    }
}

/// Register a wrapped context. False when the table is full.
pub fn add_ctx(ctx: *mut ibv_context, poll: PollCqFn, notify: ReqNotifyCqFn) -> bool {
    for s in CTXS.iter() {
        if s.ctx
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.poll.store(poll as usize, Ordering::Relaxed);
            s.notify.store(notify as usize, Ordering::Relaxed);
            s.hands_off.store(false, Ordering::Relaxed);
            s.ctx.store(ctx as usize, Ordering::Release);
            return true;
        }
    }
    false
}

/// Forget a context (at close).
pub fn remove_ctx(ctx: *mut ibv_context) {
    if let Some(s) = ctx_slot(ctx) {
        s.ctx.store(0, Ordering::Release);
    }
}

/// Event accounting of one managed CQ. See `event.rs` for the rules.
#[derive(Clone, Copy)]
pub struct CqState {
    /// The program asked for a notification (req_notify_cq) and has not
    /// received an event since.
    pub app_armed: bool,
    /// A real arm is outstanding: its event has not been read yet.
    pub real_armed: bool,
    /// A synthetic event was delivered while `real_armed`: the real event
    /// that arm produces announces a CQE the program already heard of.
    pub swallow_next: bool,
    /// The program armed with solicited_only: the shim leaves the CQ alone.
    pub solicited: bool,
    /// An extended CQ: a look must not poll it while the program is in a
    /// `start_poll` batch (`cq_ex::Ex::try_peek`).
    pub ex: bool,
    /// Real events delivered to the program and not yet acked by it.
    pub real_unacked: u32,
    /// CQEs taken from the provider by the shim, in order, for the program.
    pub stash: [ibv_wc; STASH],
    pub head: usize,
    pub len: usize,
}

const WC_ZERO: ibv_wc = ibv_wc {
    wr_id: 0,
    status: 0,
    opcode: 0,
    vendor_err: 0,
    byte_len: 0,
    imm_data: 0,
    qp_num: 0,
    src_qp: 0,
    wc_flags: 0,
    pkey_index: 0,
    slid: 0,
    sl: 0,
    dlid_path_bits: 0,
};

impl CqState {
    pub const NEW: CqState = CqState {
        app_armed: false,
        real_armed: false,
        swallow_next: false,
        solicited: false,
        ex: false,
        real_unacked: 0,
        stash: [WC_ZERO; STASH],
        head: 0,
        len: 0,
    };

    pub fn push(&mut self, wc: ibv_wc) {
        debug_assert!(self.len < STASH);
        self.stash[(self.head + self.len) % STASH] = wc;
        self.len += 1;
    }

    pub fn pop(&mut self) -> Option<ibv_wc> {
        if self.len == 0 {
            return None;
        }
        let w = self.stash[self.head];
        self.head = (self.head + 1) % STASH;
        self.len -= 1;
        Some(w)
    }
}

/// A managed CQ.
pub struct CqSlot {
    pub cq: AtomicUsize,
    pub channel: AtomicUsize,
    pub ctx: AtomicUsize,
    pub state: Mutex<CqState>,
}

#[allow(clippy::declare_interior_mutable_const)]
const CQ_EMPTY: CqSlot = CqSlot {
    cq: AtomicUsize::new(0),
    channel: AtomicUsize::new(0),
    ctx: AtomicUsize::new(0),
    state: Mutex::new(CqState::NEW),
};
pub static CQS: [CqSlot; MAX_CQ] = [CQ_EMPTY; MAX_CQ];

/// CQEs stashed over all CQs: lets the poll_cq wrapper skip every lookup
/// while it is zero (the common case).
pub static STASHED: AtomicU32 = AtomicU32::new(0);

/// Where a CQ's search starts (in this table and `cq_ex`'s).
pub fn home(cq: usize) -> usize {
    (cq >> 6).wrapping_mul(0x9E37_79B9) % MAX_CQ
}

/// The slot of a managed CQ.
pub fn cq_slot(cq: *mut ibv_cq) -> Option<&'static CqSlot> {
    let k = cq as usize;
    if k == 0 {
        return None;
    }
    let h = home(k);
    (0..MAX_CQ)
        .map(|i| &CQS[(h + i) % MAX_CQ])
        .find(|s| s.cq.load(Ordering::Acquire) == k)
}

/// Start managing `cq` (on `channel`, of `ctx`). False when full.
pub fn add_cq(cq: *mut ibv_cq, channel: *mut ibv_comp_channel, ctx: *mut ibv_context) -> bool {
    let h = home(cq as usize);
    for i in 0..MAX_CQ {
        let s = &CQS[(h + i) % MAX_CQ];
        if s.cq
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            *lock(s) = CqState::NEW;
            s.channel.store(channel as usize, Ordering::Relaxed);
            s.ctx.store(ctx as usize, Ordering::Relaxed);
            s.cq.store(cq as usize, Ordering::Release);
            return true;
        }
    }
    false
}

/// Stop managing a CQ (before destroying it, so no other thread's look at
/// the channel polls it any more). Returns what the slot held, for
/// [`restore_cq`] if the destroy fails.
pub fn remove_cq(s: &CqSlot) -> (CqState, usize, usize) {
    let mut st = lock(s);
    let old = *st;
    STASHED.fetch_sub(st.len as u32, Ordering::Relaxed);
    *st = CqState::NEW;
    let channel = s.channel.swap(0, Ordering::Relaxed);
    let ctx = s.ctx.load(Ordering::Relaxed);
    // Cleared while the state lock is held: a look that holds the lock has
    // finished polling this CQ, later ones no longer find it.
    s.cq.store(0, Ordering::Release);
    drop(st);
    (old, channel, ctx)
}

/// Manage `cq` again with the state [`remove_cq`] returned (its destroy
/// failed, e.g. EBUSY: QPs still use it). False if the table filled up
/// meanwhile; then the CQ passes through and any stashed CQEs are lost,
/// which the caller reports.
pub fn restore_cq(cq: *mut ibv_cq, (st, channel, ctx): (CqState, usize, usize)) -> bool {
    if !add_cq(
        cq,
        channel as *mut ibv_comp_channel,
        ctx as *mut ibv_context,
    ) {
        return st.len == 0;
    }
    if let Some(s) = cq_slot(cq) {
        *lock(s) = st;
        STASHED.fetch_add(st.len as u32, Ordering::AcqRel);
    }
    true
}

/// Lock a CQ's state, ignoring poisoning (a panic in a hook is caught and
/// the state is plain data).
pub fn lock(s: &CqSlot) -> MutexGuard<'_, CqState> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Is the CQ's context hands-off (direct verbs in use)?
pub fn hands_off(s: &CqSlot) -> bool {
    ctx_slot(s.ctx.load(Ordering::Relaxed) as *mut ibv_context)
        .is_none_or(|c| c.hands_off.load(Ordering::Relaxed))
}
