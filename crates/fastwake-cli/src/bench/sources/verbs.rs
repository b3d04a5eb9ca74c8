//! Ping-pong over RDMA verbs: two RC QPs on one device, SEND/RECV like
//! perftest's `ib_send_lat`, each end waiting on its receive CQ in the chosen
//! wait mode.
//!
//! Each end has a receive CQ (the [`VerbsCq`] source it waits on, created on
//! the completion vector whose signal lands on that end's CPU) and a send CQ
//! reaped without waiting. Every message is a SEND with immediate data = its
//! sequence number, and the payload starts with it too, so a lost, duplicated
//! or reordered completion fails the run instead of skewing a figure.
//!
//! The two-process form (`bench::remote`) uses one end per process
//! ([`remote_end`]): facing another fastwake the same checks apply; facing
//! perftest the messages are plain SENDs whose length alone is checked
//! (perftest sends no sequence number).

use crate::bench::harness::End;
use fastwake::affinity::ReplacePolicy;
use fastwake::source::verbs::{CqConfig, Device, Mr, RcQp, Vector, VerbsCq};
use fastwake::{Fail, Result, Source, WaitMode, Waiter};
use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_SUCCESS, IBV_WC_WITH_IMM};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const DEPTH: u32 = 64;
const INLINE: u32 = 64;

/// One end. Field order is drop order: the QP goes before its CQs.
pub struct VerbsEnd {
    qp: RcQp,
    recv_cq: VerbsCq,
    send_cq: VerbsCq,
    mr: Mr,
    waiter: Waiter,
    size: usize,
    /// Bytes of each buffer slot (the largest size, at least 8).
    stride: usize,
    /// All receives into one slot (the two-process form: in a ping-pong
    /// one message at most is on its way to an end).
    one_slot: bool,
    /// Plain SENDs, only the length checked (a perftest peer).
    plain: bool,
    sent: u64,
    received: u64,
    in_flight: u32,
    label: &'static str,
    /// Messages received, for a watchdog (the two-process form).
    progress: Option<Arc<AtomicU64>>,
}

fn proto(msg: String) -> Fail {
    Fail::new(libc::EPROTO, msg)
}

impl VerbsEnd {
    fn slot(&self, i: u64) -> usize {
        // Slot 0 is the send buffer; receive slots follow.
        if self.one_slot {
            self.stride
        } else {
            self.stride * (1 + i as usize)
        }
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
    fn wait_stats(&self) -> Option<fastwake::wait::WaitStats> {
        Some(self.waiter.stats())
    }

    fn send(&mut self) -> Result<()> {
        self.reap_sends(true)?;
        let n = self.size.min(8);
        let tag = self.sent.to_le_bytes();
        self.mr.bytes_mut()[..n].copy_from_slice(&tag[..n]);
        let imm = (!self.plain).then_some(self.sent as u32);
        self.qp
            .post_send_op(self.sent, &self.mr, 0, self.size, imm, true)?;
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
        if self.plain {
            if wc.byte_len as usize != self.size {
                return Err(proto(format!(
                    "the peer sent {} bytes, this end expects {} (give both ends the same -s)",
                    wc.byte_len, self.size
                )));
            }
        } else {
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
        }
        self.received += 1;
        if let Some(p) = &self.progress {
            p.fetch_add(1, Ordering::Relaxed);
        }
        let len = self.stride;
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
        // The library's stall monitor watched this end's SENDs
        // (docs/design/stall-monitor.md): name every episode it saw; nothing when none.
        // (Late completions nobody looked at are no stall: this end reaps
        // its SENDs only when it sends again, so the last ones of a row
        // wait out the pause between rows.)
        for st in self.send_cq.take_stalls() {
            eprintln!("verbs: {} end: {}", self.label, st.line);
        }
        let s = self.send_cq.stall_stats();
        if s.stalls > 0 {
            eprintln!(
                "verbs: {} end: stall monitor: {} sends matched, {} stalls in {} episodes ({} not reported), {} late while unobserved, longest {:.3} ms",
                self.label,
                s.completions,
                s.stalls,
                s.episodes,
                s.unreported,
                s.unobserved,
                s.max.as_secs_f64() * 1e3
            );
        }
    }
}

fn end(
    dev: &Arc<Device>,
    mr_len: usize,
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
    let mr = Mr::new(dev, mr_len)?;
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

/// A connected pair of ends on device `dev` (`None`: the first one), port
/// `port`, GID index `gid_index` (`None`: chosen as [`Device::open`] does).
#[allow(clippy::too_many_arguments)]
pub fn pair(
    dev: Option<&str>,
    port: u8,
    gid_index: Option<u8>,
    mode: WaitMode,
    size: usize,
    cpus: (u32, u32),
    policy: ReplacePolicy,
) -> Result<(VerbsEnd, VerbsEnd)> {
    let dev = Arc::new(Device::open_port(dev, port, gid_index)?);
    let mr_len = size.max(8) * (1 + DEPTH as usize);
    let mut a = unconnected(&dev, mode, size, mr_len, cpus.0, policy, "ping")?;
    let mut b = unconnected(&dev, mode, size, mr_len, cpus.1, policy, "pong")?;
    a.qp.connect(&b.qp.endpoint())?;
    b.qp.connect(&a.qp.endpoint())?;
    a.post_receives()?;
    b.post_receives()?;
    Ok((a, b))
}

#[allow(clippy::too_many_arguments)]
fn unconnected(
    dev: &Arc<Device>,
    mode: WaitMode,
    size: usize,
    mr_len: usize,
    cpu: u32,
    policy: ReplacePolicy,
    label: &'static str,
) -> Result<VerbsEnd> {
    let (recv_cq, send_cq, mr) = end(dev, mr_len, cpu, policy, label)?;
    // Messages up to 64 bytes go inline (perftest's default is 236; inline
    // is the sender's own business, nothing on the wire tells).
    let qp = RcQp::new(&send_cq, &recv_cq, DEPTH, INLINE)?;
    Ok(VerbsEnd {
        qp,
        recv_cq,
        send_cq,
        mr,
        waiter: Waiter::new(mode),
        size,
        stride: size.max(8),
        one_slot: false,
        plain: false,
        sent: 0,
        received: 0,
        in_flight: 0,
        label,
        progress: None,
    })
}

impl VerbsEnd {
    /// Post the receive queue full (after the QP is connected).
    pub fn post_receives(&mut self) -> Result<()> {
        for i in 0..DEPTH as u64 {
            self.qp.post_recv(i, &self.mr, self.slot(i), self.stride)?;
        }
        Ok(())
    }

    /// The QP, to exchange its endpoint and connect it.
    pub fn qp(&self) -> &RcQp {
        &self.qp
    }

    /// Change the message size (at most the size the end was made for).
    pub fn set_size(&mut self, size: usize) {
        debug_assert!(size <= self.stride);
        self.size = size;
    }
}

/// One end for the two-process form, not yet connected: messages up to
/// `max_size` bytes, every receive into one slot, plain SENDs when
/// `plain` (a perftest peer), received messages counted into `progress`.
#[allow(clippy::too_many_arguments)]
pub fn remote_end(
    dev: &Arc<Device>,
    mode: WaitMode,
    max_size: usize,
    cpu: u32,
    policy: ReplacePolicy,
    plain: bool,
    label: &'static str,
    progress: Arc<AtomicU64>,
) -> Result<VerbsEnd> {
    let mut e = unconnected(dev, mode, max_size, 2 * max_size.max(8), cpu, policy, label)?;
    e.one_slot = true;
    e.plain = plain;
    e.progress = Some(progress);
    Ok(e)
}
