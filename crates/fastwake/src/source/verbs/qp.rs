//! RC queue pairs and registered memory: what a SEND/RECV ping-pong needs.
//!
//! Control path: create, connect (INIT → RTR → RTS, as ibv_rc_pingpong
//! does). Data path: `post_send` / `post_recv` through the context's ops, as
//! verbs.h's inline `ibv_post_send` / `ibv_post_recv` do.

use super::device::{Device, errno};
use super::monitor;
use super::shared::CqRef;
use super::sys::*;
use crate::stall::cause::QpAttrs;
use crate::stall::{Op, QpKey};
use crate::{Fail, Result};
use std::sync::Arc;

// RDMA READ, access flags, ODP prefetch.
mod read;
pub use read::IBV_ACCESS_REMOTE_READ;

/// Registered memory: a buffer the device may read and write.
pub struct Mr {
    dev: Arc<Device>,
    buf: Box<[u8]>,
    mr: *mut ibv_mr,
    /// Registered with `IBV_ACCESS_ON_DEMAND` (the stall monitor's cause).
    odp: bool,
}

// SAFETY: the MR and buffer are owned by this value; verbs objects may be used
// from any thread.
unsafe impl Send for Mr {}

impl Mr {
    /// Register a zeroed buffer of `len` bytes (local write access).
    pub fn new(dev: &Arc<Device>, len: usize) -> Result<Mr> {
        Mr::with_access(dev, len, IBV_ACCESS_LOCAL_WRITE)
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is live.
        unsafe { (*self.mr).lkey }
    }

    /// The buffer.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The buffer, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Device address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: mr was registered in new() and is deregistered once, before
        // the buffer is freed (fields drop after this body).
        unsafe { (self.dev.lib.dereg_mr)(self.mr) };
    }
}

/// What the other side needs to connect to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE; also sent on InfiniBand).
    pub gid: [u8; 16],
}

/// A reliable-connected QP.
pub struct RcQp {
    dev: Arc<Device>,
    qp: *mut ibv_qp,
    post_send: PostSendFn,
    post_recv: PostRecvFn,
    max_inline: u32,
}

/// The retransmission attributes [`RcQp::connect_mtu`] sets, for the
/// stall monitor's cause (no `ibv_query_qp` on the data path).
const TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;
const RNR_RETRY: u8 = 7;

// SAFETY: the QP is owned by this value; verbs objects may be used from any
// thread (providers lock the work queues).
unsafe impl Send for RcQp {}
// SAFETY: every method takes `&self` and makes provider calls that lock the
// work queue they post to (`post_send` one thread's sends and `post_recv`
// another's receives at once is what rdma-core supports); nothing here is
// mutated outside the provider.
unsafe impl Sync for RcQp {}

impl RcQp {
    /// Create an RC QP on `send_cq` / `recv_cq` with room for `depth`
    /// outstanding sends and receives.
    /// The CQs may be [`super::VerbsCq`]s or a shared CQ
    /// ([`super::SharedCq`]: route by [`RcQp::qp_num`]).
    pub fn new(
        send_cq: &impl CqRef,
        recv_cq: &impl CqRef,
        depth: u32,
        inline: u32,
    ) -> Result<RcQp> {
        let dev = Arc::clone(send_cq.cq_device().ok_or_else(|| {
            Fail::invalid(
                "the CQ was made on a caller's context: create its QPs with ibv_create_qp",
            )
        })?);
        // SAFETY: the context is open.
        let ops = unsafe { &(*dev.ctx).ops };
        let (Some(post_send), Some(post_recv)) = (ops.post_send, ops.post_recv) else {
            return Err(Fail::unsupported("provider has no post_send/post_recv ops"));
        };
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.cq_raw(),
            recv_cq: recv_cq.cq_raw(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd is live; attr is fully initialized.
        let qp = unsafe { (dev.lib.create_qp)(dev.pd, &mut attr) };
        if qp.is_null() {
            return Err(Fail::new(
                errno(),
                format!("ibv_create_qp(RC): {}", std::io::Error::last_os_error()),
            ));
        }
        monitor::watch_context(dev.ctx as usize, dev.name());
        Ok(RcQp {
            dev,
            qp,
            post_send,
            post_recv,
            max_inline: attr.cap.max_inline_data,
        })
    }

    /// The QP number: the key a shared CQ routed by [`super::Route::QpNum`]
    /// delivers this QP's completions under.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: qp is live.
        unsafe { (*self.qp).qp_num }
    }

