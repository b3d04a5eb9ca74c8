//! Completion channels the shim owns, for CQs a program created without
//! one (how polling programs make them: perftest without `-e`).
//!
//! A CQ's channel is fixed when the CQ is created, so under
//! `FASTWAKE_POLLERS=sleep` the `ibv_create_cq` hook gives such a CQ a
//! channel of the shim's own ([`create`]). The program never sees it: it
//! never arms the CQ, never reads an event and never acks one. Only a
//! poller's sleep arms the CQ (the provider's real `req_notify_cq`, never
//! the program's wrapped one) and waits for the channel's fd; every event
//! is read and acked here ([`drain`]), and all of them before the CQ is
//! destroyed ([`destroying`]), so `ibv_destroy_cq` never waits for an ack.
//! The channel's fd is non-blocking: a drain never blocks.
//!
//! A fixed table (no allocation on hook paths); a CQ beyond it simply has
//! no channel, and a thread that polls it is never put to sleep.
//!
//! An armed CQ stays armed until its event comes: a sleep that its bound
//! ended leaves the arm in place, and the next one does not arm again
//! ([`arm`] skips the provider while the slot says armed; [`drain`]
//! clears that with each event it reads). Under TCG a syscall costs tens
//! of microseconds, and an idle poller's bound-ended sleeps were mostly
//! re-arms and empty event reads.

use super::real;
use super::table;
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const MAX: usize = table::MAX_CQ;

struct Slot {
    cq: AtomicUsize,
    channel: AtomicUsize,
    /// Armed, and no event of that arm has been read yet. Set before the
    /// provider's arm, so that a drain meanwhile can only leave it false
    /// (one arm too many, harmless), never true over a spent arm.
    armed: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    cq: AtomicUsize::new(0),
    channel: AtomicUsize::new(0),
    armed: AtomicBool::new(false),
};
static SLOTS: [Slot; MAX] = [EMPTY; MAX];

/// A new channel for a CQ of `ctx` that the program creates without one
/// (null: none could be made; the CQ is then created as asked).
pub fn create(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    let Some(f) = real::create_comp_channel() else {
        return std::ptr::null_mut();
    };
    // SAFETY: a live context (the caller's, as for its ibv_create_cq).
    let ch = unsafe { f(ctx) };
    if ch.is_null() {
        return ch;
    }
    // SAFETY: a live channel just made; its fd is ours.
    let fd = unsafe { (*ch).fd };
    // SAFETY: fcntl on our own fd, raw syscalls.
    let ok = unsafe {
        let fl = libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL);
        fl >= 0
            && libc::syscall(
                libc::SYS_fcntl,
                fd,
                libc::F_SETFL,
                fl | libc::O_NONBLOCK as i64,
            ) == 0
    };
    if !ok {
        // A blocking channel could block a drain: not used.
        destroy_channel(ch);
        return std::ptr::null_mut();
    }
    ch
}

fn destroy_channel(ch: *mut ibv_comp_channel) {
    if let Some(f) = real::destroy_comp_channel() {
        // SAFETY: a channel this module made, with no CQ left on it.
        unsafe { f(ch) };
    }
}

/// `cq` was created on `ch` (from [`create`]); false (and the channel is
/// the caller's to destroy after the CQ) when the table is full.
pub fn add(cq: *mut ibv_cq, ch: *mut ibv_comp_channel) -> bool {
    let h = table::home(cq as usize);
    for i in 0..MAX {
        let s = &SLOTS[(h + i) % MAX];
        if s.cq
            .compare_exchange(0, cq as usize, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.armed.store(false, Ordering::Relaxed);
            s.channel.store(ch as usize, Ordering::Release);
            return true;
        }
    }
    false
}

/// The channel the creation of a CQ was given that the program's CQ table
/// could not hold: destroy it once the CQ is (or was never) made.
pub fn abandon(ch: *mut ibv_comp_channel) {
    if !ch.is_null() {
        destroy_channel(ch);
    }
}

