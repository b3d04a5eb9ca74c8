//! epoll interposition: `epoll_wait`, `epoll_pwait`, `epoll_pwait2`
//! (through the wait engine) and `epoll_ctl` (passed through, noting which
//! registrations use the data.fd convention, for the peer-CPU sample).
//! In `dispatch` mode a masked wait (`epoll_pwait`, `epoll_pwait2`) is not
//! dispatched: the mask must hold during the sleep, which the
//! dispatcher's futex sleep cannot give atomically; it spins as in
//! `hybrid`.

use crate::pollset::Key;
use crate::real::Sym;
use crate::{peer, wait};
use fastwake::preload_stats::{Call, Pass};
use libc::epoll_event;
use std::ffi::{c_int, c_long};

static EPOLL_WAIT: Sym = Sym::new(c"epoll_wait");
static EPOLL_PWAIT: Sym = Sym::new(c"epoll_pwait");
static EPOLL_CTL: Sym = Sym::new(c"epoll_ctl");
static EPOLL_PWAIT2: Sym = Sym::new(c"epoll_pwait2");

type EpollWaitFn = unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int;
type EpollPwaitFn =
    unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int;
type EpollPwait2Fn = unsafe extern "C" fn(
    c_int,
    *mut epoll_event,
    c_int,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
type EpollCtlFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut epoll_event) -> c_int;

/// `crate::pollers`' key kind for an epoll fd.
const KIND_EPOLL: u8 = 1;

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    EPOLL_WAIT.get();
    EPOLL_PWAIT.get();
    EPOLL_CTL.get();
    EPOLL_PWAIT2.get();
}

/// `epoll_pwait` with a zero timeout as a raw syscall (never our hook).
fn probe(epfd: c_int, ev: *mut epoll_event, max: c_int, mask: *const u64, ns: u64) -> c_int {
    let n = if ns > 0 {
        // A pre-wake's timed look: epoll_pwait2 takes the timeout in ns
        // (epoll_pwait would round it up to a whole ms). ENOSYS before
        // Linux 5.11: the engine then stops offering pre-wakes.
        let ts = crate::wait::ns_to_ts(ns);
        // SAFETY: as below, with a live timespec.
        unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                epfd as c_long,
                ev,
                max as c_long,
                &ts as *const libc::timespec,
                mask,
                8 as c_long,
            ) as c_int
        }
    } else {
        // SAFETY: the caller's own arguments, as the real call would get
        // them; sigsetsize 8 is the kernel's sigset size (a null mask is
        // allowed).
        unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                epfd as c_long,
                ev,
                max as c_long,
                0 as c_long,
                mask,
                8 as c_long,
            ) as c_int
        }
    };
    // Completion channels registered in the set: their CQs too.
    crate::verbs::channel_fds::after_epoll(epfd, ev, max, n)
}

/// An fd among the first returned event, if registered as data.fd.
fn first_fd(ev: *mut epoll_event, n: c_int) -> Option<c_int> {
    if n <= 0 {
        return None;
    }
    // SAFETY: the kernel filled at least one event at `ev`.
    let data = unsafe { std::ptr::addr_of!((*ev).u64).read_unaligned() };
    peer::fd_of_data(data)
}

