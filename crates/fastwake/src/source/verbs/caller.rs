//! A CQ and completion channel the caller created and keeps, as a source
//! (the C ABI's `fw_verbs_cq`), and the completion vector for a CQ the
//! caller is about to create.
//!
//! fastwake creates nothing here and destroys nothing: it polls the CQ,
//! arms it, reads events from its channel and acks exactly the events it
//! read (in batches, and all of them when the [`CallerCq`] is dropped, so
//! the caller's `ibv_destroy_cq` never hangs on them). The contract the
//! caller keeps is in [`CallerCq::from_raw`]; the C header states it for C.
//!
//! Differences from [`super::VerbsCq`], which owns its CQ: the channel is
//! left as the caller made it (a blocking fd stays blocking: a sleep polls
//! the fd before it reads the event, so it never blocks in the read), a CQ
//! without a channel can be waited on in poll mode only, and an event for
//! another CQ sharing the channel is acked and reported as an error
//! instead of being impossible. No lazy re-placement: the vector of an
//! existing CQ cannot be known from user space, so the caller chooses it
//! at creation with [`vector_for_cpu`].

use super::cq::{CqCore, CqStats, Wc, cq_ops, cq_source};
use super::loader::{Verbs, verbs};
use super::sys::*;
use crate::affinity::{self, Placement, VectorMap};
use crate::{Fail, Result};
use std::ffi::CStr;

/// How many events a [`CallerCq`] reads before it acks them in one call.
pub const CALLER_ACK_BATCH: u32 = 16;

/// A CQ the caller owns, with its completion channel (or none), usable with
/// every wait mode (poll mode only without a channel).
pub struct CallerCq {
    core: CqCore,
}

// SAFETY: the caller's CQ and channel may be used from any thread
// (libibverbs and the providers lock internally); the parts other threads
// touch are in the core's shared state.
unsafe impl Send for CallerCq {}

impl CallerCq {
    /// Wait on `cq`, whose completion channel is `channel` (null: the CQ
    /// has none). Checks that `channel` is the one `cq` was created with.
    ///
    /// # Safety
    /// `cq` must be a live CQ created with `ibv_create_cq` (or converted
    /// from an extended CQ with `ibv_cq_ex_to_cq`) and `channel` null or
    /// its completion channel; both must stay live until this value is
    /// dropped. While it lives, the CQ must be polled only through it
    /// ([`crate::Source::try_take`], [`CallerCq::poll`]: peeks, its own and a
    /// dispatcher's, move CQEs into a buffer these return first), and no
    /// one else may read events from the channel while a wait is under
    /// way.
    pub unsafe fn from_raw(cq: *mut ibv_cq, channel: *mut ibv_comp_channel) -> Result<CallerCq> {
        if cq.is_null() {
            return Err(Fail::invalid("the CQ is NULL"));
        }
        // SAFETY: cq is live (the caller's promise); these fields are set
        // by ibv_create_cq and never change.
        let (ctx, own) = unsafe { ((*cq).context, (*cq).channel) };
        if ctx.is_null() {
            return Err(Fail::invalid("the CQ has no context (not a CQ?)"));
        }
        if channel != own {
            return Err(Fail::invalid(if own.is_null() {
                "the CQ was created without a completion channel: pass NULL (poll mode only)"
                    .to_string()
            } else {
                format!("the channel is not the CQ's (the CQ was created with {own:p})")
            }));
        }
        // SAFETY: the context of a live CQ is open.
        let ops = unsafe { cq_ops(ctx, "the CQ's context") }?;
        // No channel, no events: libibverbs itself is then not needed
        // (a fake CQ tests this path on hosts without rdma-core).
        let lib = if channel.is_null() {
            None
        } else {
            Some(verbs()?)
        };
        // SAFETY: the caller keeps cq and channel live until we are
        // dropped, where release() runs; channel is cq's; ops are the
        // context's.
        let core = unsafe { CqCore::new(cq, channel, lib, ops, CALLER_ACK_BATCH, false) }?;
        Ok(CallerCq { core })
    }

    /// The caller's CQ.
    pub fn raw(&self) -> *mut ibv_cq {
        self.core.raw()
    }

    /// True when the CQ has a completion channel (every mode can wait on
    /// it), false when only poll mode can.
    pub fn has_channel(&self) -> bool {
        self.core.has_channel()
    }

    /// Take up to `out.len()` work completions without waiting, in the CQ's
    /// order (what fastwake's peeks set aside first, then `ibv_poll_cq`):
    /// the caller's `ibv_poll_cq` while this value lives. Ok(0): none.
    pub fn poll(&mut self, out: &mut [Wc]) -> Result<usize> {
        self.core.shared.take_into(out)
    }

    /// Event-path counters.
    pub fn stats(&self) -> CqStats {
        self.core.stats()
    }

    /// Events read and not acked yet (acked in batches, and on drop).
    pub fn unacked(&self) -> u32 {
        self.core.unacked()
    }

    /// Work completions fastwake's peeks polled and the caller has not
    /// taken yet.
    pub fn stashed(&self) -> usize {
        self.core.shared.stashed()
    }
}

cq_source!(CallerCq);

impl Drop for CallerCq {
    fn drop(&mut self) {
        // Ack what we read and stop the peek handles; the CQ and channel
        // are the caller's.
        self.core.release();
    }
}

/// The completion vector to create a CQ on whose waiter runs on `cpu`
/// (`None`: the calling thread's current CPU), for an open context of the
/// caller: the same choice [`super::VerbsCq`] makes with
/// [`super::Vector::ForCpu`] ([`crate::affinity::choose_vector`]: the
/// vector whose IRQ is delivered to that CPU, vector = CPU on providers
/// without IRQs such as rxe).
///
/// # Safety
/// `ctx` must be null or an open context (`ibv_open_device`).
pub unsafe fn vector_for_cpu(ctx: *mut ibv_context, cpu: Option<u32>) -> Result<Placement> {
    if ctx.is_null() {
        return Err(Fail::invalid("the context is NULL"));
    }
    if let Some(c) = cpu {
        existing_cpu(c)?;
    }
    let lib = verbs()?;
    // SAFETY: ctx is open (the caller's promise).
    let name = unsafe { device_name(lib, ctx) }?;
    // SAFETY: as above; the field is set at open.
    let nvec = unsafe { (*ctx).num_comp_vectors.max(0) as u32 };
    Ok(affinity::choose_vector(&VectorMap::read(&name, nvec), cpu))
}

/// `Ok` if CPU `c` exists on this host, else one line saying so.
pub(super) fn existing_cpu(c: u32) -> Result<()> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32;
    if c >= n {
        return Err(Fail::invalid(format!(
            "CPU {c} does not exist (this host has {n})"
        )));
    }
    Ok(())
}

/// The name of the device the caller's context `ctx` was opened on.
///
/// # Safety
/// `ctx` must be an open context (`ibv_open_device`).
pub(super) unsafe fn device_name(lib: &Verbs, ctx: *mut ibv_context) -> Result<String> {
    // SAFETY: ctx is open (the caller's promise): its device and the
    // device's name live as long as it.
    unsafe {
        let dev = (*ctx).device;
        if dev.is_null() {
            return Err(Fail::invalid("the context has no device (not a context?)"));
        }
        Ok(CStr::from_ptr((lib.get_device_name)(dev))
            .to_string_lossy()
            .into_owned())
    }
}
