//! libibverbs interposition: fastwake's wait modes for unmodified RDMA
//! programs that wait with completion channels (`ibv_get_cq_event`).
//!
//! Hooks (exported, unversioned, so they satisfy the program's
//! `@IBVERBS_1.1` references; forwarded by version, see [`real`]):
//! - `ibv_open_device`: after the real open, if the provider is one the shim
//!   understands (rxe, mlx5) and the context looks like rdma-core's
//!   (`verbs_context`), replace `ops.poll_cq` / `ops.req_notify_cq` with
//!   [`ops`]'s wrappers (the program's inline `ibv_poll_cq` /
//!   `ibv_req_notify_cq` call through them).
//! - `ibv_create_cq`: when the program asks for vector 0 (the "don't care"
//!   default), choose the vector whose signal lands on the creating thread's
//!   CPU (`fastwake::affinity`; `FASTWAKE_VERBS_VECTOR=keep` keeps 0 too);
//!   a non-zero vector was chosen on purpose and is kept. Manage the CQ if
//!   it has a channel.
//! - `ibv_get_cq_event` / `ibv_ack_cq_events`: [`event`] (spin on the armed
//!   CQs for the budget, synthetic events, exact ack accounting).
//! - `ibv_create_cq_ex` (the context's `create_cq_ex` slot): served as
//!   `ibv_create_cq`'s CQs are, a stashed CQE shown to the program's
//!   `start_poll` batch: [`cq_ex`].
//! - `ibv_destroy_cq` / `ibv_close_device`: forget the CQ / context.
//! - `mlx5dv_init_obj`: the program reads queues directly; the shim keeps
//!   its hands off every context from then on.
//!
//! Passed through untouched: everything in mode `off`; providers other than
//! rxe and mlx5; contexts that do not look like rdma-core's; extended CQs
//! asking for fields a `struct ibv_wc` does not carry (counted and noted
//! under `FASTWAKE_VERBOSE`, see [`cq_ex`]); CQs without a
//! channel; CQs armed solicited-only; programs using mlx5dv; contexts or CQs
//! beyond the shim's tables (32 / 256); a bad `FASTWAKE_VERBS_VECTOR`.

mod blocking;
pub(crate) mod channel_fds;
mod cq_ex;
mod dispatched;
pub(crate) mod event;
pub mod monitor;
#[cfg(test)]
mod monitor_tests;
pub mod odp;
mod ops;
pub(crate) mod owned;
mod prewake;
pub mod real;
mod stats;
pub mod table;

use fastwake::preload_stats::{Call, Pass};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_device};
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Providers whose ops table and event semantics the shim was checked
/// against (device-name prefixes).
const PROVIDERS: &[&str] = &["rxe", "mlx5_"];

const VEC_AUTO: u8 = 0;
const VEC_KEEP: u8 = 1;
const VEC_OFF: u8 = 2;
static VECTOR: AtomicU8 = AtomicU8::new(VEC_AUTO);
/// Set by the first mlx5dv_init_obj: direct verbs in use anywhere.
static DIRECT: AtomicBool = AtomicBool::new(false);

/// Parse `FASTWAKE_VERBS_VECTOR`. `Err`: one line; verbs then pass through.
pub fn parse_vector(v: Option<&str>) -> Result<u8, String> {
    match v.map(str::trim) {
        None | Some("") | Some("auto") => Ok(VEC_AUTO),
        Some("keep") => Ok(VEC_KEEP),
        Some(o) => Err(format!(
            "FASTWAKE_VERBS_VECTOR='{o}' is not auto or keep; verbs pass through"
        )),
    }
}

/// Constructor work: resolve symbols, read the verbs variables.
pub fn init() {
    real::resolve();
    monitor::init();
    odp::init();
    crate::fds::set_also_ready(channel_fds::set_ready);
    crate::pollers::set_cq_ops(owned::OPS);
    match parse_vector(std::env::var("FASTWAKE_VERBS_VECTOR").ok().as_deref()) {
        Ok(v) => VECTOR.store(v, Ordering::Relaxed),
        Err(line) => {
            crate::diag(&line);
            VECTOR.store(VEC_OFF, Ordering::Relaxed);
        }
    }
}

fn active() -> bool {
    crate::config::mode().is_some()
        && VECTOR.load(Ordering::Relaxed) != VEC_OFF
        && !DIRECT.load(Ordering::Relaxed)
}

