//! Completion events: `ibv_get_cq_event` with a spin phase, and the
//! accounting that keeps the program's view exact.
//!
//! The program arms a CQ (`req_notify_cq`), then blocks in
//! `ibv_get_cq_event`. In a spinning mode the shim first looks at the
//! program's armed CQs on that channel for the spin budget; a CQE found there
//! is stashed (returned first by the wrapped `poll_cq`) and reported as an
//! event for that CQ at once, without waiting for the kernel's event — a
//! *synthetic* event. Rules:
//!
//! 1. A synthetic event is only given for a CQ the program armed and that
//!    has a CQE: exactly what a real event would announce.
//! 2. The real arm that was outstanding still produces one real event. The
//!    shim marks it owed (`swallow_next`); when it is read, the shim acks it
//!    itself and does not pass it on. If the program has re-armed meanwhile,
//!    the shim re-arms for real and looks at the CQ again before sleeping
//!    (the arm → re-check rule), so no wake-up is lost.
//! 3. `ibv_ack_cq_events(cq, n)` forwards at most as many acks as real events
//!    the program received; the rest acked synthetic events. So the real
//!    acks always balance the real events read, and `ibv_destroy_cq` (which
//!    waits for that balance) never hangs because of the shim.
//! 4. Events with no CQE stay possible, as without the shim (a stale arm);
//!    rdma-core documents them and programs already tolerate them.
//! 5. A non-blocking channel fd (a program waiting with epoll) is never
//!    spun on: one look, then the real non-blocking read.
//! 6. Mode `interrupt` neither looks nor synthesizes: it is the plain
//!    blocking read (with the shim's vector choice at CQ creation).
//! 7. Under `adaptive`, a blocking wait the governor plans as a pre-wake
//!    sleeps on the fd first, then looks, then reads (`verbs::prewake`):
//!    the same rules hold.
//!
//! The blocking call's wait itself is `verbs::blocking`.

use super::real::{self, GetCqEventFn};
use super::stats;
use super::table::{self, CQS, STASHED};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_cq, ibv_wc};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

/// Look at the fd only every this many spins: the CQs are the fast signal,
/// the fd only matters for CQs the shim does not manage or stale events.
pub(super) const FD_EVERY: u32 = 64;

pub(super) fn fd_readable(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, the thread's mask.
    unsafe { crate::sys::ppoll(&mut p, 1, 0, std::ptr::null()) > 0 }
}

pub(super) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on the channel's fd; a raw syscall.
    let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
    fl >= 0 && (fl as c_int) & libc::O_NONBLOCK != 0
}

/// The first CQ on `channel` the program armed (with the shim managing it)
/// for which `f` says yes, `f` called with the CQ's state locked. Skips
/// CQs whose lock is busy: the caller looks again.
fn armed_cq(
    channel: *mut ibv_comp_channel,
    mut f: impl FnMut(&mut table::CqState, *mut ibv_cq) -> bool,
) -> Option<*mut ibv_cq> {
    let ch = channel as usize;
    for s in CQS.iter() {
        if s.channel.load(Ordering::Relaxed) != ch {
            continue;
        }
        let cq = s.cq.load(Ordering::Acquire);
        if cq == 0 || cq == usize::MAX || table::hands_off(s) {
            continue;
        }
        let Ok(mut st) = s.state.try_lock() else {
            continue;
        };
        // Re-read under the lock: ibv_destroy_cq clears the key under it
        // before destroying, so a CQ seen here is still alive.
        if s.cq.load(Ordering::Acquire) != cq || !st.app_armed || st.solicited {
            continue;
        }
        if f(&mut st, cq as *mut ibv_cq) {
            return Some(cq as *mut ibv_cq);
        }
    }
    None
}

