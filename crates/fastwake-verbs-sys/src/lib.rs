//! The few libibverbs types fastwake touches, written by hand: the one FFI
//! layer for verbs, shared by the library (`fastwake::source::verbs`) and the
//! preload shim, which wraps the same structs from the other side.
//!
//! Why not a bindings crate: every bindgen-based one needs libclang (and most
//! need rdma-core's headers) at build time, and the preload shim must not link
//! a crate that *defines* `ibv_*` symbols. These structs follow rdma-core's
//! `infiniband/verbs.h` (ABI of libibverbs.so.1, checked against rdma-core 44);
//! `tests/verbs_abi.rs` compiles a C probe against the real header when it is
//! installed and compares every size and offset used here.
//!
//! Only the leading, stable part of a struct is spelled out where that is all
//! fastwake reads; such structs are only ever handled by pointer from the
//! library, never allocated by us.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_int, c_uint, c_void};

pub mod odp;

/// `struct ibv_device`: opaque, read through `ibv_get_device_name`.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_pd`: opaque.
#[repr(C)]
pub struct ibv_pd {
    _opaque: [u8; 0],
}

pub type PollCqFn = unsafe extern "C" fn(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
pub type PostSendFn = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int;
pub type PostRecvFn = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers. `ibv_poll_cq`,
/// `ibv_req_notify_cq`, `ibv_post_send` and `ibv_post_recv` are `static
/// inline` in verbs.h and call through these slots, so this table is both how
/// fastwake calls them and what the preload shim wraps.
#[repr(C)]
pub struct ibv_context_ops {
    /// Slots 0..=10 (`_compat_query_device` .. `_compat_create_cq`).
    pub _before_poll: [usize; 11],
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// Slots 13..=24 (`_compat_cq_event` .. `_compat_destroy_qp`).
    pub _middle: [usize; 12],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    /// Slots 27..=31 (`_compat_create_ah` .. `_compat_async_event`).
    pub _after: [usize; 5],
}

/// glibc's `pthread_mutex_t` and `pthread_cond_t`, from `libc`, which sizes
/// them per target. Why not hand-sized: the mutex is 40 bytes on x86_64
/// but 48 on aarch64, and every field after it in `ibv_cq`, `ibv_qp` and
/// `ibv_context` moves with it (checked below for both targets).
pub use libc::{pthread_cond_t, pthread_mutex_t};

const _: () = {
    #[cfg(target_arch = "x86_64")]
    assert!(std::mem::size_of::<pthread_mutex_t>() == 40);
    #[cfg(target_arch = "aarch64")]
    assert!(std::mem::size_of::<pthread_mutex_t>() == 48);
    assert!(std::mem::size_of::<pthread_cond_t>() == 48);
};

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_wc`: one work completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `union ibv_gid`: 16 raw bytes (network order).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_port_attr` (the full rdma-core ≥ 17 layout; the exported
/// `ibv_query_port` fills the older, shorter prefix and we zero the rest).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr`. The opcode-specific unions after `imm_data` are
/// kept as opaque words: fastwake only posts plain SENDs.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    /// `wr` (rdma/atomic/ud), `qp_type`, `bind_mw`/`tso` unions.
    pub _unions: [u64; 11],
}

/// Extended verbs live in `struct verbs_context`, which rdma-core places
/// immediately before `struct ibv_context` and which "grows up" (new
/// fields go at its start, so existing ones keep their distance to the
/// context). `ibv_create_cq_ex` (static inline in verbs.h) calls the
/// `create_cq_ex` slot found this many bytes before the context...
pub const VERBS_CONTEXT_CREATE_CQ_EX_BACK: usize = 120;
/// ...and only when the context's `sz` (the `size_t` just before it) is at
/// least this much (the slot, and all after it, including the context).
pub const VERBS_CONTEXT_CREATE_CQ_EX_SZ: usize =
    VERBS_CONTEXT_CREATE_CQ_EX_BACK + std::mem::size_of::<ibv_context>();

/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut c_void;

/// `struct ibv_cq_init_attr_ex`: what `ibv_create_cq_ex` is asked for.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*`: the fields the program may read of each CQE.
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut c_void,
}

/// `struct ibv_poll_cq_attr` (`ibv_start_poll`'s argument).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_wc_tm_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

/// `ibv_cq_ex.start_poll`.
pub type StartPollFn = unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int;
/// `ibv_cq_ex.next_poll`.
pub type NextPollFn = unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int;
/// `ibv_cq_ex.end_poll`.
pub type EndPollFn = unsafe extern "C" fn(*mut ibv_cq_ex);
/// A 32-bit `ibv_cq_ex.read_*` (opcode, vendor_err, byte_len, imm_data,
/// qp_num, src_qp, wc_flags, slid, flow_tag).
pub type Read32Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u32;
/// A 16-bit `ibv_cq_ex.read_*` (cvlan).
pub type Read16Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u16;
/// An 8-bit `ibv_cq_ex.read_*` (sl, dlid_path_bits).
pub type Read8Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u8;
/// A 64-bit `ibv_cq_ex.read_*` (the timestamps).
pub type Read64Fn = unsafe extern "C" fn(*mut ibv_cq_ex) -> u64;

/// `struct ibv_cq_ex`: an extended CQ. It begins as `struct ibv_cq` does
/// (`ibv_cq_ex_to_cq` is a cast); the provider fills `status` and `wr_id`
/// at each `start_poll`/`next_poll` and the program reads the rest of the
/// current CQE through the `read_*` pointers.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_uint,
    pub wr_id: u64,
    pub start_poll: Option<StartPollFn>,
    pub next_poll: Option<NextPollFn>,
    pub end_poll: Option<EndPollFn>,
    pub read_opcode: Option<Read32Fn>,
    pub read_vendor_err: Option<Read32Fn>,
    pub read_byte_len: Option<Read32Fn>,
    pub read_imm_data: Option<Read32Fn>,
    pub read_qp_num: Option<Read32Fn>,
    pub read_src_qp: Option<Read32Fn>,
    pub read_wc_flags: Option<Read32Fn>,
    pub read_slid: Option<Read32Fn>,
    pub read_sl: Option<Read8Fn>,
    pub read_dlid_path_bits: Option<Read8Fn>,
    pub read_completion_ts: Option<Read64Fn>,
    pub read_cvlan: Option<Read16Fn>,
    pub read_flow_tag: Option<Read32Fn>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: Option<Read64Fn>,
}

pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
/// The fields a `struct ibv_wc` also carries: an extended CQ asking for no
/// more than these can be read with `poll_cq` and shown again from the
/// `ibv_wc`.
pub const IBV_WC_STANDARD_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS;

pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;

pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_MTU_1024: c_uint = 3;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// The symbol versions libibverbs.so.1 exports (rdma-core ≥ 13).
pub const V1_1: &std::ffi::CStr = c"IBVERBS_1.1";
pub const V1_0: &std::ffi::CStr = c"IBVERBS_1.0";
