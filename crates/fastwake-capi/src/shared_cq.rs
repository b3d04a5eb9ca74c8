//! RDMA verbs: one shared CQ for the connections of one core, and its
//! inboxes.

use crate::boundary::{check_out, cpu_arg, destroy, guard, obj, obj_ref, out, stats_of, wait_for};
use crate::verbs::{store_count, wc_out};
use crate::waiter::fw_waiter;
use fastwake::source::demux::{Demux, Inbox};
use fastwake::source::verbs::{CqConfig, Route, SharedCq, Vector};
use fastwake::{Fail, Source};
use fastwake_verbs_sys::{ibv_context, ibv_cq, ibv_wc};
use std::ffi::c_int;

pub struct fw_verbs_shared_cq(pub(crate) Demux<SharedCq>);
pub struct fw_verbs_inbox(pub(crate) Inbox<SharedCq>);

/// What a shared CQ did (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_shared_cq_stats {
    pub routed: u64,
    pub unrouted: u64,
    pub pumps: u64,
    pub handed_over: u64,
    pub notices: u64,
    pub rings: u64,
    pub events: u64,
    pub arms: u64,
    pub acked: u64,
    pub reserved: [u64; 3],
}

/// `fw_verbs_shared_cq_create`'s routes, as the header defines them.
pub const FW_ROUTE_QP_NUM: c_int = 0;
pub const FW_ROUTE_WR_ID_HIGH: c_int = 1;

/// # Safety
/// `ctx` NULL or an open context that stays open until the shared CQ and
/// all its inboxes are destroyed; `out_s` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_create(
    ctx: *mut ibv_context,
    entries: c_int,
    cpu: c_int,
    route: c_int,
    shift: c_int,
    out_s: *mut *mut fw_verbs_shared_cq,
) -> c_int {
    guard(|| {
        check_out(out_s)?;
        if entries < 1 {
            return Err(Fail::invalid(format!(
                "entries is {entries}: room for at least one completion is needed"
            )));
        }
        let cpu = cpu_arg(cpu)?;
        let route = match (route, shift) {
            (FW_ROUTE_QP_NUM, _) => Route::QpNum,
            (FW_ROUTE_WR_ID_HIGH, 0..=63) => Route::WrIdHigh(shift as u32),
            (FW_ROUTE_WR_ID_HIGH, s) => {
                return Err(Fail::invalid(format!(
                    "shift {s}: the owner's key is wr_id >> shift, 0..=63"
                )));
            }
            (r, _) => {
                return Err(Fail::invalid(format!(
                    "route {r}: FW_ROUTE_QP_NUM (0) or FW_ROUTE_WR_ID_HIGH (1)"
                )));
            }
        };
        let cfg = CqConfig {
            entries: entries as u32,
            vector: Vector::ForCpu(cpu),
            ..CqConfig::default()
        };
        // SAFETY: the caller's promise above, passed on unchanged;
        // on_context refuses NULL.
        let demux = unsafe { SharedCq::on_context(ctx, cfg, route) }?;
        out(out_s, fw_verbs_shared_cq(demux))
    })
}

/// # Safety
/// `s` NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_cq(s: *const fw_verbs_shared_cq) -> *mut ibv_cq {
    match obj_ref(s) {
        Ok(s) => s.0.queue().raw(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// # Safety
/// `s` from this library; `out_i` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_inbox(
    s: *const fw_verbs_shared_cq,
    key: u64,
    out_i: *mut *mut fw_verbs_inbox,
) -> c_int {
    guard(|| {
        check_out(out_i)?;
        let inbox = obj_ref(s)?.0.inbox(key)?;
        out(out_i, fw_verbs_inbox(inbox))
    })
}

/// Copy completions `next` gives into `out` until it gives none or `out`
/// is full; how many.
fn fill_wc(
    out: &mut [ibv_wc],
    mut next: impl FnMut() -> Result<Option<ibv_wc>, Fail>,
) -> Result<usize, Fail> {
    let mut k = 0;
    while k < out.len() {
        match next()? {
            Some(wc) => out[k] = wc,
            None => break,
        }
        k += 1;
    }
    Ok(k)
}

/// # Safety
/// `w` and `i` from this library; `wc` writable for `max` entries; `n`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_wait(
    w: *mut fw_waiter,
    i: *mut fw_verbs_inbox,
    timeout_ns: i64,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let w = obj(w)?;
        let i = obj(i)?;
        let out = wc_out(wc, max)?;
        out[0] = wait_for(&mut w.0, &mut i.0, timeout_ns)?;
        let more = fill_wc(&mut out[1..], || i.0.try_take())?;
        store_count(n, 1 + more);
        Ok(())
    })
}

/// # Safety
/// `i` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_poll(
    i: *mut fw_verbs_inbox,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let i = obj(i)?;
        let got = fill_wc(wc_out(wc, max)?, || i.0.try_take())?;
        store_count(n, got);
        Ok(())
    })
}

/// # Safety
/// `s` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_take_unrouted(
    s: *const fw_verbs_shared_cq,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let s = obj_ref(s)?;
        let out = wc_out(wc, max)?;
        let kept = s.0.take_unrouted_at_most(out.len());
        out[..kept.len()].copy_from_slice(&kept);
        store_count(n, kept.len());
        Ok(())
    })
}

/// # Safety
/// `s` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_stats(
    s: *const fw_verbs_shared_cq,
    out: *mut fw_shared_cq_stats,
) -> c_int {
    guard(|| {
        stats_of(s, out, |s| {
            let d = s.0.stats();
            let q = s.0.queue().stats();
            fw_shared_cq_stats {
                routed: d.routed,
                unrouted: d.unrouted,
                pumps: d.pumps,
                handed_over: d.handed_over,
                notices: d.notices,
                rings: d.rings,
                events: q.events,
                arms: q.arms,
                acked: q.acked,
                reserved: [0; 3],
            }
        })
    })
}

/// # Safety
/// `i` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_destroy(i: *mut fw_verbs_inbox) {
    destroy(i)
}

/// # Safety
/// `s` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_destroy(s: *mut fw_verbs_shared_cq) {
    destroy(s)
}
