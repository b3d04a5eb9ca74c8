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
use super::loader::verbs;
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
        let core = unsafe { CqCore::new(cq, channel, lib, ops, CALLER_ACK_BATCH) }?;
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
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32;
        if c >= n {
            return Err(Fail::invalid(format!(
                "CPU {c} does not exist (this host has {n})"
            )));
        }
    }
    let lib = verbs()?;
    // SAFETY: ctx is open (the caller's promise); its device and the
    // device's name live as long as it.
    let (name, nvec) = unsafe {
        let dev = (*ctx).device;
        if dev.is_null() {
            return Err(Fail::invalid("the context has no device (not a context?)"));
        }
        let name = CStr::from_ptr((lib.get_device_name)(dev))
            .to_string_lossy()
            .into_owned();
        (name, (*ctx).num_comp_vectors.max(0) as u32)
    };
    Ok(affinity::choose_vector(&VectorMap::read(&name, nvec), cpu))
}

#[cfg(test)]
mod tests {
    //! A fake provider (its `poll_cq` hands out the wr_ids queued in the
    //! CQ's `cq_context`): the data path and the rules of a caller's CQ,
    //! on hosts without rdma-core or a device. Events need a real channel
    //! (the Soft-RoCE guest: `c-abi-verbs`, `verbs-tests`).
    use super::*;
    use crate::{Source, WaitMode, Waiter};
    use std::collections::VecDeque;
    use std::ffi::{c_int, c_void};
    use std::sync::Mutex;
    use std::time::Duration;

    type Queue = Mutex<VecDeque<u64>>;

    unsafe extern "C" fn fake_poll(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
        // SAFETY: the fake CQ's cq_context is the test's queue, alive
        // while the CQ is; wc has room for n entries (poll_cq's contract).
        unsafe {
            let q = &*((*cq).cq_context as *const Queue);
            let mut q = q.lock().unwrap();
            let mut i = 0;
            while i < n
                && let Some(id) = q.pop_front()
            {
                *wc.add(i as usize) = ibv_wc {
                    wr_id: id,
                    ..Default::default()
                };
                i += 1;
            }
            i
        }
    }

    unsafe extern "C" fn fake_notify(_: *mut ibv_cq, _: c_int) -> c_int {
        0
    }

    /// A context and a CQ on it, as a provider would lay them out.
    struct Fake {
        ctx: Box<ibv_context>,
        cq: Box<ibv_cq>,
        queue: Box<Queue>,
    }

    impl Fake {
        fn new(with_ops: bool) -> Fake {
            // SAFETY: both structs are integers, pointers and optional
            // function pointers (and zeroed pthread objects, which glibc
            // takes as initialized): all-zero is a valid value.
            let (mut ctx, mut cq): (Box<ibv_context>, Box<ibv_cq>) =
                unsafe { (Box::new(std::mem::zeroed()), Box::new(std::mem::zeroed())) };
            if with_ops {
                ctx.ops.poll_cq = Some(fake_poll);
                ctx.ops.req_notify_cq = Some(fake_notify);
            }
            let queue = Box::new(Queue::default());
            cq.context = &mut *ctx;
            cq.cq_context = (&*queue as *const Queue).cast_mut().cast::<c_void>();
            Fake { ctx, cq, queue }
        }

        fn push(&self, ids: impl IntoIterator<Item = u64>) {
            self.queue.lock().unwrap().extend(ids);
        }

        fn source(&mut self) -> CallerCq {
            // SAFETY: the fake outlives every source the tests make from it.
            unsafe { CallerCq::from_raw(&mut *self.cq, std::ptr::null_mut()) }.unwrap()
        }
    }

    #[test]
    fn refuses_null_a_foreign_channel_and_a_provider_without_ops() {
        // SAFETY: null is refused before anything is read.
        let e = unsafe { CallerCq::from_raw(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(e.err().map(|e| e.errno()), Some(libc::EINVAL));
        let mut f = Fake::new(true);
        let mut other: ibv_comp_channel = ibv_comp_channel {
            context: &mut *f.ctx,
            fd: -1,
            refcnt: 0,
        };
        // SAFETY: the fake is live; the channel is refused before use.
        let e = unsafe { CallerCq::from_raw(&mut *f.cq, &mut other) }
            .err()
            .unwrap();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.cause().contains("without a completion channel"), "{e}");
        f.cq.channel = &mut other;
        // SAFETY: as above; now the CQ claims the channel, and NULL is refused.
        let e = unsafe { CallerCq::from_raw(&mut *f.cq, std::ptr::null_mut()) }
            .err()
            .unwrap();
        assert!(e.cause().contains("not the CQ's"), "{e}");
        let mut bare = Fake::new(false);
        // SAFETY: the fake is live.
        let e = unsafe { CallerCq::from_raw(&mut *bare.cq, std::ptr::null_mut()) }
            .err()
            .unwrap();
        assert_eq!(e.errno(), libc::ENOTSUP);
        // SAFETY: null is refused.
        let e = unsafe { vector_for_cpu(std::ptr::null_mut(), Some(0)) };
        assert_eq!(e.err().map(|e| e.errno()), Some(libc::EINVAL));
    }

    #[test]
    fn peeks_keep_what_they_saw_and_polls_return_it_first_in_order() {
        let mut f = Fake::new(true);
        let mut src = f.source();
        assert!(!src.ready());
        f.push([1, 2, 3]);
        // A dispatcher's look from another thread moves CQEs aside...
        let peek = src.peek().unwrap().clone();
        std::thread::spawn(move || assert!(peek.ready()))
            .join()
            .unwrap();
        assert_eq!(src.stashed(), 3);
        f.push([4, 5]);
        // ...and the caller still gets every one, in the CQ's order.
        let mut wc = [ibv_wc::default(); 2];
        assert_eq!(src.poll(&mut wc).unwrap(), 2);
        assert_eq!((wc[0].wr_id, wc[1].wr_id), (1, 2));
        let mut wc = [ibv_wc::default(); 8];
        assert_eq!(src.poll(&mut wc).unwrap(), 3);
        assert_eq!(
            wc[..3].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert_eq!(src.poll(&mut wc).unwrap(), 0);
        assert_eq!(src.stats(), CqStats::default());
    }

    #[test]
    fn poll_mode_waits_and_a_cq_without_channel_refuses_to_sleep() {
        let mut f = Fake::new(true);
        let mut src = f.source();
        assert!(!src.has_channel() && src.notify_fd().is_none());
        f.push([7]);
        let mut w = Waiter::new(WaitMode::Poll);
        assert_eq!(w.wait(&mut src).unwrap().wr_id, 7);
        let t = w.wait_timeout(&mut src, Duration::from_millis(2)).unwrap();
        assert!(t.is_none());
        // Interrupt mode would have to sleep on a channel it does not have:
        // an error naming poll mode, not a hang or a crash.
        let e = Waiter::new(WaitMode::Interrupt)
            .wait_timeout(&mut src, Duration::from_millis(2))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.cause().contains("only poll mode"), "{e}");
    }

    #[test]
    fn a_peek_handle_outliving_the_source_polls_nothing() {
        let mut f = Fake::new(true);
        let src = f.source();
        let peek = src.peek().unwrap().clone();
        drop(src);
        f.push([1]);
        assert!(!peek.ready());
        assert_eq!(f.queue.lock().unwrap().len(), 1, "the CQ was not polled");
    }
}