/// Make sure the stash of a locked, live `cq` holds a CQE if the CQ has
/// one (taking one from the provider: the wrapped `poll_cq` returns the
/// stash first, so the program cannot tell). True when it holds one.
fn stash_one(st: &mut table::CqState, cq: *mut ibv_cq) -> bool {
    if st.len > 0 {
        return true;
    }
    // SAFETY: `armed_cq` holds the state lock, under which the CQ is live.
    let Some((real_poll, _)) = table::real_ops(unsafe { (*cq).context }) else {
        return false;
    };
    // An extended CQ is polled only outside the program's start_poll batch
    // (cq_ex.rs); during one, this look skips it.
    let ex = if st.ex {
        match super::cq_ex::slot(cq) {
            Some(e) if e.try_peek() => Some(e),
            _ => return false,
        }
    } else {
        None
    };
    let mut wc = std::mem::MaybeUninit::<ibv_wc>::zeroed();
    // SAFETY: live CQ, room for one entry.
    let n = unsafe { real_poll(cq, 1, wc.as_mut_ptr()) };
    if n != 1 {
        if let Some(e) = ex {
            e.end_peek();
        }
        return false;
    }
    // SAFETY: the provider wrote one entry.
    st.push(unsafe { wc.assume_init() });
    STASHED.fetch_add(1, Ordering::AcqRel);
    // Released after the stash is counted: a batch that claims the CQ next
    // finds the CQE there.
    if let Some(e) = ex {
        e.end_peek();
    }
    true
}

/// A CQ on `channel` the program armed and that has a CQE (stashing one if
/// needed): the event to report.
fn synthetic(channel: *mut ibv_comp_channel) -> Option<*mut ibv_cq> {
    armed_cq(channel, |st, cq| {
        if !stash_one(st, cq) {
            return false;
        }
        st.app_armed = false;
        if st.real_armed {
            st.swallow_next = true;
        }
        true
    })
}

/// Does `channel` hold something for its waiter, without telling the
/// program anything: an armed managed CQ with a CQE (stashed if needed),
/// or a readable fd (a real event). What a dispatcher peeks, and what
/// `synthetic` or the real read will then report.
pub fn channel_ready(channel: *mut ibv_comp_channel, fd: c_int) -> bool {
    armed_cq(channel, stash_one).is_some() || fd_readable(fd)
}

/// One event, as `ibv_get_cq_event` returns it.
pub type Event = (*mut ibv_cq, *mut c_void);

/// Take an event if one is there without blocking: a synthetic one, or a
/// real one when the fd is readable. `Ok(None)`: nothing (or a swallowed
/// real event); `Err(errno)` from the real read.
///
/// # Safety
/// `channel` is live (the caller is inside `ibv_get_cq_event` on it).
pub unsafe fn try_event(
    real_get: GetCqEventFn,
    channel: *mut ibv_comp_channel,
    fd: c_int,
) -> Result<Option<Event>, c_int> {
    if let Some(ev) = synthetic_event(channel) {
        return Ok(Some(ev));
    }
    if !fd_readable(fd) {
        return Ok(None);
    }
    // SAFETY: the caller's channel, readable: the read does not block
    // (unless another thread read the event first, as without the shim).
    unsafe { real_event(real_get, channel) }.map_err(|_| {
        // SAFETY: the thread's errno slot, set by the failed read.
        unsafe { *libc::__errno_location() }
    })
}

/// A synthetic event for `channel` (see `synthetic`), counted.
pub(super) fn synthetic_event(channel: *mut ibv_comp_channel) -> Option<Event> {
    let cq = synthetic(channel)?;
    stats::add(|s| &s.synthetic, 1);
    // SAFETY: cq is live (a managed CQ just found armed).
    Some((cq, unsafe { (*cq).cq_context }))
}

/// The real read of an event (it blocks while there is none), accounted:
/// `Ok(Some)` an event for the program, `Ok(None)` one the shim swallowed,
/// `Err(rc)` the real call's failure (errno as it set it).
///
/// # Safety
/// `channel` is live.
pub(super) unsafe fn real_event(
    real_get: GetCqEventFn,
    channel: *mut ibv_comp_channel,
) -> Result<Option<Event>, c_int> {
    let mut ev_cq = std::ptr::null_mut();
    let mut ev_ctx = std::ptr::null_mut();
    // SAFETY: the caller's channel; our own out-pointers.
    let rc = unsafe { real_get(channel, &mut ev_cq, &mut ev_ctx) };
    if rc != 0 {
        return Err(rc);
    }
    match classify(ev_cq) {
        Real::Deliver => {
            stats::add(|s| &s.real, 1);
            Ok(Some((ev_cq, ev_ctx)))
        }
        Real::Swallowed => Ok(None),
    }
}