fn device_name(dev: *mut ibv_device) -> Option<String> {
    let f = real::get_device_name()?;
    // SAFETY: a live device; the name is NUL-terminated and owned by it.
    let p = unsafe { f(dev) };
    // SAFETY: non-null C string.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Does `ctx` look like rdma-core's `verbs_context` with usable ops?
fn understood(ctx: *mut ibv_context) -> bool {
    // SAFETY: ctx is a live context returned by the real ibv_open_device;
    // rdma-core places `size_t sz` immediately before it (inside struct
    // verbs_context) — every provider since rdma-core 13 allocates that way.
    let sz = unsafe { *(ctx as *const usize).sub(1) };
    // SAFETY: a live context.
    let ops = unsafe { &(*ctx).ops };
    let ctx_size = std::mem::size_of::<ibv_context>();
    (ctx_size..=64 * 1024).contains(&sz) && ops.poll_cq.is_some() && ops.req_notify_cq.is_some()
}

fn wrap(ctx: *mut ibv_context, dev: *mut ibv_device) {
    let name = device_name(dev).unwrap_or_default();
    let known = PROVIDERS.iter().any(|p| name.starts_with(p));
    if !known || !understood(ctx) {
        stats::add(|s| &s.ctx_passed, 1);
        if crate::config::verbose() {
            crate::diag(&format!(
                "verbs: {name}: {}; passed through untouched",
                if known {
                    "context layout not understood"
                } else {
                    "provider not supported"
                }
            ));
        }
        return;
    }
    // SAFETY: a live context; the provider finished filling ops before
    // open returned and no other thread has the pointer yet.
    let ops = unsafe { &mut (*ctx).ops };
    let (Some(poll), Some(notify)) = (ops.poll_cq, ops.req_notify_cq) else {
        return;
    };
    if !table::add_ctx(ctx, poll, notify) {
        stats::add(|s| &s.ctx_passed, 1);
        return;
    }
    ops.poll_cq = Some(ops::poll_cq);
    ops.req_notify_cq = Some(ops::req_notify_cq);
    // The stall monitor (ops.post_send) and the ODP guard.
    monitor::wrap(ctx, &name);
    odp::wrap(ctx);
    // SAFETY: `understood` accepted the context's layout; the program has
    // not seen it yet.
    unsafe { cq_ex::wrap(ctx) };
    stats::add(|s| &s.ctx_wrapped, 1);
}

/// # Safety
/// libibverbs' contract for `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let Some(real) = real::open_device() else {
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding unchanged.
    let ctx = unsafe { real(dev) };
    if !ctx.is_null() && active() {
        crate::guarded(|| wrap(ctx, dev), || ());
    }
    ctx
}

/// # Safety
/// libibverbs' contract for `ibv_close_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    let Some(real) = real::close_device() else {
        return -1;
    };
    // SAFETY: forwarding unchanged.
    let rc = unsafe { real(ctx) };
    if rc == 0 {
        table::remove_ctx(ctx);
        monitor::unwrap(ctx);
        odp::unwrap(ctx);
        cq_ex::forget(ctx);
    }
    rc
}

fn choose_vector(ctx: *mut ibv_context, asked: c_int) -> c_int {
    // Vector 0 is what programs pass when they do not care (ibv_rc_pingpong,
    // perftest); a program that asks for another vector chose it (fastwake's
    // own library does, by affinity), so it is kept.
    if VECTOR.load(Ordering::Relaxed) != VEC_AUTO || asked != 0 {
        return asked;
    }
    // SAFETY: a live context.
    let (dev, n) = unsafe { ((*ctx).device, (*ctx).num_comp_vectors) };
    if n <= 0 {
        return asked;
    }
    let name = device_name(dev).unwrap_or_default();
    let map = fastwake::affinity::VectorMap::read(&name, n as u32);
    let p = fastwake::affinity::choose_vector(&map, None);
    if crate::config::verbose() {
        crate::diag(&format!(
            "verbs: {name} CQ {p} (program asked vector {asked})"
        ));
    }
    p.vector as c_int
}

/// # Safety
/// libibverbs' contract for `ibv_create_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Some(real) = real::create_cq() else {
        return std::ptr::null_mut();
    };
    if !active() || table::ctx_slot(ctx).is_none() {
        // SAFETY: forwarding unchanged.
        return unsafe { real(ctx, cqe, cq_context, channel, comp_vector) };
    }
    let v = crate::guarded(|| choose_vector(ctx, comp_vector), || comp_vector);
    // A CQ made without a channel gets one of the shim's when polling
    // threads may sleep: a channel cannot be added later.
    let own = if channel.is_null() && crate::pollers::on() {
        owned::create(ctx)
    } else {
        std::ptr::null_mut()
    };
    let given = if own.is_null() { channel } else { own };
    // SAFETY: the caller's arguments with the chosen vector (< the device's
    // vector count by construction), and the shim's channel where the
    // caller gave none.
    let mut cq = unsafe { real(ctx, cqe, cq_context, given, v) };
    if cq.is_null() && v != comp_vector {
        // SAFETY: the caller's call (with the shim's channel, as above).
        cq = unsafe { real(ctx, cqe, cq_context, given, comp_vector) };
    }
    if cq.is_null() && !own.is_null() {
        owned::abandon(own);
        // SAFETY: exactly the caller's call.
        cq = unsafe { real(ctx, cqe, cq_context, channel, comp_vector) };
    } else if !own.is_null() {
        // No room to remember the channel (false): the CQ keeps it,
        // unused, and is never armed (a poller on it does not sleep).
        let _ = owned::add(cq, own);
    }
    if !cq.is_null() && !channel.is_null() && table::add_cq(cq, channel, ctx) {
        stats::add(|s| &s.cqs, 1);
    }
    cq
}

