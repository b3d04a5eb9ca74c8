//! A per-core shared CQ: one CQ and one completion channel for every QP
//! the connections of one core use, demultiplexed into one inbox per
//! owner ([`crate::source::demux`]), so a dispatcher polls one CQ per pass
//! whatever the number of connections.
//!
//! Completions are routed by QP number ([`Route::QpNum`]: one inbox per
//! QP, its sends and receives together) or by the high bits of the
//! `wr_id` ([`Route::WrIdHigh`]: the owner's id in the bits the caller
//! posts it in, for owners with several QPs or for an SRQ). Created on
//! the completion vector of the core it serves, as a [`super::VerbsCq`]
//! is. Interrupt mode: the owners share the completion channel; see
//! [`crate::source::demux::Inbox`]. Events are acked in batches, as a
//! `VerbsCq`'s (`ibv_ack_cq_events` takes the CQ's mutex).
//!
//! Destroy order: the QPs first (as for any CQ), then every inbox and the
//! [`Demux`]; the CQ goes with the last of them.
//!
//! Made on a [`Device`] ([`SharedCq::new`]), or on a context the caller
//! opened and keeps ([`SharedCq::on_context`], the C ABI's
//! `fw_verbs_shared_cq`): fastwake then creates the CQ and its channel on
//! that context and destroys both, and the caller creates the QPs on
//! [`SharedCq::raw`] with its own verbs.

use super::caller::{device_name, existing_cpu};
use super::cq::{CqConfig, CqHost, CqStats, MadeCq, Vector, Wc, create_cq, destroy_cq_and_channel};
use super::device::{Device, errno};
use super::loader::{Verbs, verbs};
use super::monitor::{CqStalls, Stall, StallStats};
use super::sys::*;
use crate::affinity::Placement;
use crate::source::demux::{Demux, SharedQueue};
use crate::{Fail, Result};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// CQEs one poll moves at most.
const POLL_BATCH: usize = 16;

/// What a shared CQ routes its completions by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The QP number (`ibv_wc::qp_num`): an inbox per QP.
    QpNum,
    /// `wr_id >> shift`: the owner's key in the high bits of every work
    /// request it posts.
    WrIdHigh(u32),
}

impl Route {
    /// The key `wc` is routed under.
    pub fn key(&self, wc: &Wc) -> u64 {
        match *self {
            Route::QpNum => u64::from(wc.qp_num),
            // A shift of 64 or more leaves no bits: every completion under
            // key 0 (one owner), not a panic.
            Route::WrIdHigh(shift) => wc.wr_id.checked_shr(shift).unwrap_or(0),
        }
    }
}

/// The shared CQ; make one with [`SharedCq::new`] or
/// [`SharedCq::on_context`], which return its demultiplexer.
pub struct SharedCq {
    lib: &'static Verbs,
    /// `None`: made on a caller's context ([`SharedCq::on_context`]).
    dev: Option<Arc<Device>>,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    poll_fn: PollCqFn,
    notify_fn: ReqNotifyCqFn,
    route: Route,
    placement: Placement,
    /// Events read and not acked yet.
    unacked: Mutex<u32>,
    ack_batch: u32,
    events: AtomicU64,
    arms: AtomicU64,
    ack_calls: AtomicU64,
    acked: AtomicU64,
    /// The stall monitor's view (`None` on a caller's context, whose QPs'
    /// posts the monitor does not see).
    stalls: Option<CqStalls>,
}

// SAFETY: the CQ and channel belong to this value until it drops; verbs
// objects may be used from any thread (the provider locks the CQ in
// poll_cq and req_notify_cq), and the demultiplexer polls from one thread
// at a time.
unsafe impl Send for SharedCq {}
// SAFETY: as above; the ack count is under a mutex.
unsafe impl Sync for SharedCq {}

