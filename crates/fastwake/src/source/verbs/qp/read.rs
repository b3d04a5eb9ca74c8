//! RDMA READ and memory registered for it (`fastwake bench
//! odp`): registration with chosen access flags (ON_DEMAND included), the
//! remote key, letting the peer read, posting a READ, and the ODP prefetch
//! (`ibv_advise_mr`).

use super::{Mr, RcQp};
use crate::source::verbs::device::{Device, errno};
use crate::source::verbs::sys::odp::*;
use crate::source::verbs::sys::*;
use crate::{Fail, Result};
use std::sync::Arc;

/// Remote read access (verbs.h `IBV_ACCESS_REMOTE_READ`).
pub const IBV_ACCESS_REMOTE_READ: i32 = 1 << 2;

impl Mr {
    /// Register a zeroed buffer of `len` bytes with `access` flags (e.g.
    /// `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ`, plus
    /// `IBV_ACCESS_ON_DEMAND`). A large buffer comes fresh from the kernel,
    /// its pages not yet touched: an ODP registration then faults on first
    /// use, which is what the ODP benchmark wants.
    pub fn with_access(dev: &Arc<Device>, len: usize, access: i32) -> Result<Mr> {
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        // SAFETY: pd is live; buf stays allocated and unmoved until Drop.
        let mr = unsafe { (dev.lib.reg_mr)(dev.pd, buf.as_mut_ptr().cast(), buf.len(), access) };
        if mr.is_null() {
            return Err(Fail::new(
                errno(),
                format!(
                    "ibv_reg_mr({} bytes, access {access:#x}): {}",
                    buf.len(),
                    std::io::Error::last_os_error()
                ),
            ));
        }
        Ok(Mr {
            dev: Arc::clone(dev),
            buf,
            mr,
            odp: access as u32 & IBV_ACCESS_ON_DEMAND != 0,
        })
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is live.
        unsafe { (*self.mr).rkey }
    }

    /// Ask the NIC to fault `[off, off+len)` in now (`ibv_advise_mr`,
    /// prefetch-write, flush: returns when done). Only meaningful for an
    /// ODP registration.
    pub fn prefetch(&self, off: usize, len: usize) -> Result<()> {
        let dev = &self.dev;
        // SAFETY: an open rdma-core context.
        let f = unsafe { ctx_slot(dev.ctx, VERBS_CTX_ADVISE_MR) }
            // SAFETY: a slot inside the verbs_context.
            .map(|p| unsafe { *p })
            .unwrap_or(0);
        if f == 0 {
            return Err(Fail::unsupported("the provider has no ibv_advise_mr"));
        }
        // SAFETY: the provider's advise_mr, of verbs.h's signature.
        let f = unsafe { std::mem::transmute::<usize, AdviseMrFn>(f) };
        let mut sge = ibv_sge {
            addr: self.addr(off),
            length: len as u32,
            lkey: self.lkey(),
        };
        // SAFETY: a live PD and MR; one SGE inside the MR.
        let rc = unsafe {
            f(
                dev.pd,
                IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                IB_UVERBS_ADVISE_MR_FLAG_FLUSH,
                &mut sge,
                1,
            )
        };
        if rc != 0 {
            return Err(Fail::new(rc, format!("ibv_advise_mr failed ({rc})")));
        }
        Ok(())
    }
}

impl RcQp {
    /// Let the peer use `access` (e.g. [`IBV_ACCESS_REMOTE_READ`]) on this
    /// connected QP (an RTS → RTS modify).
    pub fn allow_remote(&self, access: i32) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            qp_access_flags: access as u32,
            ..Default::default()
        };
        self.modify(
            &mut a,
            IBV_QP_STATE | IBV_QP_ACCESS_FLAGS,
            "RTS (access flags)",
        )
    }

    /// Post one signaled RDMA READ of `len` bytes from `(remote_addr,
    /// rkey)` into `local[off..]`.
    pub fn post_read(
        &self,
        wr_id: u64,
        local: &Mr,
        off: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        self.post_read_op(wr_id, local, off, len, (remote_addr, rkey), true)
    }

    /// [`RcQp::post_read`], unsignaled when `!signaled`: no completion
    /// unless it fails, its end known from a later signaled work request's
    /// completion (RC completes a send queue in order).
    pub fn post_read_op(
        &self,
        wr_id: u64,
        local: &Mr,
        off: usize,
        len: usize,
        (remote_addr, rkey): (u64, u32),
        signaled: bool,
    ) -> Result<()> {
        let mut sge = ibv_sge {
            addr: local.addr(off),
            length: len as u32,
            lkey: local.lkey(),
        };
        let mut unions = [0u64; 11];
        // wr.rdma: remote_addr at offset 40 (unions[0]), rkey at 48.
        unions[0] = remote_addr;
        unions[(SEND_WR_RDMA_RKEY - 40) / 8] = rkey as u64;
        let mut wr = ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_RDMA_READ,
            send_flags: if signaled { IBV_SEND_SIGNALED } else { 0 },
            imm_data: 0,
            _unions: unions,
        };
        let mut bad = std::ptr::null_mut();
        let rc = self.dated_post(wr_id, crate::stall::Op::Read, local.odp, || {
            // SAFETY: qp is live; wr and sge are valid for the call; both
            // buffers are registered (the remote one by the peer).
            unsafe { (self.post_send)(self.qp, &mut wr, &mut bad) }
        });
        if rc != 0 {
            return Err(Fail::new(
                rc,
                format!("ibv_post_send(READ) failed (errno {rc})"),
            ));
        }
        Ok(())
    }
}
