//! The fd hooks' waits as library sources, for dispatch mode: an
//! `epoll_wait` (its epoll fd), or a `poll`/`select` set of up to
//! [`MAX_FDS`] fds, peeked by a dispatcher with a zero-timeout `poll` on a
//! copy of the set. See `crate::dispatch` for what the program sees.

use fastwake::Fail;
use fastwake::source::{Peek, Rechecked, Source};
use std::cell::RefCell;
use std::ffi::{c_int, c_long};
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    // The handle of the set this thread waited on last: kept across waits
    // so the dispatcher registration is reused while the set stays the
    // same (a new handle, one allocation, only when it changes). Has a
    // destructor; only touched in dispatch mode.
    static LAST: RefCell<Option<(FdsPeek, Arc<dyn Peek>)>> = const { RefCell::new(None) };
}

/// Most fds a dispatched `poll` may watch; more and the call behaves as in
/// `hybrid` (the set is copied into the peek handle, inline).
pub const MAX_FDS: usize = 8;

/// What a dispatcher peeks: a small set of fds with the events waited for
/// (one epoll fd with `POLLIN`, or a `poll` call's set), tested with a
/// zero-timeout `poll` on a copy, so nothing is consumed (edge-triggered
/// epoll registrations included) and the caller's `revents` are not
/// touched. A closed fd reads as ready (`POLLNVAL`): the owner then learns
/// the error from its own zero-timeout call.
#[derive(Clone)]
pub(crate) struct FdsPeek {
    fds: [libc::pollfd; MAX_FDS],
    n: usize,
}

impl FdsPeek {
    pub(crate) fn new(set: &[libc::pollfd]) -> Option<FdsPeek> {
        if set.is_empty() || set.len() > MAX_FDS {
            return None;
        }
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_FDS];
        for (d, s) in fds.iter_mut().zip(set) {
            *d = libc::pollfd {
                fd: s.fd,
                events: s.events,
                revents: 0,
            };
        }
        Some(FdsPeek { fds, n: set.len() })
    }

    /// Same fds and events as `set`?
    fn watches(&self, set: &[libc::pollfd]) -> bool {
        set.len() == self.n
            && self.fds[..self.n]
                .iter()
                .zip(set)
                .all(|(a, b)| a.fd == b.fd && a.events == b.events)
    }

    /// `poll` on a copy: >0 some fd ready (or invalid), 0 none, -errno.
    fn poll(&self, timeout_ms: c_int) -> c_int {
        let mut fds = self.fds;
        // SAFETY: `n` initialised pollfds on our stack, the thread's mask.
        let r = unsafe {
            crate::sys::ppoll(
                fds.as_mut_ptr(),
                self.n as libc::nfds_t,
                timeout_ms,
                std::ptr::null(),
            )
        };
        if r < 0 {
            // SAFETY: the thread's errno slot.
            -(unsafe { *libc::__errno_location() })
        } else {
            r as c_int
        }
    }
}

impl Peek for FdsPeek {
    fn ready(&self) -> bool {
        self.poll(0) != 0
    }
}

/// One hooked wait as a source: "taking" is the zero-timeout call that
/// fills the caller's buffer (`take`, returning like libc: n, or -1 and
/// errno).
struct HookWait<'a, F: FnMut() -> c_int> {
    /// The registered handle (the same set as `set`).
    peek: &'a Arc<dyn Peek>,
    set: &'a FdsPeek,
    take: F,
}

impl<F: FnMut() -> c_int> Source for HookWait<'_, F> {
    type Completion = c_int;

    fn name(&self) -> &'static str {
        "fds"
    }

    fn ready(&self) -> bool {
        self.set.poll(0) != 0
    }

    fn try_take(&mut self) -> fastwake::Result<Option<c_int>> {
        match (self.take)() {
            0 => Ok(None),
            n if n > 0 => Ok(Some(n)),
            // SAFETY: the thread's errno slot, set by the failed call.
            _ => Err(Fail::new(unsafe { *libc::__errno_location() }, "wait")),
        }
    }

    fn arm(&mut self) -> fastwake::Result<()> {
        // Level: `poll` queues us before it checks.
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> fastwake::Result<()> {
        sleep_poll(self.set, timeout, true)
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(self.peek)
    }
}

