//! The verbs completion source: a CQ with its own completion channel.
//!
//! Control path (`VerbsCq::new`, `Drop`) creates the channel and the CQ on the
//! chosen completion vector and tears them down acking every event first
//! (`ibv_destroy_cq` blocks forever on unacked events). Data path:
//!
//! - peek ([`crate::Source::ready`], and [`Peek::ready`] from the dispatcher's
//!   thread): `poll_cq` into a small stash. For rxe and mlx5 polling reads a
//!   user-mapped queue, no syscall. A CQE that was looked at is never lost:
//!   it waits in the stash for [`crate::Source::try_take`], which drains the stash
//!   before polling again (under the stash lock, so order is kept).
//! - arm: `req_notify_cq(cq, 0)` (one-shot; leaving it armed is harmless, it
//!   only causes one event that the next sleep consumes).
//! - sleep: `poll(2)` on the channel fd (non-blocking), then one
//!   `ibv_get_cq_event`. An event may bring no CQE (rdma-core allows that, and
//!   an arm left over from an earlier wait produces one); it is tolerated.
//!   Events are acked in batches: `ibv_ack_cq_events` takes the CQ's mutex,
//!   so one ack per event would add a lock round trip to every wake-up.
//!
//! Both paths live in `CqCore`, which does not care who owns the CQ: the
//! same code serves a CQ and channel the caller created and keeps
//! ([`super::CallerCq`], the C ABI's `fw_verbs_cq`).

use super::device::{Device, errno};
use super::loader::Verbs;
use super::monitor::{CqStalls, Stall, StallStats};
use super::sys::*;
use crate::affinity::{self, Placement, ReplacePolicy, Replacement, Replacer, VectorMap};
use crate::source::Peek;
use crate::{Fail, Result};
use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One work completion (`struct ibv_wc`).
pub type Wc = ibv_wc;

/// How many CQEs one peek pulls into the stash at most.
const POLL_BATCH: usize = 16;

/// Which completion vector to create a CQ on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vector {
    /// The vector whose signal lands on this CPU (`None`: the creating
    /// thread's current CPU). See [`crate::affinity`].
    ForCpu(Option<u32>),
    /// Exactly this vector.
    Fixed(u32),
}

/// How to create a [`VerbsCq`].
#[derive(Debug, Clone, Copy)]
pub struct CqConfig {
    /// Minimum CQ entries.
    pub entries: u32,
    /// Vector choice.
    pub vector: Vector,
    /// What to do when the waiter runs elsewhere than the CQ's signal.
    pub policy: ReplacePolicy,
    /// Ack events after this many (≥ 1).
    pub ack_batch: u32,
}

impl Default for CqConfig {
    fn default() -> Self {
        CqConfig {
            entries: 256,
            vector: Vector::ForCpu(None),
            policy: ReplacePolicy::Report,
            ack_batch: 16,
        }
    }
}

/// Counters of one CQ's event path.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CqStats {
    /// Completion events read from the channel.
    pub events: u64,
    /// `ibv_ack_cq_events` calls (each acks a batch).
    pub ack_calls: u64,
    /// Arms (`req_notify_cq`).
    pub arms: u64,
    /// Events acked so far (`events` minus those read since the last ack).
    pub acked: u64,
}

/// What the owner and [`Peek`] handles share: the CQ (null once dropped),
/// its poll op and the stash of CQEs polled but not yet taken.
pub(super) struct Shared {
    cq: AtomicPtr<ibv_cq>,
    poll_fn: PollCqFn,
    stash: Mutex<VecDeque<Wc>>,
    /// Entries in the stash (read without the lock for the cheap check).
    stashed: AtomicUsize,
    /// A provider error from a poll (-errno), kept for `try_take`.
    poll_error: AtomicI32,
    /// The stall monitor's view of this CQ; `None`: a caller's CQ, whose
    /// QPs' posts the monitor does not see.
    stalls: Option<CqStalls>,
}

