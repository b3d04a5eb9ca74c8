//! select and pselect interposition (through the wait engine). `pselect`
//! with a signal mask is not dispatched (the mask must hold during the
//! sleep, which the dispatcher's futex sleep cannot give atomically): in
//! `dispatch` mode it spins as in `hybrid`.
//!
//! select rewrites its fd sets in place, and a zero-timeout look that finds
//! nothing clears them, so the hook keeps a copy of the caller's sets and
//! puts it back before every look and before the real call. Like Linux's
//! select, it leaves the time not slept in `*timeout`.

use crate::real::Sym;
use crate::wait;
use fastwake::preload_stats::{Call, Pass};
use std::ffi::{c_int, c_long};

static SELECT: Sym = Sym::new(c"select");
static PSELECT: Sym = Sym::new(c"pselect");

type SelectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::timeval,
) -> c_int;

type PselectFn = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

/// Words of an fd_set (glibc: FD_SETSIZE = 1024 bits).
const WORDS: usize = std::mem::size_of::<libc::fd_set>() / 8;

/// Resolve the real function (from the library constructor).
pub fn resolve() {
    SELECT.get();
    PSELECT.get();
}

/// The caller's three sets, as they were on entry (first `words` words).
struct Saved {
    sets: [*mut libc::fd_set; 3],
    copy: [[u64; WORDS]; 3],
    words: usize,
}

impl Saved {
    fn new(sets: [*mut libc::fd_set; 3], nfds: usize) -> Saved {
        let words = nfds.div_ceil(64);
        let mut copy = [[0u64; WORDS]; 3];
        for (i, s) in sets.iter().enumerate() {
            if !s.is_null() {
                for (w, c) in copy[i].iter_mut().enumerate().take(words) {
                    // SAFETY: a non-null fd_set of the caller holds at least
                    // `words` (≤ WORDS) u64s; read unaligned to be safe.
                    *c = unsafe { s.cast::<u64>().add(w).read_unaligned() };
                }
            }
        }
        Saved { sets, copy, words }
    }

    fn restore(&self) {
        for (i, s) in self.sets.iter().enumerate() {
            if !s.is_null() {
                for w in 0..self.words {
                    // SAFETY: as in `new`; the caller's sets are writable.
                    unsafe { s.cast::<u64>().add(w).write_unaligned(self.copy[i][w]) };
                }
            }
        }
    }

    /// The sets as `poll` entries (read: `POLLIN`, write: `POLLOUT`,
    /// except: `POLLPRI`), in fd order, for a dispatcher to peek.
    fn as_pollfds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        (0..self.words).flat_map(move |w| {
            let [r, wr, x] = [self.copy[0][w], self.copy[1][w], self.copy[2][w]];
            let mut bits = r | wr | x;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let on = |set: u64, ev: libc::c_short| if set >> b & 1 != 0 { ev } else { 0 };
                Some(libc::pollfd {
                    fd: (w * 64) as c_int + b as c_int,
                    events: on(r, libc::POLLIN) | on(wr, libc::POLLOUT) | on(x, libc::POLLPRI),
                    revents: 0,
                })
            })
        })
    }

    /// A readable fd among the results, for the peer-CPU sample.
    fn readable(&self) -> Option<c_int> {
        let r = self.sets[0];
        if r.is_null() {
            return None;
        }
        (0..self.words).find_map(|w| {
            // SAFETY: as in `new`.
            let v = unsafe { r.cast::<u64>().add(w).read_unaligned() };
            (v != 0).then(|| (w * 64) as c_int + v.trailing_zeros() as c_int)
        })
    }
}

/// `pselect6` with a timeout of `ns` (0: a look; more: a pre-wake's timed
/// look) as a raw syscall (never our hook).
fn probe(nfds: c_int, s: &Saved, mask: *const u64, ns: u64) -> c_int {
    s.restore();
    let ts = crate::wait::ns_to_ts(ns);
    // pselect6's sixth argument: {const sigset_t *ss; size_t ss_len}.
    let sig: [usize; 2] = [mask as usize, 8];
    let sigp: *const [usize; 2] = if mask.is_null() {
        std::ptr::null()
    } else {
        &sig
    };
    // SAFETY: the caller's sets as the real call would get them, a live
    // timespec, a live sigset descriptor or null.
    let n = unsafe {
        libc::syscall(
            libc::SYS_pselect6,
            nfds as c_long,
            s.sets[0],
            s.sets[1],
            s.sets[2],
            &ts as *const libc::timespec,
            sigp,
        ) as c_int
    };
    // Completion channels in the read set: their CQs too.
    crate::verbs::channel_fds::after_select(nfds, &s.copy[0][..s.words], s.sets[0], n)
}

