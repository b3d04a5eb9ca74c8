//! The fd hooks' waits as library sources, for dispatch mode: an
//! `epoll_wait` (its epoll fd), or a `poll`/`select` set of any size,
//! peeked by a dispatcher with a zero-timeout `poll` on a copy of the set. See `crate::dispatch` for what the program sees.

use fastwake::Fail;
use fastwake::source::{Peek, Rechecked, Source};
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    // The handle of the set this thread waited on last: kept across waits
    // so the dispatcher registration is reused while the set stays the
    // same (a new handle, one allocation, only when it changes). Has a
    // destructor; only touched in dispatch mode.
    static LAST: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// A set's peek handle, and the same allocation as the dispatcher
/// registers it (its identity is the registration's).
type Handle = (Arc<FdsPeek>, Arc<dyn Peek>);

/// Largest set peeked with one `ppoll` on a stack copy. A larger set is
/// peeked in chunks of this size (a ppoll each, stopping at the first
/// ready one), so a dispatcher's peek never allocates; its cost grows with
/// the set, 35-64 ns per fd here (docs/design/shim.md).
const CHUNK: usize = 64;

/// What a dispatcher peeks: a set of fds with the events waited for (one
/// epoll fd with `POLLIN`, or a `poll`/`select` call's set, any size),
/// tested with a zero-timeout `poll` on a copy, so nothing is consumed
/// (edge-triggered epoll registrations included) and the caller's
/// `revents` are not touched. A closed fd reads as ready (`POLLNVAL`): the
/// owner then learns the error from its own zero-timeout call.
pub(crate) struct FdsPeek {
    fds: Box<[libc::pollfd]>,
}

impl FdsPeek {
    pub(crate) fn new(set: impl Iterator<Item = libc::pollfd>) -> FdsPeek {
        let fds = set
            .map(|p| libc::pollfd {
                fd: p.fd,
                events: p.events,
                revents: 0,
            })
            .collect();
        FdsPeek { fds }
    }

    /// Same fds and events, in the same order, as `set`?
    fn watches(&self, mut set: impl Iterator<Item = libc::pollfd>) -> bool {
        self.fds.iter().all(|a| {
            set.next()
                .is_some_and(|b| a.fd == b.fd && a.events == b.events)
        }) && set.next().is_none()
    }

    /// `poll` on a copy: >0 some fd ready (or invalid), 0 none, -errno.
    fn poll(&self, timeout_ms: c_int) -> c_int {
        if self.fds.len() <= CHUNK {
            let mut buf = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; CHUNK];
            buf[..self.fds.len()].copy_from_slice(&self.fds);
            return ppoll(&mut buf[..self.fds.len()], timeout_ms);
        }
        if timeout_ms != 0 {
            // A sleep: the whole set in one call; the copy's allocation is
            // small beside the sleep.
            return ppoll(&mut self.fds.to_vec(), timeout_ms);
        }
        let mut buf = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; CHUNK];
        for chunk in self.fds.chunks(CHUNK) {
            buf[..chunk.len()].copy_from_slice(chunk);
            let r = ppoll(&mut buf[..chunk.len()], 0);
            if r != 0 {
                return r;
            }
        }
        0
    }
}