// SAFETY: the CQ pointer is only dereferenced (by the provider's poll_cq,
// which locks the CQ internally) under the stash lock and only while non-null;
// CqCore::release nulls it under that lock before the CQ may be destroyed.
unsafe impl Send for Shared {}
// SAFETY: as above; every other field is Sync.
unsafe impl Sync for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Wc>> {
        self.stash.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Poll the CQ into the stash (lock held).
    fn fill(&self, st: &mut VecDeque<Wc>) {
        let cq = self.cq.load(Ordering::Acquire);
        if cq.is_null() {
            return;
        }
        let mut wc = [Wc::default(); POLL_BATCH];
        // SAFETY: cq is live (non-null under the lock, see CqCore::release); wc has room
        // for POLL_BATCH entries.
        let n = unsafe { (self.poll_fn)(cq, POLL_BATCH as i32, wc.as_mut_ptr()) };
        if n < 0 {
            self.poll_error.store(-n, Ordering::Release);
            return;
        }
        st.extend(&wc[..n as usize]);
        self.stashed.store(st.len(), Ordering::Release);
    }

    pub(super) fn ready(&self) -> bool {
        if self.stashed.load(Ordering::Acquire) > 0 || self.poll_error.load(Ordering::Acquire) != 0
        {
            return true;
        }
        let mut st = self.lock();
        self.fill(&mut st);
        if !st.is_empty()
            && let Some(m) = &self.stalls
        {
            // A peek for a waiting owner (its spin, or its dispatcher)
            // found them: the CQ was looked at now, whatever happens until
            // the owner takes them. (Not in `fill`: a take's own poll must
            // not hide that nobody looked before it.)
            m.looked();
        }
        !st.is_empty() || self.poll_error.load(Ordering::Acquire) != 0
    }

    /// Work completions looked at (polled by a peek) and not taken yet.
    pub(super) fn stashed(&self) -> usize {
        self.stashed.load(Ordering::Acquire)
    }

    /// Take up to `out.len()` completions, in the CQ's order: the stash
    /// first, then one `poll_cq` for the rest. Ok(0): none.
    pub(super) fn take_into(&self, out: &mut [Wc]) -> Result<usize> {
        let mut st = self.lock();
        let mut n = 0;
        while n < out.len()
            && let Some(w) = st.pop_front()
        {
            out[n] = w;
            n += 1;
        }
        self.stashed.store(st.len(), Ordering::Release);
        let cq = self.cq.load(Ordering::Acquire);
        if n < out.len() && !cq.is_null() {
            let want = (out.len() - n).min(i32::MAX as usize) as i32;
            // SAFETY: cq is live (non-null under the lock, see
            // CqCore::release); out[n..] has room for `want` entries.
            let got = unsafe { (self.poll_fn)(cq, want, out[n..].as_mut_ptr()) };
            if got < 0 {
                self.poll_error.store(-got, Ordering::Release);
            } else {
                n += got as usize;
            }
        }
        self.judge_taken(cq, &out[..n]);
        // A poll error is reported once nothing polled before it is left.
        if n == 0 {
            let e = self.poll_error.swap(0, Ordering::AcqRel);
            if e != 0 {
                return Err(Fail::new(e, format!("ibv_poll_cq failed (errno {e})")));
            }
        }
        Ok(n)
    }

    pub(super) fn take(&self) -> Result<Option<Wc>> {
        let mut st = self.lock();
        if st.is_empty() {
            self.fill(&mut st);
        }
        let e = self.poll_error.swap(0, Ordering::AcqRel);
        if e != 0 {
            return Err(Fail::new(e, format!("ibv_poll_cq failed (errno {e})")));
        }
        let w = st.pop_front();
        self.stashed.store(st.len(), Ordering::Release);
        self.judge_taken(self.cq.load(Ordering::Acquire), w.as_slice());
        Ok(w)
    }

    /// A take returned `wcs` from `cq` (null once released): the stall
    /// monitor's look and judgement, if it watches this CQ.
    #[inline]
    fn judge_taken(&self, cq: *mut ibv_cq, wcs: &[Wc]) {
        if let Some(m) = &self.stalls
            && !cq.is_null()
        {
            m.taken(cq, wcs);
        }
    }
}

/// The dispatcher's handle on a [`VerbsCq`]: peeking polls CQEs into the
/// CQ's stash, where the owner's `try_take` finds them first. After the CQ is
/// dropped it reports whatever was left (nothing is taken any more).
struct VerbsPeek(Arc<Shared>);