/// # Safety
/// The libc contract of `select`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let a = SELECT.get();
    if a == 0 {
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: SelectFn = unsafe { std::mem::transmute(a) };
    let sets = [readfds, writefds, exceptfds];
    let plain = || {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real(nfds, readfds, writefds, exceptfds, timeout) }
    };
    // Out of the range a copy can hold, nothing to watch, or a bad
    // timeout: the real call handles (or rejects) it.
    let passed = || {
        crate::stats::passed(Call::Select, Pass::Other);
        plain()
    };
    let Ok(n) = usize::try_from(nfds) else {
        return passed();
    };
    if n == 0 || n > WORDS * 64 || sets.iter().all(|s| s.is_null()) {
        return passed();
    }
    let orig_ns = if timeout.is_null() {
        None
    } else {
        // SAFETY: a non-null timeval of the caller.
        let tv = unsafe { timeout.read() };
        if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
            return passed();
        }
        Some(tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1_000)
    };
    let go = || {
        let t0 = fastwake::cpu::monotonic_ns();
        let r = intercept(
            Call::Select,
            nfds,
            sets,
            n,
            orig_ns,
            std::ptr::null(),
            |left| {
                if let Some(ns) = left {
                    let us = ns.div_ceil(1_000);
                    // SAFETY: non-null whenever there is time left.
                    unsafe {
                        timeout.write(libc::timeval {
                            tv_sec: (us / 1_000_000) as _,
                            tv_usec: (us % 1_000_000) as _,
                        })
                    };
                }
                plain()
            },
        );
        // Report the time not slept, as Linux's select does (the real
        // call did too when it ran; this differs only by the return path).
        if let Some(o) = orig_ns {
            let left_us = o.saturating_sub(fastwake::cpu::monotonic_ns().wrapping_sub(t0)) / 1_000;
            // SAFETY: non-null when there was a timeout.
            unsafe {
                timeout.write(libc::timeval {
                    tv_sec: (left_us / 1_000_000) as _,
                    tv_usec: (left_us % 1_000_000) as _,
                })
            };
        }
        r
    };
    crate::guarded(go, plain)
}

/// The wait of `select` and `pselect`: dispatched (no mask only) or
/// through the engine, the caller's sets put back before every look and
/// before `real(left)`, the real call with what is left of the timeout.
fn intercept(
    call: Call,
    nfds: c_int,
    sets: [*mut libc::fd_set; 3],
    n: usize,
    orig_ns: Option<u64>,
    mask: *const u64,
    real: impl Fn(Option<u64>) -> c_int,
) -> c_int {
    let saved = Saved::new(sets, n);
    let dispatched = if crate::config::dispatch() && mask.is_null() {
        crate::fds::dispatched(
            || saved.as_pollfds(),
            orig_ns.map(std::time::Duration::from_nanos),
            || probe(nfds, &saved, std::ptr::null(), 0),
        )
    } else {
        None
    };
    if let Some(r) = dispatched {
        crate::stats::served(call);
        if r < 0 {
            // Like select on an error (EINTR included): the sets as the
            // caller passed them, not the last look's result. (Plain
            // memory writes: errno stays as the wait set it.)
            saved.restore();
        }
        r
    } else {
        crate::fdwait::wait(
            call,
            (crate::pollset::Key::Fd(250, nfds), &|s| {
                for p in saved.as_pollfds() {
                    s.add_fd(p.fd, p.events);
                }
            }),
            orig_ns,
            mask,
            |m, ns| probe(nfds, &saved, m, ns),
            |left| {
                saved.restore();
                real(left)
            },
            || saved.readable(),
        )
    }
}

/// # Safety
/// The libc contract of `pselect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let a = PSELECT.get();
    if a == 0 {
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: PselectFn = unsafe { std::mem::transmute(a) };
    let sets = [readfds, writefds, exceptfds];
    // SAFETY: the caller's arguments, unchanged.
    let plain = || unsafe { real(nfds, readfds, writefds, exceptfds, timeout, sigmask) };
    let Ok(n) = usize::try_from(nfds) else {
        crate::stats::passed(Call::Pselect, Pass::Other);
        return plain();
    };
    // SAFETY: the caller\'s timeout argument, which the real call reads too.
    let Ok(orig_ns) = (unsafe { wait::ts_to_ns(timeout) }) else {
        crate::stats::passed(Call::Pselect, Pass::Other);
        return plain();
    };
    if n == 0 || n > WORDS * 64 || sets.iter().all(|s| s.is_null()) {
        crate::stats::passed(Call::Pselect, Pass::Other);
        return plain();
    }
    let go = || {
        intercept(
            Call::Pselect,
            nfds,
            sets,
            n,
            orig_ns,
            sigmask.cast(),
            |left| match left {
                None => plain(),
                Some(ns) => {
                    let ts = wait::ns_to_ts(ns);
                    // SAFETY: the caller's sets (put back) with what is left
                    // of the timeout, exact to the nanosecond.
                    unsafe { real(nfds, readfds, writefds, exceptfds, &ts, sigmask) }
                }
            },
        )
    };
    crate::guarded(go, plain)
}