impl SharedCq {
    /// A shared CQ of `cfg.entries` (room for the completions of every QP
    /// it will serve) on the vector `cfg.vector` asks for, routed by
    /// `route`. Inboxes: [`Demux::inbox`] with the QP number
    /// ([`super::RcQp::qp_num`]) or the `wr_id` key.
    pub fn new(dev: &Arc<Device>, cfg: CqConfig, route: Route) -> Result<Demux<SharedCq>> {
        let made = create_cq(&dev.cq_host(), cfg)?;
        Ok(SharedCq::made(
            dev.lib,
            Some(Arc::clone(dev)),
            made,
            cfg,
            route,
        ))
    }

    /// A shared CQ, as [`SharedCq::new`] makes, on a context the caller
    /// opened: fastwake creates the CQ and its channel on `ctx` (and
    /// destroys them with the last handle); the caller creates the QPs on
    /// [`SharedCq::raw`] (`ibv_create_qp`), and destroys them first.
    ///
    /// # Safety
    /// `ctx` must be an open context (`ibv_open_device`) that stays open
    /// until the demultiplexer and every inbox are dropped.
    pub unsafe fn on_context(
        ctx: *mut ibv_context,
        cfg: CqConfig,
        route: Route,
    ) -> Result<Demux<SharedCq>> {
        if ctx.is_null() {
            return Err(Fail::invalid("the verbs context is NULL"));
        }
        if let Vector::ForCpu(Some(c)) = cfg.vector {
            existing_cpu(c)?;
        }
        let lib = verbs()?;
        // SAFETY: ctx is open (the caller's promise).
        let name = unsafe { device_name(lib, ctx) }?;
        let made = create_cq(
            &CqHost {
                lib,
                ctx,
                name: &name,
            },
            cfg,
        )?;
        Ok(SharedCq::made(lib, None, made, cfg, route))
    }

    fn made(
        lib: &'static Verbs,
        dev: Option<Arc<Device>>,
        made: MadeCq,
        cfg: CqConfig,
        route: Route,
    ) -> Demux<SharedCq> {
        let MadeCq {
            cq,
            channel,
            placement,
            ops: (poll_fn, notify_fn),
        } = made;
        // QPs on a caller's context are the caller's (ibv_create_qp): their
        // posts are not dated, so there is nothing to match.
        let stalls = dev.is_some().then(CqStalls::default);
        Demux::new(SharedCq {
            lib,
            dev,
            cq,
            channel,
            poll_fn,
            notify_fn,
            route,
            placement,
            unacked: Mutex::new(0),
            ack_batch: cfg.ack_batch.max(1),
            events: AtomicU64::new(0),
            arms: AtomicU64::new(0),
            ack_calls: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            stalls,
        })
    }

    /// The raw CQ, for creating QPs on it.
    pub fn raw(&self) -> *mut ibv_cq {
        self.cq
    }

    /// The device (`None`: made on a caller's context).
    pub fn device(&self) -> Option<&Arc<Device>> {
        self.dev.as_ref()
    }

    /// Where the CQ was placed.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Event-path counters.
    pub fn stats(&self) -> CqStats {
        CqStats {
            events: self.events.load(Ordering::Relaxed),
            ack_calls: self.ack_calls.load(Ordering::Relaxed),
            arms: self.arms.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
        }
    }

    /// The stall monitor's counters for the send completions of the QPs
    /// on this CQ (zero on a caller's context: docs/design/stall-monitor.md).
    pub fn stall_stats(&self) -> StallStats {
        self.stalls
            .as_ref()
            .map(CqStalls::stats)
            .unwrap_or_default()
    }

    /// The stall episodes reported since the last call (see
    /// [`super::VerbsCq::take_stalls`]).
    pub fn take_stalls(&self) -> Vec<Stall> {
        self.stalls.as_ref().map(CqStalls::take).unwrap_or_default()
    }

    fn ack(&self, unacked: &mut u32) {
        if *unacked > 0 {
            // SAFETY: cq is live and we read exactly `unacked` events for it.
            unsafe { (self.lib.ack_cq_events)(self.cq, *unacked) };
            self.acked.fetch_add(u64::from(*unacked), Ordering::Relaxed);
            self.ack_calls.fetch_add(1, Ordering::Relaxed);
            *unacked = 0;
        }
    }
}

