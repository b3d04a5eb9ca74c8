//! Completion channels inside `poll`, `epoll` and `select` sets (issue
//! 15): what rsockets' `rpoll`, UCX (`ucp_worker_get_efd`), libfabric's
//! verbs provider and Ceph do. Such a program makes its channel fd
//! non-blocking, arms its CQs, waits for the fd in `poll`/`epoll_wait` (or
//! `select`), then drains the channel with non-blocking `ibv_get_cq_event`
//! until `EAGAIN`.
//!
//! Spinning or dispatching on the fd alone cannot see a CQE before the
//! interrupt does (the fd becomes readable only when the kernel queues the
//! event). So the shim knows which fds are completion channels (it sees
//! `ibv_create_comp_channel`) and which epoll sets hold them (it sees
//! `epoll_ctl`), and the fd waits' zero-timeout looks (the spin's probes,
//! the dispatcher's peeks, the dispatched wait's take) also look at the
//! channel's armed CQs, as `ibv_get_cq_event` does for a blocking channel:
//!
//! - an armed managed CQ with a CQE (moved to the stash, which the wrapped
//!   `poll_cq` returns first) makes the channel fd report `POLLIN` /
//!   `EPOLLIN` (with the program's registered `data`); the program's next
//!   `ibv_get_cq_event` returns the synthetic event for that CQ (`event.rs`,
//!   same accounting: the real event of the outstanding arm is owed,
//!   absorbed and acked by the shim);
//! - when the kernel reports a non-blocking channel fd readable in a `poll`
//!   set (or a level-triggered epoll registration) and the channel owes the
//!   shim an event, the look reads it (non-blocking): a swallowed one is
//!   acked, and if nothing is left for the program the fd is taken out of
//!   the result, so an owed event does not wake the program for nothing; a
//!   real event for the program is kept here (`pending`) and returned by its
//!   next `ibv_get_cq_event` on that channel (its ack is the program's; if
//!   the program destroys the CQ first, the shim acks it, so
//!   `ibv_destroy_cq` never hangs on it).
//!
//! `select` sets get the same looks as `poll` sets ([`after_select`]).
//!
//! What stays as it was: the final blocking kernel call of a spinning wait
//! returns the kernel's view (an owed event can then make the program's
//! next `ibv_get_cq_event` return `EAGAIN`, which a non-blocking channel's
//! user handles); edge-triggered and one-shot epoll
//! registrations are only given synthetic readiness never filtered
//! (one-shot: not even that: a synthetic event would not disarm the
//! kernel's registration); `epoll_pwait`/`ppoll` with a signal mask are not
//! dispatched (as for every fd); mode `interrupt` does not look at CQs.
//! Tables are static (64 channels, 64 epoll registrations of channel fds):
//! beyond them, a channel passes through.

use super::event;
use super::real;
use super::stats;
use fastwake::WaitMode;
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

const MAX_CHANNELS: usize = 64;
const MAX_REGS: usize = 64;

/// A channel the shim saw created, and the real event it read for the
/// program in an fd-set look and holds until the program asks.
struct Chan {
    /// The channel's fd; -1 when the slot is free.
    fd: AtomicI32,
    channel: AtomicUsize,
    /// (cq, cq_context) of a real event read for the program.
    pending: Mutex<Option<(usize, usize)>>,
}

#[allow(clippy::declare_interior_mutable_const)]
const CHAN_FREE: Chan = Chan {
    fd: AtomicI32::new(-1),
    channel: AtomicUsize::new(0),
    pending: Mutex::new(None),
};
static CHANS: [Chan; MAX_CHANNELS] = [CHAN_FREE; MAX_CHANNELS];
/// Channels known: every look skips all of this while it is 0.
static LIVE: AtomicU32 = AtomicU32::new(0);

/// An epoll registration of a channel fd (`epfd` -1: free).
struct Reg {
    epfd: AtomicI32,
    fd: AtomicI32,
    events: AtomicU32,
    data: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const REG_FREE: Reg = Reg {
    epfd: AtomicI32::new(-1),
    fd: AtomicI32::new(-1),
    events: AtomicU32::new(0),
    data: AtomicU64::new(0),
};
static REGS: [Reg; MAX_REGS] = [REG_FREE; MAX_REGS];
/// Serialises table updates (creation, destruction, epoll_ctl: control
/// path); looks read the atomics without it.
static UPDATE: Mutex<()> = Mutex::new(());

fn update() -> std::sync::MutexGuard<'static, ()> {
    UPDATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn pending(c: &Chan) -> std::sync::MutexGuard<'_, Option<(usize, usize)>> {
    c.pending.lock().unwrap_or_else(|e| e.into_inner())
}