impl Peek for VerbsPeek {
    fn ready(&self) -> bool {
        self.0.ready()
    }
    // No summary flag: the producer is the NIC, which cannot raise one.
}

/// The provider's `poll_cq` and `req_notify_cq` ops of a context (what
/// verbs.h's inline `ibv_poll_cq` / `ibv_req_notify_cq` call), or why a CQ
/// of it cannot be a source.
///
/// # Safety
/// `ctx` must be an open context.
pub(super) unsafe fn cq_ops(
    ctx: *mut ibv_context,
    name: &str,
) -> Result<(PollCqFn, ReqNotifyCqFn)> {
    // SAFETY: the caller's promise: ctx is open.
    let ops = unsafe { &(*ctx).ops };
    match (ops.poll_cq, ops.req_notify_cq) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(Fail::unsupported(format!(
            "{name}: provider has no poll_cq/req_notify_cq (extended-CQ-only provider)"
        ))),
    }
}

/// Arms `cq` for one completion event (`ibv_req_notify_cq(cq, 0)`, with
/// the context's op as verbs.h's inline does).
///
/// # Safety
/// `cq` must be live and `notify` its context's `req_notify_cq`.
#[inline]
pub(super) unsafe fn req_notify(notify: ReqNotifyCqFn, cq: *mut ibv_cq) -> Result<()> {
    // SAFETY: the caller's promise.
    let rc = unsafe { notify(cq, 0) };
    if rc != 0 {
        return Err(req_notify_failed(rc));
    }
    Ok(())
}

#[cold]
fn req_notify_failed(rc: i32) -> Fail {
    Fail::new(rc, format!("ibv_req_notify_cq failed (errno {rc})"))
}

/// Destroys `cq`, then its completion channel. A failure cannot be
/// returned from a destructor, and leaking silently hides a QP still on
/// the CQ (`EBUSY`): it is said in one line on stderr instead.
///
/// # Safety
/// `cq` (if not null) and `channel` (if not null) are live, were made by
/// `lib`, are destroyed once, and every event read from the channel for
/// `cq` was acked.
pub(super) unsafe fn destroy_cq_and_channel(
    lib: &Verbs,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
) {
    if !cq.is_null() {
        // SAFETY: the caller's promise.
        let rc = unsafe { (lib.destroy_cq)(cq) };
        if rc != 0 {
            eprintln!(
                "fastwake: ibv_destroy_cq failed (errno {rc}): a QP is still on the CQ; the CQ and its channel are leaked"
            );
            // The channel still has a CQ on it: destroying it fails too.
            return;
        }
    }
    if !channel.is_null() {
        // SAFETY: the caller's promise; no CQ is left on it.
        let rc = unsafe { (lib.destroy_comp_channel)(channel) };
        if rc != 0 {
            eprintln!(
                "fastwake: ibv_destroy_comp_channel failed (errno {rc}); the channel is leaked"
            );
        }
    }
}

/// A completion channel a [`CqCore`] reads events from.
struct Channel {
    lib: &'static Verbs,
    raw: *mut ibv_comp_channel,
}

/// What every verbs CQ source does, whoever owns the CQ ([`VerbsCq`] creates
/// its own, [`super::CallerCq`] waits on the caller's): the data path (the
/// stash and the dispatcher's peek handle) and the event path (arm, sleep
/// on the channel, batched acks).
pub(super) struct CqCore {
    cq: *mut ibv_cq,
    /// `None`: a CQ without a completion channel (only poll mode waits).
    channel: Option<Channel>,
    notify_fn: ReqNotifyCqFn,
    pub(super) shared: Arc<Shared>,
    /// The dispatcher's handle on `shared`, made once (see
    /// [`crate::Source::peek`]).
    pub(super) peek: Arc<dyn Peek>,
    unacked: u32,
    ack_batch: u32,
    stats: CqStats,
}