fn enosys() -> c_int {
    // SAFETY: the thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// # Safety
/// The libc contract of `epoll_wait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    maxevents: c_int,
    timeout: c_int,
) -> c_int {
    let a = EPOLL_WAIT.get();
    if a == 0 {
        return enosys();
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: EpollWaitFn = unsafe { std::mem::transmute(a) };
    if events.is_null() || maxevents <= 0 {
        crate::stats::passed(Call::EpollWait, Pass::Other);
        // SAFETY: the caller's arguments, unchanged (the kernel rejects them).
        return unsafe { real(epfd, events, maxevents, timeout) };
    }
    let go = || {
        if crate::config::dispatch()
            && let Some(n) = crate::fds::epoll_wait(epfd, wait::ms(timeout), || {
                probe(epfd, events, maxevents, std::ptr::null(), 0)
            })
        {
            crate::stats::served(Call::EpollWait);
            return n;
        }
        crate::fdwait::wait(
            Call::EpollWait,
            (Key::Fd(KIND_EPOLL, epfd), &|s| s.add_fd(epfd, libc::POLLIN)),
            wait::ms_to_ns(timeout),
            std::ptr::null(),
            |m, ns| probe(epfd, events, maxevents, m, ns),
            // SAFETY: the caller's arguments with the remaining timeout.
            |left| unsafe { real(epfd, events, maxevents, wait::ms_left(timeout, left)) },
            || first_fd(events, 1),
        )
    };
    crate::guarded(go, || {
        // SAFETY: as above.
        unsafe { real(epfd, events, maxevents, timeout) }
    })
}

/// # Safety
/// The libc contract of `epoll_pwait`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    maxevents: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let a = EPOLL_PWAIT.get();
    if a == 0 {
        return enosys();
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: EpollPwaitFn = unsafe { std::mem::transmute(a) };
    if events.is_null() || maxevents <= 0 {
        crate::stats::passed(Call::EpollPwait, Pass::Other);
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(epfd, events, maxevents, timeout, sigmask) };
    }
    let go = || {
        // With a mask the wait must run under it; the futex sleep cannot.
        if sigmask.is_null()
            && crate::config::dispatch()
            && let Some(n) = crate::fds::epoll_wait(epfd, wait::ms(timeout), || {
                probe(epfd, events, maxevents, std::ptr::null(), 0)
            })
        {
            crate::stats::served(Call::EpollPwait);
            return n;
        }
        crate::fdwait::wait(
            Call::EpollPwait,
            (Key::Fd(KIND_EPOLL, epfd), &|s| s.add_fd(epfd, libc::POLLIN)),
            wait::ms_to_ns(timeout),
            sigmask.cast(),
            |m, ns| probe(epfd, events, maxevents, m, ns),
            // SAFETY: the caller's arguments with the remaining timeout.
            |left| unsafe {
                real(
                    epfd,
                    events,
                    maxevents,
                    wait::ms_left(timeout, left),
                    sigmask,
                )
            },
            || first_fd(events, 1),
        )
    };
    crate::guarded(go, || {
        // SAFETY: as above.
        unsafe { real(epfd, events, maxevents, timeout, sigmask) }
    })
}

/// # Safety
/// The libc contract of `epoll_ctl`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut epoll_event,
) -> c_int {
    let a = EPOLL_CTL.get();
    if a == 0 {
        return enosys();
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: EpollCtlFn = unsafe { std::mem::transmute(a) };
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real(epfd, op, fd, event) };
    if r == 0 && (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD) && !event.is_null() {
        // SAFETY: the call succeeded, so `event` pointed to a readable event.
        let data = unsafe { std::ptr::addr_of!((*event).u64).read_unaligned() };
        peer::note_registered(fd, data);
    }
    if r == 0 {
        crate::verbs::channel_fds::note_epoll_ctl(epfd, op, fd, event);
    }
    r
}

/// # Safety
/// The libc contract of `epoll_pwait2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    maxevents: c_int,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let a = EPOLL_PWAIT2.get();
    if a == 0 {
        return enosys();
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: EpollPwait2Fn = unsafe { std::mem::transmute(a) };
    // SAFETY: the caller's arguments, unchanged.
    let plain = || unsafe { real(epfd, events, maxevents, timeout, sigmask) };
    // SAFETY: the caller\'s timeout argument, which the real call reads too.
    let Ok(timeout_ns) = (unsafe { wait::ts_to_ns(timeout) }) else {
        crate::stats::passed(Call::EpollPwait2, Pass::Other);
        return plain();
    };
    if events.is_null() || maxevents <= 0 {
        crate::stats::passed(Call::EpollPwait2, Pass::Other);
        return plain();
    }
    let go = || {
        if sigmask.is_null()
            && crate::config::dispatch()
            && let Some(n) = crate::fds::epoll_wait(
                epfd,
                timeout_ns.map(std::time::Duration::from_nanos),
                || probe(epfd, events, maxevents, std::ptr::null(), 0),
            )
        {
            crate::stats::served(Call::EpollPwait2);
            return n;
        }
        crate::fdwait::wait(
            Call::EpollPwait2,
            (Key::Fd(KIND_EPOLL, epfd), &|s| s.add_fd(epfd, libc::POLLIN)),
            timeout_ns,
            sigmask.cast(),
            |m, ns| probe(epfd, events, maxevents, m, ns),
            |left| match left {
                None => plain(),
                Some(ns) => {
                    let ts = wait::ns_to_ts(ns);
                    // SAFETY: the caller's arguments with what is left of
                    // the timeout, exact to the nanosecond.
                    unsafe { real(epfd, events, maxevents, &ts, sigmask) }
                }
            },
            || first_fd(events, 1),
        )
    };
    crate::guarded(go, plain)
}