/// # Safety
/// libibverbs' contract for `ibv_destroy_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let Some(real) = real::destroy_cq() else {
        return libc::ENOSYS;
    };
    // A real event for it held for the program by an fd-set look: acked
    // here, or the destroy would wait for it.
    channel_fds::forget_cq(cq);
    // Forget the CQ first: a thread looking at a shared channel must not
    // poll a CQ being destroyed.
    let saved = table::cq_slot(cq).map(table::remove_cq);
    // The shim's own channel of a polled CQ: its events acked first.
    let own = owned::destroying(cq);
    // SAFETY: forwarding unchanged. Every real event the shim read was
    // either delivered to the program (which must ack it, as without the
    // shim) or acked by the shim, so the real destroy's wait is balanced.
    let rc = unsafe { real(cq) };
    if let Some(ch) = own {
        owned::destroyed(cq, ch, rc == 0);
    }
    if rc == 0 {
        monitor::cq_destroyed(cq);
        cq_ex::destroyed(cq);
    }
    if rc != 0
        && let Some(saved) = saved
        && !table::restore_cq(cq, saved)
    {
        crate::diag(
            "verbs: ibv_destroy_cq failed and the CQ's stashed completions could not be kept",
        );
    }
    rc
}

/// # Safety
/// libibverbs' contract for `ibv_get_cq_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let Some(real) = real::get_cq_event() else {
        return -1;
    };
    if !active() {
        let why = if crate::config::mode().is_none() {
            Pass::ModeOff
        } else {
            Pass::Other
        };
        crate::stats::passed(Call::IbvGetCqEvent, why);
        // SAFETY: forwarding unchanged.
        return unsafe { real(channel, cq, cq_context) };
    }
    // A real event an fd-set look read for the program (channel_fds).
    if !cq.is_null()
        && !cq_context.is_null()
        && let Some(ev) = channel_fds::take_pending(channel)
    {
        stats::add(|s| &s.waits, 1);
        crate::stats::served(Call::IbvGetCqEvent);
        // SAFETY: out-pointers checked non-null (caller's contract).
        return unsafe { event::report(Ok(ev), cq, cq_context) };
    }
    // The front door: a blocking wait in dispatch mode goes to the CPU's
    // dispatcher; everything else (and a wait the dispatcher cannot take)
    // to the spinning loop, which asks the thread's governor.
    if crate::config::dispatch() && !channel.is_null() && !cq.is_null() && !cq_context.is_null() {
        // SAFETY: a live channel (caller's contract).
        let fd = unsafe { (*channel).fd };
        if !event::nonblocking(fd)
            && let Some(r) = dispatched::verbs_wait(real, channel, fd)
        {
            stats::add(|s| &s.waits, 1);
            crate::stats::served(Call::IbvGetCqEvent);
            // SAFETY: out-pointers checked non-null (caller's contract).
            let rc = unsafe { event::report(r, cq, cq_context) };
            if rc == 0 {
                // SAFETY: as below.
                monitor::looked(unsafe { *cq });
            }
            return rc;
        }
    }
    // SAFETY: the caller's contract, passed on.
    let rc = unsafe { blocking::get_cq_event(real, channel, cq, cq_context) };
    if rc == 0 && !cq.is_null() {
        // SAFETY: on success the out-pointer holds the CQ (an event is a
        // look at it, for the stall monitor).
        monitor::looked(unsafe { *cq });
    }
    rc
}

/// # Safety
/// libibverbs' contract for `ibv_ack_cq_events`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if real::ACK_CQ_EVENTS.get() == 0 {
        return;
    }
    // SAFETY: the caller's contract, passed on. Accounting runs even when
    // the shim is inactive: a CQ it managed earlier keeps balanced acks.
    unsafe { event::ack_cq_events(cq, nevents) }
}

/// # Safety
/// rdma-core's contract for `mlx5dv_init_obj`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx5dv_init_obj(obj: *mut c_void, obj_type: u64) -> c_int {
    // Direct verbs read CQ buffers behind libibverbs' back: stop stashing
    // or synthesizing for every context, now and later.
    DIRECT.store(true, Ordering::Relaxed);
    for c in table::CTXS.iter() {
        c.hands_off.store(true, Ordering::Relaxed);
    }
    match real::mlx5dv_init_obj() {
        // SAFETY: forwarding unchanged.
        Some(f) => unsafe { f(obj, obj_type) },
        None => libc::EOPNOTSUPP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_variable() {
        assert_eq!(parse_vector(None), Ok(VEC_AUTO));
        assert_eq!(parse_vector(Some("keep")), Ok(VEC_KEEP));
        let e = parse_vector(Some("7")).unwrap_err();
        assert!(e.contains("FASTWAKE_VERBS_VECTOR") && !e.contains('\n'));
    }
}