/// Do the fd looks look at CQs? Only with channels known, verbs active and
/// a mode that looks (not `interrupt`).
fn looking() -> bool {
    LIVE.load(Ordering::Relaxed) != 0
        && super::active()
        && crate::config::mode().is_some_and(|m| m != WaitMode::Interrupt)
}

fn chan_of(fd: c_int) -> Option<&'static Chan> {
    if fd < 0 {
        return None;
    }
    CHANS.iter().find(|c| c.fd.load(Ordering::Acquire) == fd)
}

fn add_channel(ch: *mut ibv_comp_channel) {
    // SAFETY: a channel the real call just returned.
    let fd = unsafe { (*ch).fd };
    let _g = update();
    let Some(c) = CHANS.iter().find(|c| c.fd.load(Ordering::Relaxed) < 0) else {
        if crate::config::verbose() {
            crate::diag("verbs: more than 64 completion channels; the others pass through");
        }
        return;
    };
    *pending(c) = None;
    c.channel.store(ch as usize, Ordering::Relaxed);
    c.fd.store(fd, Ordering::Release);
    LIVE.fetch_add(1, Ordering::Relaxed);
    stats::add(|s| &s.channels, 1);
}

/// Forget channel `ch` (before its destroy) and its epoll registrations.
/// Returns its fd when the shim knew the channel (a destroy that fails
/// then adds it back, [`add_channel`]).
fn remove_channel(ch: *mut ibv_comp_channel) -> Option<c_int> {
    let _g = update();
    let c = CHANS.iter().find(|c| {
        c.channel.load(Ordering::Relaxed) == ch as usize && c.fd.load(Ordering::Relaxed) >= 0
    })?;
    let fd = c.fd.swap(-1, Ordering::AcqRel);
    c.channel.store(0, Ordering::Relaxed);
    LIVE.fetch_sub(1, Ordering::Relaxed);
    for r in REGS.iter().filter(|r| r.fd.load(Ordering::Relaxed) == fd) {
        r.epfd.store(-1, Ordering::Release);
    }
    Some(fd)
}

/// # Safety
/// libibverbs' contract for `ibv_create_comp_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    let Some(real) = real::create_comp_channel() else {
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding unchanged.
    let ch = unsafe { real(ctx) };
    if !ch.is_null() && super::active() {
        crate::guarded(|| add_channel(ch), || ());
    }
    ch
}

/// # Safety
/// libibverbs' contract for `ibv_destroy_comp_channel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    let Some(real) = real::destroy_comp_channel() else {
        return libc::ENOSYS;
    };
    let known = remove_channel(ch).is_some();
    // SAFETY: forwarding unchanged.
    let rc = unsafe { real(ch) };
    if rc != 0 && known {
        // EBUSY (CQs still use it): keep serving it.
        add_channel(ch);
    }
    rc
}

/// `ibv_destroy_cq(cq)` is about to run: a real event for `cq` the shim
/// read for the program and still holds would never be acked, and the
/// destroy would wait for that ack for ever. Ack it here.
pub(super) fn forget_cq(cq: *mut ibv_cq) {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return;
    }
    for c in CHANS.iter().filter(|c| c.fd.load(Ordering::Acquire) >= 0) {
        let mut p = pending(c);
        if p.is_some_and(|(q, _)| q == cq as usize) {
            *p = None;
            drop(p);
            // SAFETY: a live CQ (its destroy has not run yet); the real
            // event was read and accounted as delivered, so this call takes
            // it back from the program's share and acks it once.
            unsafe { event::ack_undelivered(cq) };
        }
    }
}

/// The real event this look kept for the program's next `ibv_get_cq_event`
/// on `channel`, if any.
pub(super) fn take_pending(channel: *mut ibv_comp_channel) -> Option<event::Event> {
    if LIVE.load(Ordering::Relaxed) == 0 || channel.is_null() {
        return None;
    }
    let c = CHANS.iter().find(|c| {
        c.channel.load(Ordering::Relaxed) == channel as usize && c.fd.load(Ordering::Acquire) >= 0
    })?;
    let (cq, ctx) = pending(c).take()?;
    Some((cq as *mut ibv_cq, ctx as *mut c_void))
}

