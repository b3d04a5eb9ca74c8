//! Ping-pong over RDMA verbs: two RC QPs on one device, SEND/RECV like
//! perftest's `ib_send_lat`, each end waiting on its receive CQ in the chosen
//! wait mode.
//!
//! Each end has a receive CQ (the [`VerbsCq`] source it waits on, created on
//! the completion vector whose signal lands on that end's CPU) and a send CQ
//! reaped without waiting. Every message is a SEND with immediate data = its
//! sequence number, and the payload starts with it too, so a lost, duplicated
//! or reordered completion fails the run instead of skewing a figure.

use crate::bench::harness::End;
use fastwake::affinity::ReplacePolicy;
use fastwake::source::verbs::{CqConfig, Device, Mr, RcQp, Vector, VerbsCq};
use fastwake::{Fail, Result, Source, WaitMode, Waiter};
use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_SUCCESS, IBV_WC_WITH_IMM};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

const DEPTH: u32 = 64;

/// One end. Field order is drop order: the QP goes before its CQs.
pub struct VerbsEnd {
    qp: RcQp,
    recv_cq: VerbsCq,
    send_cq: VerbsCq,
    mr: Mr,
    waiter: Waiter,
    size: usize,
    sent: u64,
    received: u64,
    in_flight: u32,
    label: &'static str,
}

fn proto(msg: String) -> Fail {
    Fail::new(libc::EPROTO, msg)
}

impl VerbsEnd {
    fn slot(&self, i: u64) -> usize {
        // Slot 0 is the send buffer; receive slots follow.
        self.size.max(8) * (1 + i as usize)
    }

    fn reap_sends(&mut self, block: bool) -> Result<()> {
        loop {
            while let Some(wc) = self.send_cq.try_take()? {
                if wc.status != IBV_WC_SUCCESS {
                    return Err(proto(format!("send completion status {}", wc.status)));
                }
                self.in_flight -= 1;
            }
            if !block || self.in_flight < DEPTH / 2 {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
}

impl End for VerbsEnd {
    fn send(&mut self) -> Result<()> {
        self.reap_sends(true)?;
        let n = self.size.min(8);
        let tag = self.sent.to_le_bytes();
        self.mr.bytes_mut()[..n].copy_from_slice(&tag[..n]);
        self.qp
            .post_send(self.sent, &self.mr, 0, self.size, self.sent as u32, true)?;
        self.in_flight += 1;
        self.sent += 1;
        self.reap_sends(false)
    }

    fn recv(&mut self) -> Result<()> {
        let wc = self.waiter.wait(&mut self.recv_cq)?;
        if wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV {
            return Err(proto(format!(
                "receive completion status {} opcode {}",
                wc.status, wc.opcode
            )));
        }
        let off = self.slot(wc.wr_id);
        let n = self.size.min(8);
        let mut want = [0u8; 8];
        want[..n].copy_from_slice(&self.received.to_le_bytes()[..n]);
        if wc.wc_flags & IBV_WC_WITH_IMM == 0
            || wc.imm_data != self.received as u32
            || wc.byte_len as usize != self.size
            || self.mr.bytes()[off..off + n] != want[..n]
        {
            return Err(proto(format!(
                "verbs delivered imm {} len {}, expected {} len {}",
                wc.imm_data, wc.byte_len, self.received as u32, self.size
            )));
        }
        self.received += 1;
        let len = self.size;
        self.qp.post_recv(wc.wr_id, &self.mr, off, len)
    }
}

impl Drop for VerbsEnd {
    fn drop(&mut self) {
        let (log, dropped) = self.recv_cq.replacements();
        for r in log {
            eprintln!("verbs: {} end re-placement: {r}", self.label);
        }
        if dropped > 0 {
            eprintln!("verbs: {} end: {dropped} more re-placements", self.label);
        }
    }
}

fn end(
    dev: &Arc<Device>,
    size: usize,
    cpu: u32,
    policy: ReplacePolicy,
    label: &'static str,
) -> Result<(VerbsCq, VerbsCq, Mr)> {
    let cfg = CqConfig {
        entries: DEPTH * 2,
        vector: Vector::ForCpu(Some(cpu)),
        policy,
        ..CqConfig::default()
    };
    let recv_cq = VerbsCq::new(dev, cfg)?;
    let send_cq = VerbsCq::new(dev, cfg)?;
    let mr = Mr::new(dev, size.max(8) * (1 + DEPTH as usize))?;
    // Say once per end where its CQ went (stderr: not part of --json); every
    // mode's pair is placed the same way.
    static SAID: AtomicU8 = AtomicU8::new(0);
    let bit = if label == "ping" { 1 } else { 2 };
    if SAID.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        eprintln!(
            "verbs: {label} end on cpu {cpu}: {} recv CQ {}",
            dev.name(),
            recv_cq.placement()
        );
    }
    Ok((recv_cq, send_cq, mr))
}

/// A connected pair of ends on device `dev` (`None`: the first one).
pub fn pair(
    dev: Option<&str>,
    mode: WaitMode,
    size: usize,
    cpus: (u32, u32),
    policy: ReplacePolicy,
) -> Result<(VerbsEnd, VerbsEnd)> {
    let dev = Arc::new(Device::open(dev, None)?);
    let (a_rcq, a_scq, a_mr) = end(&dev, size, cpus.0, policy, "ping")?;
    let (b_rcq, b_scq, b_mr) = end(&dev, size, cpus.1, policy, "pong")?;
    let inline = if size <= 64 { 64 } else { 0 };
    let a_qp = RcQp::new(&a_scq, &a_rcq, DEPTH, inline)?;
    let b_qp = RcQp::new(&b_scq, &b_rcq, DEPTH, inline)?;
    a_qp.connect(&b_qp.endpoint())?;
    b_qp.connect(&a_qp.endpoint())?;
    let mk = |qp, recv_cq, send_cq, mr, label| -> Result<VerbsEnd> {
        let e = VerbsEnd {
            qp,
            recv_cq,
            send_cq,
            mr,
            waiter: Waiter::new(mode),
            size,
            sent: 0,
            received: 0,
            in_flight: 0,
            label,
        };
        for i in 0..DEPTH as u64 {
            e.qp.post_recv(i, &e.mr, e.slot(i), size)?;
        }
        Ok(e)
    };
    Ok((
        mk(a_qp, a_rcq, a_scq, a_mr, "ping")?,
        mk(b_qp, b_rcq, b_scq, b_mr, "pong")?,
    ))
}