impl CqCore {
    /// # Safety
    /// `cq` must stay live, and `channel` (null: none) must be its channel
    /// and stay live, until [`CqCore::release`] has returned; `poll_fn` and
    /// `notify_fn` are the ops of `cq`'s context.
    pub(super) unsafe fn new(
        cq: *mut ibv_cq,
        channel: *mut ibv_comp_channel,
        lib: Option<&'static Verbs>,
        (poll_fn, notify_fn): (PollCqFn, ReqNotifyCqFn),
        ack_batch: u32,
        monitored: bool,
    ) -> Result<CqCore> {
        let channel = match (channel.is_null(), lib) {
            (true, _) => None,
            (false, Some(lib)) => Some(Channel { lib, raw: channel }),
            (false, None) => return Err(Fail::invalid("a completion channel needs libibverbs")),
        };
        let shared = Arc::new(Shared {
            cq: AtomicPtr::new(cq),
            poll_fn,
            stash: Mutex::new(VecDeque::with_capacity(POLL_BATCH)),
            stashed: AtomicUsize::new(0),
            poll_error: AtomicI32::new(0),
            stalls: monitored.then(CqStalls::default),
        });
        Ok(CqCore {
            cq,
            channel,
            notify_fn,
            peek: Arc::new(VerbsPeek(Arc::clone(&shared))),
            shared,
            unacked: 0,
            ack_batch: ack_batch.max(1),
            stats: CqStats::default(),
        })
    }

    pub(super) fn raw(&self) -> *mut ibv_cq {
        self.cq
    }

    pub(super) fn has_channel(&self) -> bool {
        self.channel.is_some()
    }

    pub(super) fn stats(&self) -> CqStats {
        self.stats
    }

    /// Events read and not acked yet.
    pub(super) fn unacked(&self) -> u32 {
        self.unacked
    }

    /// Ack every event read so far.
    pub(super) fn ack(&mut self) {
        if let Some(ch) = &self.channel
            && self.unacked > 0
        {
            // SAFETY: cq is live and we read exactly `unacked` events for it.
            unsafe { (ch.lib.ack_cq_events)(self.cq, self.unacked) };
            self.stats.acked += u64::from(self.unacked);
            self.unacked = 0;
            self.stats.ack_calls += 1;
        }
    }

    pub(super) fn arm(&mut self) -> Result<()> {
        if self.channel.is_none() {
            return Err(Fail::invalid(
                "the CQ has no completion channel: only poll mode can wait on it",
            ));
        }
        self.stats.arms += 1;
        // SAFETY: cq is live; notify_fn is its context's op (new).
        unsafe { req_notify(self.notify_fn, self.cq) }
    }

