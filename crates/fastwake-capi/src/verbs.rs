//! RDMA verbs: a CQ and completion channel the caller created.

use crate::boundary::{
    check_out, cpu_arg, destroy, guard, obj, out, out_value, stats_of, wait_for,
};
use crate::waiter::fw_waiter;
use fastwake::{Fail, WaitMode};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};
use std::ffi::c_int;

pub struct fw_verbs_cq(pub(crate) fastwake::source::verbs::CallerCq);

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_verbs_stats {
    pub events: u64,
    pub acked: u64,
    pub ack_calls: u64,
    pub arms: u64,
    pub stashed: u64,
}

/// The caller's `struct ibv_wc` array of `max` entries, or why not.
pub(crate) fn wc_out<'a>(wc: *mut ibv_wc, max: c_int) -> Result<&'a mut [ibv_wc], Fail> {
    if wc.is_null() {
        return Err(Fail::invalid("the work completion array is NULL"));
    }
    if max < 1 {
        return Err(Fail::invalid(format!(
            "max is {max}: room for at least one work completion is needed"
        )));
    }
    // SAFETY: per the header, wc points to max writable struct ibv_wc
    // (whose layout fastwake-verbs-sys checks against verbs.h).
    Ok(unsafe { std::slice::from_raw_parts_mut(wc, max as usize) })
}

pub(crate) fn store_count(n: *mut c_int, v: usize) {
    if !n.is_null() {
        // SAFETY: NULL or writable per the header.
        unsafe { *n = v as c_int };
    }
}

/// # Safety
/// `cq` is a live CQ and `channel` NULL or its channel, both outliving the
/// object (the header's contract); `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_create(
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    out_v: *mut *mut fw_verbs_cq,
) -> c_int {
    guard(|| {
        check_out(out_v)?;
        // SAFETY: the caller's promise above, passed on unchanged;
        // from_raw checks NULL, the channel against the CQ's and the ops.
        let src = unsafe { fastwake::source::verbs::CallerCq::from_raw(cq, channel) }?;
        out(out_v, fw_verbs_cq(src))
    })
}

/// # Safety
/// `w` and `v` from this library; `wc` writable for `max` entries; `n`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_wait(
    w: *mut fw_waiter,
    v: *mut fw_verbs_cq,
    timeout_ns: i64,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let w = obj(w)?;
        let v = obj(v)?;
        let out = wc_out(wc, max)?;
        if !v.0.has_channel() && w.0.mode() != WaitMode::Poll {
            return Err(Fail::invalid(format!(
                "the CQ has no completion channel: only a \"poll\" waiter can wait on it, not \"{}\"",
                w.0.mode()
            )));
        }
        out[0] = wait_for(&mut w.0, &mut v.0, timeout_ns)?;
        let more = v.0.poll(&mut out[1..])?;
        store_count(n, 1 + more);
        Ok(())
    })
}

/// # Safety
/// `v` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_poll(
    v: *mut fw_verbs_cq,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let v = obj(v)?;
        let got = v.0.poll(wc_out(wc, max)?)?;
        store_count(n, got);
        Ok(())
    })
}

/// # Safety
/// `v` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_stats(
    v: *const fw_verbs_cq,
    out: *mut fw_verbs_stats,
) -> c_int {
    guard(|| {
        stats_of(v, out, |v| {
            let s = v.0.stats();
            fw_verbs_stats {
                events: s.events,
                acked: s.acked,
                ack_calls: s.ack_calls,
                arms: s.arms,
                stashed: v.0.stashed() as u64,
            }
        })
    })
}

/// # Safety
/// `v` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_destroy(v: *mut fw_verbs_cq) {
    destroy(v)
}

/// # Safety
/// `ctx` NULL or an open context; `vector` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_comp_vector_for_cpu(
    ctx: *mut ibv_context,
    cpu: c_int,
    vector: *mut c_int,
) -> c_int {
    guard(|| {
        let vector = out_value(vector, "vector")?;
        let cpu = cpu_arg(cpu)?;
        // SAFETY: ctx is NULL (refused there) or open, per the header.
        let p = unsafe { fastwake::source::verbs::vector_for_cpu(ctx, cpu) }?;
        vector.set(p.vector as c_int);
        Ok(())
    })
}
