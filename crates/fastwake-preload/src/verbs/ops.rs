//! The wrapped data-path ops: `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` in verbs.h and call `cq->context->ops.{poll_cq,
//! req_notify_cq}`, so the shim replaces those two slots of every context it
//! understands (see `mod.rs`).

use super::stats;
use super::table::{self, STASHED};
use fastwake_verbs_sys::{ibv_cq, ibv_wc};
use std::ffi::c_int;
use std::sync::atomic::Ordering;

/// `ops.poll_cq`: CQEs the shim stashed first, in order, then the
/// provider's; the stall monitor sees what the program gets.
///
/// # Safety
/// The provider's poll_cq contract: a live CQ and room for `n` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's contract, passed on.
    let mut r = unsafe { poll_cq_inner(cq, n, wc) };
    if crate::pollers::on() && n > 0 {
        // A busy-polling thread's poll: an empty one may sleep, then polls
        // again (`crate::pollers`).
        // SAFETY: as above.
        r = crate::pollers::after_poll_cq(cq, r, || unsafe { poll_cq_inner(cq, n, wc) });
    }
    // SAFETY: wc holds r completions of the live cq.
    unsafe { super::monitor::polled(cq, wc, r) };
    r
}

/// # Safety
/// As [`poll_cq`].
#[inline(always)]
unsafe fn poll_cq_inner(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ (caller's contract) points at its live context.
    let ctx = unsafe { (*cq).context };
    let Some((real_poll, _)) = table::real_ops(ctx) else {
        // Only reachable if the context was closed under the program's feet.
        return -libc::EINVAL;
    };
    if STASHED.load(Ordering::Acquire) == 0 || n <= 0 {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { real_poll(cq, n, wc) };
    }
    let Some(s) = table::cq_slot(cq) else {
        // SAFETY: as above.
        return unsafe { real_poll(cq, n, wc) };
    };
    // Held across the provider call so a CQE another thread stashes
    // meanwhile cannot overtake the ones returned here.
    let mut st = table::lock(s);
    let mut got = 0;
    while got < n
        && let Some(w) = st.pop()
    {
        // SAFETY: wc has room for n entries (caller's contract), got < n.
        unsafe { wc.add(got as usize).write(w) };
        got += 1;
    }
    if got > 0 {
        STASHED.fetch_sub(got as u32, Ordering::AcqRel);
        stats::add(|s| &s.stash_delivered, got as u64);
    }
    if got == n {
        return got;
    }
    // SAFETY: the rest of the caller's array, n - got entries.
    let r = unsafe { real_poll(cq, n - got, wc.add(got as usize)) };
    drop(st);
    if r < 0 {
        // The stashed entries were consumed: report them, the error recurs.
        if got > 0 { got } else { r }
    } else {
        got + r
    }
}

/// `ops.req_notify_cq`: record the program's arm; skip the real one while a
/// real arm is still outstanding (it fires on the next CQE either way).
///
/// # Safety
/// The provider's req_notify_cq contract: a live CQ.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: a live CQ points at its live context.
    let ctx = unsafe { (*cq).context };
    let Some((_, real_notify)) = table::real_ops(ctx) else {
        return libc::EINVAL;
    };
    let Some(s) = table::cq_slot(cq) else {
        // SAFETY: forwarding unchanged.
        return unsafe { real_notify(cq, solicited_only) };
    };
    if table::hands_off(s) {
        // SAFETY: forwarding unchanged.
        return unsafe { real_notify(cq, solicited_only) };
    }
    let mut st = table::lock(s);
    if solicited_only != 0 {
        // Solicited-only events cannot be synthesized from "a CQE is
        // there": leave this CQ to the provider from now on.
        st.solicited = true;
    }
    if st.solicited {
        drop(st);
        // SAFETY: forwarding unchanged.
        return unsafe { real_notify(cq, solicited_only) };
    }
    st.app_armed = true;
    if st.real_armed {
        stats::add(|s| &s.arms_skipped, 1);
        return 0;
    }
    // SAFETY: forwarding to the provider for a live CQ.
    let rc = unsafe { real_notify(cq, 0) };
    if rc == 0 {
        st.real_armed = true;
    }
    rc
}