    pub(super) fn sleep(&mut self, timeout: Option<Duration>) -> Result<()> {
        let Some(ch) = &self.channel else {
            return Err(Fail::invalid("the CQ has no completion channel"));
        };
        // SAFETY: the channel outlives self's borrow.
        let fd = unsafe { BorrowedFd::borrow_raw((*ch.raw).fd) };
        if !crate::source::wait_readable(fd, timeout, false, "poll completion channel")? {
            return Ok(());
        }
        let mut ev_cq = std::ptr::null_mut();
        let mut ev_ctx = std::ptr::null_mut();
        // SAFETY: the channel is live and readable (a blocking channel only
        // blocks if someone else read the event meanwhile, which the
        // sources' contracts exclude); out-pointers valid.
        let rc = unsafe { (ch.lib.get_cq_event)(ch.raw, &mut ev_cq, &mut ev_ctx) };
        if rc != 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                return Ok(());
            }
            return Err(Fail::new(e, "ibv_get_cq_event failed"));
        }
        if ev_cq != self.cq {
            // Only a caller's channel shared with other CQs does this. The
            // event is not ours to keep, and an unacked one would make
            // ibv_destroy_cq of its CQ hang: ack it and say so.
            // SAFETY: the kernel reported an event for ev_cq, a live CQ on
            // this channel (a CQ with unacked events cannot be destroyed).
            unsafe { (ch.lib.ack_cq_events)(ev_cq, 1) };
            return Err(Fail::invalid(format!(
                "the completion channel delivered an event for another CQ ({ev_cq:p}; acked and dropped): a channel fastwake waits on must serve only that CQ"
            )));
        }
        self.stats.events += 1;
        self.unacked += 1;
        if self.unacked >= self.ack_batch {
            self.ack();
        }
        // The owner slept on this CQ until now: it was looking.
        if let Some(m) = &self.shared.stalls {
            m.looked();
        }
        Ok(())
    }

    pub(super) fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the channel (and its fd) lives as long as self.
        self.channel
            .as_ref()
            .map(|ch| unsafe { BorrowedFd::borrow_raw((*ch.raw).fd) })
    }

    /// Before the CQ may be destroyed: ack every event read (ibv_destroy_cq
    /// blocks forever on unacked ones) and stop the peek handles, which may
    /// outlive us, from polling it.
    pub(super) fn release(&mut self) {
        self.ack();
        let _st = self.shared.lock();
        self.shared
            .cq
            .store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// The one [`crate::Source`] implementation of the verbs CQ sources ([`VerbsCq`],
/// [`super::CallerCq`]): every operation is their `core`'s ([`CqCore`]);
/// `arm` first runs the lazy re-placement check of the field named, if any.
macro_rules! cq_source {
    ($ty:ty $(, $replacer:ident)?) => {
        impl $crate::source::Source for $ty {
            type Completion = $crate::source::verbs::Wc;

            fn name(&self) -> &'static str {
                "verbs"
            }

            fn ready(&self) -> bool {
                self.core.shared.ready()
            }

            fn try_take(&mut self) -> $crate::Result<Option<$crate::source::verbs::Wc>> {
                self.core.shared.take()
            }

            fn arm(&mut self) -> $crate::Result<()> {
                $(self.$replacer.check();)?
                self.core.arm()
            }

            fn sleep(
                &mut self,
                _proof: $crate::source::Rechecked,
                timeout: Option<std::time::Duration>,
            ) -> $crate::Result<()> {
                self.core.sleep(timeout)
            }

            fn notify_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
                self.core.notify_fd()
            }

            fn peek(&self) -> Option<&std::sync::Arc<dyn $crate::source::Peek>> {
                Some(&self.core.peek)
            }
        }
    };
}
pub(super) use cq_source;

/// A CQ and its own completion channel, as [`create_cq`] made them; the
/// caller destroys both (the CQ first).
pub(super) struct MadeCq {
    pub(super) cq: *mut ibv_cq,
    pub(super) channel: *mut ibv_comp_channel,
    pub(super) placement: Placement,
    pub(super) ops: (PollCqFn, ReqNotifyCqFn),
}

/// What a CQ is created on: the verbs library, an open context, and the
/// device's name (for its interrupts' affinity and for error lines).
pub(super) struct CqHost<'a> {
    pub(super) lib: &'static Verbs,
    pub(super) ctx: *mut ibv_context,
    pub(super) name: &'a str,
}

impl Device {
    pub(super) fn cq_host(&self) -> CqHost<'_> {
        CqHost {
            lib: self.lib,
            ctx: self.ctx,
            name: self.name(),
        }
    }
}

/// Create a CQ of `cfg.entries` on `host`, with its own completion channel
/// (non-blocking fd), on the vector `cfg.vector` asks for: what a
/// [`VerbsCq`] and a shared CQ ([`super::SharedCq`]) are made of.
pub(super) fn create_cq(host: &CqHost<'_>, cfg: CqConfig) -> Result<MadeCq> {
    let lib = host.lib;
    // SAFETY: ctx is open (CqHost's makers); the field is set at open.
    let nvec = unsafe { (*host.ctx).num_comp_vectors.max(0) as u32 };
    let map = VectorMap::read(host.name, nvec);
    let placement = match cfg.vector {
        Vector::ForCpu(c) => affinity::choose_vector(&map, c),
        Vector::Fixed(v) if v < nvec.max(1) => affinity::fixed_vector(&map, v),
        Vector::Fixed(v) => {
            return Err(Fail::invalid(format!(
                "completion vector {v} out of range: {} has {nvec}",
                host.name
            )));
        }
    };
    // SAFETY: the context is open while host is.
    let ops = unsafe { cq_ops(host.ctx, host.name) }?;
    // SAFETY: ctx is open.
    let channel = unsafe { (lib.create_comp_channel)(host.ctx) };
    if channel.is_null() {
        return Err(Fail::new(errno(), "ibv_create_comp_channel failed"));
    }
    // SAFETY: channel is live; we own its fd for the channel's lifetime.
    let fd = unsafe { BorrowedFd::borrow_raw((*channel).fd) };
    let nb = rustix::fs::fcntl_getfl(fd)
        .and_then(|fl| rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK));
    // SAFETY: ctx and channel are live; cq_context is unused (null).
    let cq = unsafe {
        (lib.create_cq)(
            host.ctx,
            cfg.entries.max(1) as i32,
            std::ptr::null_mut(),
            channel,
            placement.vector as i32,
        )
    };
    if cq.is_null() || nb.is_err() {
        let e = match nb {
            Err(e) => Fail::os("set completion channel non-blocking", e),
            Ok(()) => Fail::new(
                errno(),
                format!(
                    "ibv_create_cq({} entries, vector {}) failed: {}",
                    cfg.entries,
                    placement.vector,
                    std::io::Error::last_os_error()
                ),
            ),
        };
        // SAFETY: cq (if any) and channel were created above, nothing
        // else refers to them, no event was read.
        unsafe { destroy_cq_and_channel(lib, cq, channel) };
        return Err(e);
    }
    Ok(MadeCq {
        cq,
        channel,
        placement,
        ops,
    })
}