/// Note a successful `epoll_ctl` (from the hook): registrations of channel
/// fds are remembered, with the program's events and data.
pub(crate) fn note_epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *const libc::epoll_event) {
    if LIVE.load(Ordering::Relaxed) == 0 || chan_of(fd).is_none() {
        return;
    }
    let _g = update();
    let same =
        |r: &Reg| r.epfd.load(Ordering::Relaxed) == epfd && r.fd.load(Ordering::Relaxed) == fd;
    if let Some(r) = REGS.iter().find(|r| same(r)) {
        r.epfd.store(-1, Ordering::Release);
    }
    if op == libc::EPOLL_CTL_DEL || ev.is_null() {
        return;
    }
    // SAFETY: the real call succeeded with this event, so it is readable.
    let (events, data) = unsafe {
        (
            std::ptr::addr_of!((*ev).events).read_unaligned(),
            std::ptr::addr_of!((*ev).u64).read_unaligned(),
        )
    };
    let Some(r) = REGS.iter().find(|r| r.epfd.load(Ordering::Relaxed) < 0) else {
        if crate::config::verbose() {
            crate::diag(
                "verbs: more than 64 epoll registrations of completion channels; the others pass through",
            );
        }
        return;
    };
    r.fd.store(fd, Ordering::Relaxed);
    r.events.store(events, Ordering::Relaxed);
    r.data.store(data, Ordering::Relaxed);
    r.epfd.store(epfd, Ordering::Release);
}

/// Does `c` hold something for the program: a kept real event, or an armed
/// managed CQ with a CQE (stashed now if needed)?
fn has_event(c: &Chan) -> bool {
    if pending(c).is_some() {
        return true;
    }
    event::armed_cqe(c.channel.load(Ordering::Relaxed) as *mut ibv_comp_channel)
}

/// The kernel reported `c`'s fd readable. Is that for the program? If the
/// channel owes the shim a real event (one whose CQE the program already
/// heard of through a synthetic event), read events now (non-blocking fds
/// only: a blocking read could hang if another thread takes the event):
/// swallowed ones are acked, one for the program is kept for it.
fn for_program(c: &Chan, fd: c_int) -> bool {
    let channel = c.channel.load(Ordering::Relaxed) as *mut ibv_comp_channel;
    // Reported for another fd sharing the registration's data, no owed
    // event, or a blocking fd: the kernel's word stands.
    if pending(c).is_some()
        || !event::fd_readable(fd)
        || !event::owes(channel)
        || !event::nonblocking(fd)
    {
        return true;
    }
    let Some(real_get) = real::get_cq_event() else {
        return true;
    };
    // A few: each read is one event; the loop ends at EAGAIN.
    for _ in 0..8 {
        // SAFETY: a live channel (destroy removes it from the table first;
        // the program does not destroy a channel it is waiting on).
        match unsafe { event::real_event(real_get, channel) } {
            Ok(Some(ev)) => {
                *pending(c) = Some((ev.0 as usize, ev.1 as usize));
                return true;
            }
            Ok(None) => stats::add(|s| &s.fdset_absorbed, 1),
            Err(_) => break,
        }
    }
    // What is left: a CQE on a CQ the swallow re-armed, or nothing.
    has_event(c)
}

/// Post-process a zero-timeout `poll` on the program's set (`n` its
/// result): channel fds with an event for the program report `POLLIN`,
/// owed events are absorbed. Returns the new count.
pub(crate) fn after_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, n: c_int) -> c_int {
    if n < 0 || fds.is_null() || !looking() {
        return n;
    }
    let mut n = n;
    for i in 0..nfds as usize {
        // SAFETY: the caller's set of `nfds` pollfds, which the probe just
        // filled; no other reference to it is live.
        let p = unsafe { &mut *fds.add(i) };
        if p.events & libc::POLLIN == 0 {
            continue;
        }
        let Some(c) = chan_of(p.fd) else {
            continue;
        };
        if p.revents & libc::POLLIN != 0 {
            if !for_program(c, p.fd) {
                p.revents &= !libc::POLLIN;
                if p.revents == 0 {
                    n -= 1;
                }
            }
        } else if has_event(c) {
            if p.revents == 0 {
                n += 1;
            }
            p.revents |= libc::POLLIN;
            stats::add(|s| &s.fdset_ready, 1);
        }
    }
    n
}