/// One `ppoll` with a ms timeout and the thread's mask: n, or -errno.
fn ppoll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> c_int {
    // SAFETY: `fds.len()` initialised pollfds we own, the thread's mask.
    let r = unsafe {
        crate::sys::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
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

impl Peek for FdsPeek {
    fn ready(&self) -> bool {
        // Completion channels in the set (or in an epoll fd of it): their
        // armed CQs too, which signal before the fd does.
        self.poll(0) != 0 || also_ready(&self.fds)
    }
}

/// A second readiness test for peeked sets, installed by a hook family
/// that knows fds the kernel reports late: the verbs hooks' completion
/// channels, whose CQs signal before their fd does. A function
/// pointer, so this module does not import theirs (which imports this).
static ALSO_READY: std::sync::OnceLock<fn(&[libc::pollfd]) -> bool> = std::sync::OnceLock::new();

/// Install [`ALSO_READY`] (once, from the library constructor).
pub(crate) fn set_also_ready(f: fn(&[libc::pollfd]) -> bool) {
    let _ = ALSO_READY.set(f);
}

fn also_ready(set: &[libc::pollfd]) -> bool {
    ALSO_READY.get().is_some_and(|f| f(set))
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
        self.set.ready()
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
        slept(self.set.poll(poll_ms(timeout)), true)
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(self.peek)
    }
}

/// Sleep in `poll` until `fd` is readable or `timeout` passes (see
/// [`slept`] for the result).
pub(crate) fn sleep_readable(
    fd: c_int,
    timeout: Option<Duration>,
    eintr_ends: bool,
) -> fastwake::Result<()> {
    let mut one = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    slept(ppoll(&mut one, poll_ms(timeout)), eintr_ends)
}

/// A sleep's timeout for `poll`: rounded up to whole ms (never before the
/// deadline); -1 forever.
fn poll_ms(timeout: Option<Duration>) -> c_int {
    match timeout {
        None => -1,
        Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int,
    }
}

/// A sleeping `poll`'s result as a source's sleep: `eintr_ends`: a signal
/// ends the wait with EINTR, else it is a spurious wake-up.
fn slept(r: c_int, eintr_ends: bool) -> fastwake::Result<()> {
    match r {
        e if e == -libc::EINTR && eintr_ends => Err(Fail::new(libc::EINTR, "wait interrupted")),
        e if e < 0 && e != -libc::EINTR => Err(Fail::new(-e, "poll")),
        _ => Ok(()),
    }
}

/// A wait for `set` (fds and events; called once or twice, before any
/// `take`) in dispatch mode, taking with `take` (the hooked call with a
/// zero timeout), or `None` when this call cannot be dispatched (the
/// caller then uses the engine): a zero timeout, an empty set, dispatch
/// inactive, or the thread's state busy (a hook entered from a signal
/// handler during a wait).
pub(crate) fn dispatched<I: Iterator<Item = libc::pollfd>>(
    set: impl Fn() -> I,
    timeout: Option<Duration>,
    take: impl FnMut() -> c_int,
) -> Option<c_int> {
    if timeout.is_some_and(|t| t.is_zero()) || set().next().is_none() {
        return None;
    }
    let (fds, peek) = LAST
        .try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            match &*l {
                Some(h) if h.0.watches(set()) => Some(h.clone()),
                _ => {
                    let f = Arc::new(FdsPeek::new(set()));
                    let h: Handle = (f.clone(), f);
                    *l = Some(h.clone());
                    Some(h)
                }
            }
        })
        .ok()
        .flatten()?;
    let mut src = HookWait {
        peek: &peek,
        set: &fds,
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

/// `epoll_wait(epfd, ..)` in dispatch mode (see [`dispatched`] for
/// `None`); `take` is the hook's zero-timeout probe (it fills the caller's
/// events).
pub(crate) fn epoll_wait(
    epfd: c_int,
    timeout: Option<Duration>,
    take: impl FnMut() -> c_int,
) -> Option<c_int> {
    let set = || {
        std::iter::once(libc::pollfd {
            fd: epfd,
            events: libc::POLLIN,
            revents: 0,
        })
    };
    dispatched(set, timeout, take)
}

/// `poll(fds, nfds, timeout)` in dispatch mode (see [`dispatched`] for
/// `None`); `take` is the hook's zero-timeout probe.
pub(crate) fn poll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: Option<Duration>,
    take: impl FnMut() -> c_int,
) -> Option<c_int> {
    if fds.is_null() || nfds == 0 {
        return None;
    }
    // Read through the pointer (no reference held): `take` writes the
    // caller's revents.
    let set = || {
        // SAFETY: the caller passed `nfds` pollfds at `fds` (non-null);
        // only read, before any `take`.
        (0..nfds as usize).map(move |i| unsafe { fds.add(i).read() })
    };
    dispatched(set, timeout, take)
}