fn slot(cq: *mut ibv_cq) -> Option<&'static Slot> {
    let k = cq as usize;
    if k == 0 {
        return None;
    }
    let h = table::home(k);
    (0..MAX)
        .map(|i| &SLOTS[(h + i) % MAX])
        .find(|s| s.cq.load(Ordering::Acquire) == k)
}

/// The shim's channel of `cq`, if it has one.
#[inline]
pub fn channel_of(cq: *mut ibv_cq) -> Option<*mut ibv_comp_channel> {
    let s = slot(cq)?;
    let ch = s.channel.load(Ordering::Acquire);
    (ch != 0).then_some(ch as *mut ibv_comp_channel)
}

/// Arm `cq` for its next completion (the provider's own `req_notify_cq`,
/// so the program's arm accounting is untouched), unless its last arm is
/// still pending. False: it could not be.
pub fn arm(cq: *mut ibv_cq) -> bool {
    let s = slot(cq);
    if s.is_some_and(|s| s.armed.swap(true, Ordering::AcqRel)) {
        return true;
    }
    // SAFETY: a live CQ (the program just polled it).
    let ctx = unsafe { (*cq).context };
    let ok = table::real_ops(ctx).is_some_and(|(_, notify)| {
        // SAFETY: the provider's req_notify_cq on a live CQ of its context.
        unsafe { notify(cq, 0) == 0 }
    });
    if !ok && let Some(s) = s {
        s.armed.store(false, Ordering::Release);
    }
    ok
}

/// Read and ack every event waiting on `ch` (non-blocking).
pub fn drain(ch: *mut ibv_comp_channel) -> u32 {
    let (Some(get), ack) = (real::get_cq_event(), real::ACK_CQ_EVENTS.get()) else {
        return 0;
    };
    if ack == 0 {
        return 0;
    }
    let mut n = 0;
    loop {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a live channel of ours with a non-blocking fd; live
        // out-pointers.
        let r: c_int = unsafe { get(ch, &mut cq, &mut ctx) };
        if r != 0 || cq.is_null() {
            return n;
        }
        // That arm is spent: the next sleep arms again.
        if let Some(s) = slot(cq) {
            s.armed.store(false, Ordering::Release);
        }
        // SAFETY: the event's CQ is live (it cannot be destroyed before
        // its events are acked: `destroying` drains first).
        unsafe { real::ack_cq_events()(cq, 1) };
        n += 1;
    }
}

/// `cq` is about to be destroyed: ack what its channel holds, and return
/// the channel to destroy once the CQ is gone ([`destroyed`]).
pub fn destroying(cq: *mut ibv_cq) -> Option<*mut ibv_comp_channel> {
    let ch = channel_of(cq)?;
    drain(ch);
    Some(ch)
}

/// `cq` was destroyed (`ok`) or its destruction failed: forget it and
/// destroy its channel, or keep both.
pub fn destroyed(cq: *mut ibv_cq, ch: *mut ibv_comp_channel, ok: bool) {
    if !ok {
        return;
    }
    if let Some(s) = slot(cq) {
        s.channel.store(0, Ordering::Release);
        s.armed.store(false, Ordering::Relaxed);
        s.cq.store(0, Ordering::Release);
    }
    destroy_channel(ch);
}

/// The fd of a channel of ours.
pub fn fd(ch: *mut ibv_comp_channel) -> c_int {
    // SAFETY: a live channel this module made.
    unsafe { (*ch).fd }
}

/// The operations `crate::pollers` needs of a CQ it may sleep on (it sits
/// below the verbs hooks, so they are handed to it at init).
pub(super) const OPS: crate::pollers::CqOps = crate::pollers::CqOps {
    channel_fd: |cq| channel_of(cq as *mut ibv_cq).map(fd),
    arm: |cq| arm(cq as *mut ibv_cq),
    drain: |cq| {
        if let Some(ch) = channel_of(cq as *mut ibv_cq) {
            drain(ch);
        }
    },
};