/// A CQ with a completion channel, usable with every wait mode.
pub struct VerbsCq {
    dev: Arc<Device>,
    core: CqCore,
    replacer: Replacer,
}

// SAFETY: the CQ and channel belong to this value; libibverbs objects may be
// used from any thread, and the parts other threads touch are in `Shared`.
unsafe impl Send for VerbsCq {}

impl VerbsCq {
    /// Create a CQ of `cfg.entries` on `dev`, with its own completion channel
    /// (non-blocking fd), on the vector `cfg.vector` asks for.
    pub fn new(dev: &Arc<Device>, cfg: CqConfig) -> Result<VerbsCq> {
        let MadeCq {
            cq,
            channel,
            placement,
            ops,
        } = create_cq(&dev.cq_host(), cfg)?;
        // SAFETY: cq and channel were created above and are destroyed in
        // Drop, after release; the ops are the context's.
        let core = unsafe { CqCore::new(cq, channel, Some(dev.lib), ops, cfg.ack_batch, true) }?;
        Ok(VerbsCq {
            dev: Arc::clone(dev),
            core,
            replacer: Replacer::new(placement, cfg.policy),
        })
    }

    /// The raw CQ, for creating QPs on it.
    pub fn raw(&self) -> *mut ibv_cq {
        self.core.raw()
    }

    /// The device.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Where the CQ was placed (after any IRQ re-placement).
    pub fn placement(&self) -> &Placement {
        self.replacer.placement()
    }

    /// Re-placements made or recorded at wait time, and how many more were
    /// not kept.
    pub fn replacements(&self) -> (&[Replacement], u64) {
        self.replacer.log()
    }

    /// The stall monitor's counters for this CQ's send completions
    /// (`monitor`: docs/design/stall-monitor.md).
    pub fn stall_stats(&self) -> StallStats {
        self.core
            .shared
            .stalls
            .as_ref()
            .map(CqStalls::stats)
            .unwrap_or_default()
    }

    /// The stall episodes reported since the last call, oldest first (at
    /// most [`super::monitor::KEPT`] are kept; more are counted in
    /// [`StallStats::unreported`]).
    pub fn take_stalls(&self) -> Vec<Stall> {
        self.core
            .shared
            .stalls
            .as_ref()
            .map(CqStalls::take)
            .unwrap_or_default()
    }

    /// Event-path counters.
    pub fn stats(&self) -> CqStats {
        self.core.stats()
    }
}

cq_source!(VerbsCq, replacer);

impl Drop for VerbsCq {
    fn drop(&mut self) {
        self.core.release();
        let lib = self.dev.lib;
        // SAFETY: QPs using this CQ are destroyed by their owners first; cq and
        // channel were created in new() and are destroyed once, after
        // release() acked every event and stopped the peek handles.
        unsafe {
            destroy_cq_and_channel(
                lib,
                self.core.cq,
                self.core
                    .channel
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |ch| ch.raw),
            )
        };
    }
}