/// Post-process a look of `select` (`n` its result, `readfds` the set the
/// look filled, `asked` the caller's read set as it was before the look,
/// one bit per fd below `nfds`): as [`after_poll`], a channel fd the
/// caller asked about reads ready when its channel holds an event for the
/// program, and one the kernel reported only for an owed event is taken
/// out. select counts each set bit, so each bit moves the count by one.
/// Returns the new count.
pub(crate) fn after_select(
    nfds: c_int,
    asked: &[u64],
    readfds: *mut libc::fd_set,
    n: c_int,
) -> c_int {
    if n < 0 || readfds.is_null() || !looking() {
        return n;
    }
    let words = readfds.cast::<u64>();
    let mut n = n;
    // The known channels, not every fd of the set: at most 64 of them.
    for c in CHANS.iter() {
        let fd = c.fd.load(Ordering::Acquire);
        if fd < 0 || fd >= nfds {
            continue;
        }
        let (w, bit) = (fd as usize / 64, 1u64 << (fd % 64));
        if asked.get(w).is_none_or(|a| a & bit == 0) {
            continue;
        }
        // SAFETY: `w` < `asked.len()`, the words of the caller's set that
        // the look filled (select's sets hold at least `nfds` bits);
        // unaligned, as the hook's own copies read them.
        let word = unsafe { words.add(w) };
        // SAFETY: as above.
        let got = unsafe { word.read_unaligned() };
        if got & bit != 0 {
            if !for_program(c, fd) {
                // SAFETY: as above.
                unsafe { word.write_unaligned(got & !bit) };
                n -= 1;
            }
        } else if has_event(c) {
            // SAFETY: as above.
            unsafe { word.write_unaligned(got | bit) };
            n += 1;
            stats::add(|s| &s.fdset_ready, 1);
        }
    }
    n
}

/// Post-process a zero-timeout `epoll_wait` on `epfd` (`n` its result):
/// registered channel fds with an event for the program are added (with
/// the program's data) if not reported; level-triggered ones the kernel
/// reported only for an owed event are taken out. Returns the new count.
pub(crate) fn after_epoll(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    n: c_int,
) -> c_int {
    if n < 0 || events.is_null() || !looking() {
        return n;
    }
    let mut n = n;
    for r in REGS.iter() {
        if r.epfd.load(Ordering::Acquire) != epfd {
            continue;
        }
        let (fd, evs, data) = (
            r.fd.load(Ordering::Relaxed),
            r.events.load(Ordering::Relaxed),
            r.data.load(Ordering::Relaxed),
        );
        if evs & libc::EPOLLIN as u32 == 0 || evs & libc::EPOLLONESHOT as u32 != 0 {
            continue;
        }
        let Some(c) = chan_of(fd) else {
            continue;
        };
        // SAFETY: the caller's array, of which the probe filled `n`.
        let at = |i: c_int| unsafe { events.add(i as usize) };
        // SAFETY: as above; unaligned: epoll_event is packed on x86-64.
        let data_of = |i: c_int| unsafe { std::ptr::addr_of!((*at(i)).u64).read_unaligned() };
        let found = (0..n).find(|&i| data_of(i) == data);
        match found {
            // Level-triggered only: an edge-triggered report that shared
            // its data with another fd would be lost for good.
            Some(i) if evs & libc::EPOLLET as u32 == 0 && !for_program(c, fd) => {
                for j in i..n - 1 {
                    // SAFETY: both in the filled part of the array.
                    unsafe { at(j).write_unaligned(at(j + 1).read_unaligned()) };
                }
                n -= 1;
            }
            Some(_) => {}
            None if n < max && has_event(c) => {
                // SAFETY: index n < max is inside the caller's array.
                unsafe {
                    at(n).write_unaligned(libc::epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: data,
                    })
                };
                n += 1;
                stats::add(|s| &s.fdset_ready, 1);
            }
            None => {}
        }
    }
    n
}

/// For a dispatcher's peek of an fd set (`crate::fds`): does a channel in
/// it (directly, or registered in an epoll fd of it) hold an event for the
/// program? (A CQE found is stashed, as the blocking channel's peek does.)
pub(crate) fn set_ready(set: &[libc::pollfd]) -> bool {
    if !looking() {
        return false;
    }
    set.iter()
        .filter(|p| p.events & libc::POLLIN != 0)
        .any(|p| {
            if let Some(c) = chan_of(p.fd) {
                return has_event(c);
            }
            REGS.iter().any(|r| {
                r.epfd.load(Ordering::Acquire) == p.fd
                    && r.events.load(Ordering::Relaxed) & libc::EPOLLONESHOT as u32 == 0
                    && r.events.load(Ordering::Relaxed) & libc::EPOLLIN as u32 != 0
                    && chan_of(r.fd.load(Ordering::Relaxed)).is_some_and(has_event)
            })
        })
}
