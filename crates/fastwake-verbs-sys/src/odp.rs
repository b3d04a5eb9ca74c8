//! On-Demand Paging: the constants and `verbs_context` slots fastwake's ODP
//! guard and doctor use. `ibv_query_device_ex` and
//! `ibv_advise_mr` are `static inline` in verbs.h and call through
//! `struct verbs_context`, which rdma-core lays out *before* the
//! `ibv_context` it hands out, growing downwards; these are the byte offsets
//! of the two slots before the context (valid when the provider's `sz`,
//! the word right before the context, is at least `size_of::<ibv_context>()`
//! plus the offset: verbs.h's `verbs_get_ctx_op`). Checked against the
//! installed header by `tests/odp_abi.rs`.

use std::ffi::c_uint;

/// `verbs_context.query_device_ex`, bytes before the context.
pub const VERBS_CTX_QUERY_DEVICE_EX: usize = 104;
/// `verbs_context.advise_mr`, bytes before the context.
pub const VERBS_CTX_ADVISE_MR: usize = 312;

/// `offsetof(struct ibv_device_attr_ex, odp_caps)`: `general_caps` (u64),
/// then `rc_odp_caps`, `uc_odp_caps`, `ud_odp_caps` (u32 each).
pub const DEVICE_ATTR_EX_ODP_CAPS: usize = 240;
/// `sizeof(struct ibv_device_attr_ex)` (rdma-core 44).
pub const DEVICE_ATTR_EX_SIZE: usize = 400;

pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
pub const IBV_ODP_SUPPORT: u64 = 1 << 0;
pub const IBV_ODP_SUPPORT_IMPLICIT: u64 = 1 << 1;
pub const IBV_ODP_SUPPORT_SEND: u32 = 1 << 0;
pub const IBV_ODP_SUPPORT_RECV: u32 = 1 << 1;
pub const IBV_ODP_SUPPORT_WRITE: u32 = 1 << 2;
pub const IBV_ODP_SUPPORT_READ: u32 = 1 << 3;
pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 1 << 4;
pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 1 << 5;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH: u32 = 0;
pub const IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: u32 = 1;
pub const IB_UVERBS_ADVISE_MR_FLAG_FLUSH: u32 = 1;
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_READ: c_uint = 4;
/// `offsetof(struct ibv_send_wr, wr.rdma.rkey)` (`remote_addr` at 40).
pub const SEND_WR_RDMA_RKEY: usize = 48;

/// `ibv_query_device_ex` as the `verbs_context` slot holds it.
pub type QueryDeviceExFn = unsafe extern "C" fn(
    ctx: *mut crate::ibv_context,
    input: *const std::ffi::c_void,
    attr: *mut u8,
    attr_size: usize,
) -> std::ffi::c_int;
/// `ibv_advise_mr` as the `verbs_context` slot holds it.
pub type AdviseMrFn = unsafe extern "C" fn(
    pd: *mut crate::ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut crate::ibv_sge,
    num_sge: u32,
) -> std::ffi::c_int;

/// The `verbs_context` slot `off` bytes before `ctx`, if the provider's
/// context is big enough to have it.
///
/// # Safety
/// `ctx` is a live context from rdma-core's `ibv_open_device` (a
/// `verbs_context` with its `sz` word right before the context).
pub unsafe fn ctx_slot(ctx: *mut crate::ibv_context, off: usize) -> Option<*mut usize> {
    // SAFETY: the caller's contract: `sz` precedes the context.
    let sz = unsafe { *(ctx as *const usize).sub(1) };
    if sz < std::mem::size_of::<crate::ibv_context>() + off || sz > 64 * 1024 {
        return None;
    }
    // SAFETY: inside the verbs_context, which sz covers.
    Some(unsafe { (ctx as *mut u8).sub(off) } as *mut usize)
}
