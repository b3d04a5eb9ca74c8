//! Extended CQs (`ibv_create_cq_ex`): passed through, and said so.
//!
//! Why not served: an extended CQ is read with `ibv_start_poll` /
//! `ibv_next_poll` / `ibv_end_poll`, which the provider implements in the
//! CQ itself (`struct ibv_cq_ex` function pointers), not through
//! `ops.poll_cq`. The shim's only way to see a CQE without losing it is to
//! move it to its stash and have the wrapped `poll_cq` return it first; a
//! CQE stashed from an extended CQ would vanish from `start_poll`, and
//! there is no way to give one back to the provider. So such CQs are not
//! managed: not peeked, no synthetic events; their waits see the kernel's
//! events only. (A safe peek would need a provider-specific look at the CQ
//! buffer without consuming, as `mlx5dv` allows; not done.)
//!
//! `ibv_create_cq_ex` is `static inline` in verbs.h and calls the
//! `create_cq_ex` slot of the context's `verbs_context`; the shim wraps that
//! slot (when the context's `sz` says it has one) only to count extended
//! CQs and say, once, with `FASTWAKE_VERBOSE=1`, that they pass through.

use super::stats;
use fastwake_verbs_sys::{
    CreateCqExFn, VERBS_CONTEXT_CREATE_CQ_EX_BACK, VERBS_CONTEXT_CREATE_CQ_EX_SZ, ibv_context,
};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const MAX: usize = super::table::MAX_CTX;

/// (context, its provider's create_cq_ex), for the contexts wrapped.
static REAL: [(AtomicUsize, AtomicUsize); MAX] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX];
static SAID: AtomicBool = AtomicBool::new(false);

/// The `create_cq_ex` slot of `ctx`, if its `verbs_context` has one.
///
/// # Safety
/// `ctx` is a live context that `super::understood` accepted (rdma-core's
/// `verbs_context` layout, `sz` readable just before it).
unsafe fn slot(ctx: *mut ibv_context) -> Option<*mut Option<CreateCqExFn>> {
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
/// As for [`slot`]; no other thread has the context yet.
pub(super) unsafe fn wrap(ctx: *mut ibv_context) {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { slot(ctx) }) else {
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

/// The wrapped `verbs_context.create_cq_ex`: the provider's, counted.
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
    // SAFETY: forwarding the caller's arguments unchanged.
    let cq = unsafe { real(ctx, attr) };
    if !cq.is_null() {
        stats::add(|s| &s.cqs_ex, 1);
        if crate::config::verbose() && !SAID.swap(true, Ordering::Relaxed) {
            crate::diag(
                "verbs: extended CQs (ibv_create_cq_ex) pass through: start_poll/next_poll do not go through poll_cq, so a CQE the shim looked at could not be given back; their waits see only the kernel's events",
            );
        }
    }
    cq
}