impl SharedQueue for SharedCq {
    type Item = Wc;

    fn poll(&self, out: &mut Vec<Wc>) -> Result<()> {
        let mut wc = [Wc::default(); POLL_BATCH];
        // SAFETY: cq is live while self is; wc has room for POLL_BATCH.
        let n = unsafe { (self.poll_fn)(self.cq, POLL_BATCH as i32, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(Fail::new(-n, format!("ibv_poll_cq failed (errno {})", -n)));
        }
        // Every pump is for an owner that waits or looks: a look.
        if let Some(m) = &self.stalls {
            m.taken(self.cq, &wc[..n as usize]);
        }
        out.extend_from_slice(&wc[..n as usize]);
        Ok(())
    }

    fn key(&self, wc: &Wc) -> u64 {
        self.route.key(wc)
    }

    fn arm(&self) -> Result<()> {
        self.arms.fetch_add(1, Ordering::Relaxed);
        // SAFETY: cq is live while self is; notify_fn is its context's op.
        unsafe { super::cq::req_notify(self.notify_fn, self.cq) }
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the channel (and its fd) lives as long as self.
        Some(unsafe { BorrowedFd::borrow_raw((*self.channel).fd) })
    }

    fn take_event(&self) -> Result<()> {
        let mut ev_cq = std::ptr::null_mut();
        let mut ev_ctx = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking (create_cq), so
        // this returns EAGAIN when another sleeper took the event.
        let rc = unsafe { (self.lib.get_cq_event)(self.channel, &mut ev_cq, &mut ev_ctx) };
        if rc != 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                return Ok(());
            }
            return Err(Fail::new(e, "ibv_get_cq_event failed"));
        }
        // The channel is this CQ's alone (create_cq made it for it).
        debug_assert_eq!(ev_cq, self.cq);
        self.events.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.stalls {
            m.looked();
        }
        let mut unacked = self.unacked.lock().unwrap_or_else(|e| e.into_inner());
        *unacked += 1;
        if *unacked >= self.ack_batch {
            self.ack(&mut unacked);
        }
        Ok(())
    }
}

impl Drop for SharedCq {
    fn drop(&mut self) {
        let mut unacked = std::mem::take(self.unacked.get_mut().unwrap_or_else(|e| e.into_inner()));
        self.ack(&mut unacked);
        // SAFETY: every inbox and handle is gone (they hold the
        // demultiplexer that owns self), the QPs were destroyed first
        // (module docs), every event read was acked above; cq and channel
        // were made by create_cq and are destroyed once.
        unsafe { destroy_cq_and_channel(self.lib, self.cq, self.channel) };
    }
}

/// A CQ a QP can be created on: a [`super::VerbsCq`] or a shared CQ.
pub trait CqRef {
    /// The raw CQ.
    fn cq_raw(&self) -> *mut ibv_cq;
    /// Its device (`None`: a CQ on a caller's context, whose QPs the
    /// caller creates).
    fn cq_device(&self) -> Option<&Arc<Device>>;
}

impl CqRef for super::VerbsCq {
    fn cq_raw(&self) -> *mut ibv_cq {
        self.raw()
    }
    fn cq_device(&self) -> Option<&Arc<Device>> {
        Some(self.device())
    }
}

impl CqRef for Demux<SharedCq> {
    fn cq_raw(&self) -> *mut ibv_cq {
        self.queue().raw()
    }
    fn cq_device(&self) -> Option<&Arc<Device>> {
        self.queue().device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_qp_number_or_wr_id_high_bits() {
        let wc = Wc {
            qp_num: 0x11,
            wr_id: 0xabcd_0000_0000_0042,
            ..Wc::default()
        };
        assert_eq!(Route::QpNum.key(&wc), 0x11);
        assert_eq!(Route::WrIdHigh(48).key(&wc), 0xabcd);
        assert_eq!(Route::WrIdHigh(0).key(&wc), wc.wr_id);
        assert_eq!(Route::WrIdHigh(64).key(&wc), 0);
    }
}