/// Hand `ev` to the program through `ibv_get_cq_event`'s out-pointers.
///
/// # Safety
/// Both pointers valid for writes.
pub(super) unsafe fn deliver(
    ev: Event,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        *cq_out = ev.0;
        *ctx_out = ev.1;
    }
    0
}

/// Hand a dispatched wait's outcome to the program: the event, or -1 with
/// errno.
///
/// # Safety
/// Both pointers valid for writes.
pub(super) unsafe fn report(
    r: Result<Event, c_int>,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    match r {
        // SAFETY: the caller's contract.
        Ok(ev) => unsafe { deliver(ev, cq_out, ctx_out) },
        Err(e) => {
            // SAFETY: the thread's errno slot.
            unsafe { *libc::__errno_location() = e };
            -1
        }
    }
}

enum Real {
    Deliver,
    Swallowed,
}

/// Account a real event the shim read for `cq`.
fn classify(cq: *mut ibv_cq) -> Real {
    let Some(s) = table::cq_slot(cq) else {
        return Real::Deliver;
    };
    let mut st = table::lock(s);
    st.real_armed = false;
    if !st.swallow_next {
        st.app_armed = false;
        st.real_unacked += 1;
        return Real::Deliver;
    }
    st.swallow_next = false;
    stats::add(|s| &s.swallowed, 1);
    // SAFETY: the shim read this event; acking it once balances it.
    unsafe { real::ack_cq_events()(cq, 1) };
    if st.app_armed {
        // The program re-armed while the owed event was outstanding (the
        // shim skipped that arm): arm for real now; the caller's loop looks
        // at the CQ again before it sleeps.
        // SAFETY: a live managed CQ points at its live context.
        let ctx = unsafe { (*cq).context };
        if let Some((_, notify)) = table::real_ops(ctx) {
            // SAFETY: the provider's req_notify_cq on a live CQ.
            if unsafe { notify(cq, 0) } == 0 {
                st.real_armed = true;
            }
        }
    }
    Real::Swallowed
}

/// The shim's `ibv_ack_cq_events`: forward the acks of real events only.
///
/// # Safety
/// libibverbs' contract for `ibv_ack_cq_events`.
pub unsafe fn ack_cq_events(cq: *mut ibv_cq, n: u32) {
    let real_ack = real::ack_cq_events();
    let fwd = match table::cq_slot(cq) {
        None => n,
        Some(s) => {
            let mut st = table::lock(s);
            let k = n.min(st.real_unacked);
            st.real_unacked -= k;
            k
        }
    };
    stats::add(|s| &s.acks_absorbed, (n - fwd) as u64);
    if fwd > 0 {
        // SAFETY: forwarding at most the real events delivered for cq.
        unsafe { real_ack(cq, fwd) };
    }
}

/// For `channel_fds`: does `channel` have an armed managed CQ with a CQE
/// (stashing one if needed)? What a synthetic event would announce.
pub(super) fn armed_cqe(channel: *mut ibv_comp_channel) -> bool {
    armed_cq(channel, stash_one).is_some()
}

/// For `channel_fds`: does a managed CQ on `channel` owe the shim a real
/// event (a synthetic one was given while its real arm was outstanding)?
pub(super) fn owes(channel: *mut ibv_comp_channel) -> bool {
    let ch = channel as usize;
    CQS.iter().any(|s| {
        s.channel.load(Ordering::Relaxed) == ch
            && s.cq.load(Ordering::Acquire) != 0
            && table::lock(s).swallow_next
    })
}

/// Ack a real event the shim read and accounted as delivered (`classify`)
/// but could not hand to the program (its CQ is being destroyed).
///
/// # Safety
/// `cq` is live.
pub(super) unsafe fn ack_undelivered(cq: *mut ibv_cq) {
    if let Some(s) = table::cq_slot(cq) {
        let mut st = table::lock(s);
        st.real_unacked = st.real_unacked.saturating_sub(1);
    }
    // SAFETY: the shim read this event; acking it once balances it.
    unsafe { real::ack_cq_events()(cq, 1) };
}