    /// This QP's endpoint (PSN 0).
    pub fn endpoint(&self) -> Endpoint {
        let (_, gid) = self.dev.gid();
        Endpoint {
            // SAFETY: qp is live.
            qpn: unsafe { (*self.qp).qp_num },
            psn: 0,
            lid: self.dev.port_attr().lid,
            gid: gid.raw,
        }
    }

    /// Largest payload that can be sent inline.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: i32, step: &str) -> Result<()> {
        // SAFETY: qp is live; attr is initialized for the fields in mask.
        let rc = unsafe { (self.dev.lib.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(Fail::new(
                rc,
                format!(
                    "ibv_modify_qp to {step}: {}",
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    /// Bring the QP to RTS connected to `remote`.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        self.connect_mtu(remote, self.path_mtu())
    }

    /// The path MTU [`RcQp::connect`] uses: the port's active MTU, at most
    /// 1024 (an `IBV_MTU_*` value, as perftest exchanges it).
    pub fn path_mtu(&self) -> u32 {
        self.dev.port_attr().active_mtu.clamp(1, IBV_MTU_1024)
    }

    /// [`RcQp::connect`] with path MTU `mtu` (an `IBV_MTU_*` value both
    /// ends agreed on; RC needs the same on both).
    pub fn connect_mtu(&self, remote: &Endpoint, mtu: u32) -> Result<()> {
        let dev = &self.dev;
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: dev.port(),
            ..Default::default()
        };
        self.modify(
            &mut a,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let mut ah = ibv_ah_attr {
            dlid: remote.lid,
            port_num: dev.port(),
            ..Default::default()
        };
        if dev.is_roce() {
            let (idx, _) = dev.gid();
            ah.is_global = 1;
            ah.grh.dgid = ibv_gid { raw: remote.gid };
            ah.grh.sgid_index = idx;
            ah.grh.hop_limit = 1;
        }
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        self.modify(
            &mut a,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: TIMEOUT,
            retry_cnt: RETRY_CNT,
            rnr_retry: RNR_RETRY,
            sq_psn: self.endpoint().psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut a,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Post one receive of `len` bytes at `mr[off..]`.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, off: usize, len: usize) -> Result<()> {
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp is live; wr and sge are valid for the call (the provider
        // copies them into the queue); the buffer is registered in mr.
        let rc = unsafe { (self.post_recv)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Fail::new(rc, format!("ibv_post_recv failed (errno {rc})")));
        }
        Ok(())
    }

    /// Post one SEND of `mr[off..off+len]` carrying immediate data `imm`;
    /// inline when it fits, signaled when `signaled`.
    pub fn post_send(
        &self,
        wr_id: u64,
        mr: &Mr,
        off: usize,
        len: usize,
        imm: u32,
        signaled: bool,
    ) -> Result<()> {
        self.post_send_op(wr_id, mr, off, len, Some(imm), signaled)
    }

    /// [`RcQp::post_send`], a plain SEND (no immediate data: what
    /// perftest's `ib_send_lat` sends) when `imm` is `None`.
    pub fn post_send_op(
        &self,
        wr_id: u64,
        mr: &Mr,
        off: usize,
        len: usize,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut flags = if signaled { IBV_SEND_SIGNALED } else { 0 };
        if len as u32 <= self.max_inline {
            flags |= IBV_SEND_INLINE;
        }
        let mut wr = ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: if imm.is_some() {
                IBV_WR_SEND_WITH_IMM
            } else {
                IBV_WR_SEND
            },
            send_flags: flags,
            imm_data: imm.unwrap_or(0),
            _unions: [0; 11],
        };
        let mut bad = std::ptr::null_mut();
        let rc = self.dated_post(wr_id, Op::Send, mr.odp, || {
            // SAFETY: qp is live; wr and sge are valid for the call; the
            // buffer is registered (or copied inline).
            unsafe { (self.post_send)(self.qp, &mut wr, &mut bad) }
        });
        if rc != 0 {
            return Err(Fail::new(rc, format!("ibv_post_send failed (errno {rc})")));
        }
        Ok(())
    }

    /// Post SENDs with immediate data of `parts` (offset in `mr`, length,
    /// immediate data) as one chain: one `ibv_post_send`, one doorbell for
    /// them all. Work request `i` has id `first_wr_id + i`; every one is
    /// signaled (its completion frees its buffer).
    pub fn post_send_chain(
        &self,
        first_wr_id: u64,
        mr: &Mr,
        parts: &[(usize, usize, u32)],
    ) -> Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ibv_sge> = parts
            .iter()
            .map(|&(off, len, _)| ibv_sge {
                addr: mr.addr(off),
                length: len as u32,
                lkey: mr.lkey(),
            })
            .collect();
        let mut wrs: Vec<ibv_send_wr> = parts
            .iter()
            .enumerate()
            .map(|(i, &(_, len, imm))| {
                let mut flags = IBV_SEND_SIGNALED;
                if len as u32 <= self.max_inline {
                    flags |= IBV_SEND_INLINE;
                }
                ibv_send_wr {
                    wr_id: first_wr_id + i as u64,
                    next: std::ptr::null_mut(),
                    sg_list: std::ptr::null_mut(),
                    num_sge: 1,
                    opcode: IBV_WR_SEND_WITH_IMM,
                    send_flags: flags,
                    imm_data: imm,
                    _unions: [0; 11],
                }
            })
            .collect();
        // Link after both vectors stop moving: each WR points at its SGE
        // and at the next WR.
        let n = wrs.len();
        for i in 0..n {
            wrs[i].sg_list = &mut sges[i];
            if i + 1 < n {
                let next: *mut ibv_send_wr = &mut wrs[i + 1];
                wrs[i].next = next;
            }
        }
        let mut bad = std::ptr::null_mut();
        let head: *mut ibv_send_wr = &mut wrs[0];
        let rc = self.dated_post(first_wr_id, Op::Send, mr.odp, || {
            // SAFETY: qp is live; the chain's WRs and SGEs live in `wrs`
            // and `sges` for the call (the provider copies them into the
            // queue); the buffers are registered in mr (or copied inline).
            unsafe { (self.post_send)(self.qp, head, &mut bad) }
        });
        if rc != 0 {
            return Err(Fail::new(
                rc,
                format!("ibv_post_send of a {n}-WR chain failed (errno {rc})"),
            ));
        }
        Ok(())
    }

    /// This QP in the stall monitor's tables.
    fn monitor_key(&self) -> QpKey {
        QpKey {
            ctx: self.dev.ctx as usize,
            qpn: self.qp_num(),
        }
    }

    /// Post through `post` (the provider's call: its errno, or 0), dated
    /// by the stall monitor (`monitor`).
    fn dated_post(&self, wr_id: u64, op: Op, odp: bool, post: impl FnOnce() -> i32) -> i32 {
        let attrs = QpAttrs {
            timeout: TIMEOUT,
            retry_cnt: RETRY_CNT,
            rnr_retry: RNR_RETRY,
            port: self.dev.port(),
        };
        monitor::dated_post(self.monitor_key(), attrs, wr_id, op, odp, post)
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        // Its number may be reused by the next QP.
        monitor::forget_qp(self.monitor_key());
        // SAFETY: qp was created in new() and is destroyed once.
        unsafe { (self.dev.lib.destroy_qp)(self.qp) };
    }
}