/// Sleep in `poll` on `p`'s fds until one is ready or `timeout` passes
/// (rounded up to whole ms: never before the deadline). `eintr_ends`: a
/// signal ends the wait with EINTR, else it is a spurious wake-up.
pub(crate) fn sleep_poll(
    p: &FdsPeek,
    timeout: Option<Duration>,
    eintr_ends: bool,
) -> fastwake::Result<()> {
    let ms = match timeout {
        None => -1,
        Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int,
    };
    match p.poll(ms) {
        e if e == -libc::EINTR && eintr_ends => Err(Fail::new(libc::EINTR, "wait interrupted")),
        e if e < 0 && e != -libc::EINTR => Err(Fail::new(-e, "poll")),
        _ => Ok(()),
    }
}

/// A wait for `set` (fds and events) in dispatch mode, taking with `take`
/// (the hooked call with a zero timeout), or `None` when this call cannot
/// be dispatched (the caller then uses the engine): a zero timeout,
/// dispatch inactive, more than [`MAX_FDS`] fds, or the thread's state
/// busy (a hook entered from a signal handler during a wait).
pub(crate) fn dispatched(
    set: &[libc::pollfd],
    timeout: Option<Duration>,
    take: impl FnMut() -> c_int,
) -> Option<c_int> {
    if timeout.is_some_and(|t| t.is_zero()) || set.is_empty() || set.len() > MAX_FDS {
        return None;
    }
    let fresh = FdsPeek::new(set)?;
    let peek = LAST
        .try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            match &*l {
                Some((s, p)) if s.watches(set) => Some(p.clone()),
                _ => {
                    let p: Arc<dyn Peek> = Arc::new(fresh.clone());
                    *l = Some((fresh.clone(), p.clone()));
                    Some(p)
                }
            }
        })
        .ok()
        .flatten()?;
    let mut src = HookWait {
        peek: &peek,
        set: &fresh,
        take,
    };
    Some(match crate::dispatch::serve(&mut src, timeout, true)? {
        Ok(Some(n)) => n,
        Ok(None) => 0,
        Err(e) => {
            // SAFETY: the thread's errno slot.
            unsafe { *libc::__errno_location() = e.errno() };
            -1
        }
    })
}

/// `epoll_wait(epfd, events, max, timeout_ms)` in dispatch mode (see
/// [`dispatched`] for `None`).
pub(crate) fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout_ms: c_int,
) -> Option<c_int> {
    let set = [libc::pollfd {
        fd: epfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    dispatched(&set, ms(timeout_ms), || {
        // SAFETY: the caller's epoll_wait arguments (checked non-null and
        // positive by the hook); a raw syscall, not our hook.
        unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                epfd as c_long,
                events,
                max as c_long,
                0 as c_long,
                std::ptr::null::<u64>(),
                8 as c_long,
            ) as c_int
        }
    })
}

/// `poll(fds, nfds, timeout_ms)` in dispatch mode (see [`dispatched`] for
/// `None`); `take` is the hook's zero-timeout probe.
pub(crate) fn poll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout_ms: c_int,
    take: impl FnMut() -> c_int,
) -> Option<c_int> {
    if fds.is_null() || nfds == 0 || nfds as usize > MAX_FDS {
        return None;
    }
    // SAFETY: the caller passed `nfds` pollfds at `fds` (non-null).
    let set = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
    // A copy: the probe writes the caller's revents.
    let mut copy = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_FDS];
    copy[..set.len()].copy_from_slice(set);
    dispatched(&copy[..set.len()], ms(timeout_ms), take)
}

/// A millisecond timeout as the hooks get it: negative = forever.
fn ms(timeout_ms: c_int) -> Option<Duration> {
    crate::wait::ms_to_ns(timeout_ms).map(Duration::from_nanos)
}
