//! `FASTWAKE_MODE=dispatch`: an unmodified program's `epoll_wait`, and
//! `poll` and `select` on up to [`MAX_FDS`] fds, are served by the
//! library's per-CPU dispatcher (FastWake approach 1 for kernel threads,
//! docs/dispatch.md).
//!
//! The first wait on a CPU starts a `SCHED_IDLE` dispatcher for that CPU.
//! A thread entering `epoll_wait` (or `epoll_pwait` without a signal
//! mask) with a non-zero timeout waits in the library's
//! dispatch mode on its epoll fd: it registers the fd with the dispatcher
//! of its CPU and sleeps on a futex; the dispatcher peeks the epoll fd
//! (`poll` with a zero timeout: readiness without consuming, even for
//! edge-triggered registrations) and, when it is ready, wakes the thread
//! on the same CPU. Then the thread collects the events with a zero-timeout
//! `epoll_wait` and returns them. What the program sees is what the real
//! call returns: the events, 0 after the timeout, -1/`EINTR` when a signal
//! interrupts the sleep, -1 with the kernel's errno for a bad fd.
//!
//! Why a futex and not the kernel's own epoll sleep: the gain is in who
//! wakes the thread. The kernel wakes it from whichever CPU processed the
//! packet, with an IPI to a CPU that may have halted (tens of µs in a VM
//! without halt polling); the dispatcher wakes it from its own CPU, which
//! the dispatcher kept from halting.
//!
//! A `poll` or `select` is dispatched the same way, the dispatcher
//! peeking a copy of its fd set, and so is a blocking `ibv_get_cq_event`,
//! the dispatcher peeking the channel's armed CQs (see `VerbsPeek`). What
//! stays as in `hybrid`: sets of more than [`MAX_FDS`] fds and
//! `epoll_pwait` with a mask. No dispatcher for the thread's CPU (it failed to
//! start, or is starved: a `SCHED_IDLE` thread next to a busy one) means
//! the library's interrupt-mode fallback, which here is a `poll` on the
//! epoll fd.
//!
//! fork: dispatcher threads do not survive it. A child stops dispatching
//! (its waits behave as in `hybrid`), and the forking thread's waiter,
//! copied into the child and registered with the parent's dispatcher, is
//! leaked there rather than dropped (dropping takes the dispatcher's lock,
//! which another parent thread may have held at the fork).

use fastwake::source::{Peek, Rechecked, Source};
use fastwake::{Fail, WaitMode, Waiter};
use std::cell::RefCell;
use std::ffi::{c_int, c_long};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// Dispatch mode is on in this process (set by the constructor).
static STARTED: AtomicBool = AtomicBool::new(false);
/// This process is a fork of the one that started them.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Per CPU (mod the table size): 0 no dispatcher yet, 1 started, 2 failed
/// to start (reported once; waits there fall back).
const CPUS: usize = 1024;
static CPU_STATE: [AtomicU8; CPUS] = [const { AtomicU8::new(0) }; CPUS];

/// Counters for the exit report (FASTWAKE_VERBOSE=1).
pub static WAITS: AtomicU64 = AtomicU64::new(0);
pub static HANDOFFS: AtomicU64 = AtomicU64::new(0);
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Turn dispatch mode on. Called once, from the library constructor, in
/// dispatch mode. Dispatchers start lazily, one for each CPU on which a
/// thread of the program first waits (a dispatcher is two threads: on a
/// 64-CPU machine, starting them all would add 128 threads to every
/// process, most never used).
pub fn start() {
    // SAFETY: registers a plain function; it runs in the child only,
    // where it touches atomics and this thread's own cell.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    STARTED.store(true, Ordering::Release);
}

/// May this wait be dispatched? Also starts the dispatcher of the
/// caller's CPU if it has none yet (one load once it runs).
fn begin() -> bool {
    if !active() {
        return false;
    }
    if let Some(cpu) = fastwake::cpu::current() {
        ensure_dispatcher(cpu);
    }
    true
}

/// Start the dispatcher of `cpu` if it has none yet.
fn ensure_dispatcher(cpu: u32) {
    let st = &CPU_STATE[cpu as usize % CPUS];
    if st.load(Ordering::Acquire) != 0
        || st
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    match fastwake::dispatch::Dispatcher::start(fastwake::dispatch::Config::new(cpu)) {
        // The dispatcher lives as long as the process: its exit ends the
        // threads.
        Ok(d) => std::mem::forget(d),
        Err(e) => {
            st.store(2, Ordering::Release);
            crate::diag(&format!("dispatch: no dispatcher on CPU {cpu}: {e}"));
        }
    }
}

extern "C" fn after_fork_child() {
    FORKED.store(true, Ordering::Release);
    let _ = STATE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && let Some(st) = s.take()
        {
            std::mem::forget(st);
        }
    });
}

/// Will `epoll_wait` be dispatched in this process?
pub fn active() -> bool {
    STARTED.load(Ordering::Acquire) && !FORKED.load(Ordering::Acquire)
}

/// A thread's dispatch-mode waiter and the peek handle of what it last
/// waited on (the handle's address is the registration's identity).
struct State {
    waiter: Waiter,
    peek: Option<Arc<FdsPeek>>,
    verbs: Option<Arc<VerbsPeek>>,
}

thread_local! {
    // Has a destructor (the waiter unregisters at thread exit); only
    // touched in dispatch mode.
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

impl State {
    fn new() -> State {
        State {
            waiter: Waiter::new(WaitMode::Dispatch),
            peek: None,
            verbs: None,
        }
    }
}

/// Run `f` on this thread's dispatch state; `None` when the state is busy
/// (a hook entered from a signal handler during a wait) or gone (thread
/// exit).
fn with_state<R>(f: impl FnOnce(&mut State) -> Option<R>) -> Option<R> {
    STATE
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            f(s.get_or_insert_with(State::new))
        })
        .ok()
        .flatten()
}

/// One dispatch-mode wait, counted for the exit report.
fn wait_counted<S: Source>(
    w: &mut Waiter,
    src: &mut S,
    timeout: Option<Duration>,
) -> fastwake::Result<Option<S::Completion>> {
    let before = w.stats();
    let r = match timeout {
        None => w.wait(src).map(Some),
        Some(t) => w.wait_timeout(src, t),
    };
    if crate::config::verbose() {
        let after = w.stats();
        WAITS.fetch_add(1, Ordering::Relaxed);
        HANDOFFS.fetch_add(
            (after.handoffs + after.relays) - (before.handoffs + before.relays),
            Ordering::Relaxed,
        );
        FALLBACKS.fetch_add(
            after.dispatch_fallbacks - before.dispatch_fallbacks,
            Ordering::Relaxed,
        );
    }
    r
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
struct FdsPeek {
    fds: [libc::pollfd; MAX_FDS],
    n: usize,
}

impl FdsPeek {
    fn new(set: &[libc::pollfd]) -> Option<FdsPeek> {
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
        // SAFETY: `n` initialised pollfds on our stack; a raw syscall, not
        // our hook.
        let r = unsafe {
            libc::syscall(
                libc::SYS_poll,
                fds.as_mut_ptr(),
                self.n as c_long,
                timeout_ms as c_long,
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
    peek: &'a Arc<FdsPeek>,
    take: F,
}

impl<F: FnMut() -> c_int> Source for HookWait<'_, F> {
    type Completion = c_int;

    fn name(&self) -> &'static str {
        "fds"
    }

    fn ready(&self) -> bool {
        self.peek.poll(0) != 0
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
        sleep_poll(self.peek, timeout, true)
    }

    fn peek_handle(&self) -> Option<Arc<dyn Peek>> {
        Some(self.peek.clone())
    }

    fn peek_id(&self) -> Option<usize> {
        Some(Arc::as_ptr(self.peek) as *const () as usize)
    }
}

/// Sleep in `poll` on `p`'s fds until one is ready or `timeout` passes
/// (rounded up to whole ms: never before the deadline). `eintr_ends`: a
/// signal ends the wait with EINTR, else it is a spurious wake-up.
fn sleep_poll(p: &FdsPeek, timeout: Option<Duration>, eintr_ends: bool) -> fastwake::Result<()> {
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
    if timeout.is_some_and(|t| t.is_zero()) || set.is_empty() || set.len() > MAX_FDS || !begin() {
        return None;
    }
    with_state(|st| {
        if st.peek.as_ref().is_none_or(|p| !p.watches(set)) {
            st.peek = Some(Arc::new(FdsPeek::new(set)?));
        }
        let peek = st.peek.as_ref()?;
        st.waiter.set_interruptible(true);
        let mut src = HookWait { peek, take };
        Some(match wait_counted(&mut st.waiter, &mut src, timeout) {
            Ok(Some(n)) => n,
            Ok(None) => 0,
            Err(e) => {
                // SAFETY: the thread's errno slot.
                unsafe { *libc::__errno_location() = e.errno() };
                -1
            }
        })
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

/// A completion channel as a dispatcher sees it: its managed CQs (a CQE
/// is moved to the shim's stash, which the program cannot tell) and its
/// fd. Peeked only while its waiter is inside `ibv_get_cq_event` on it
/// (a dispatcher peeks waiting slots only), so the channel is alive.
struct VerbsPeek {
    channel: usize,
    fd: c_int,
}

impl Peek for VerbsPeek {
    fn ready(&self) -> bool {
        crate::verbs::event::channel_ready(self.channel as *mut _, self.fd)
    }
}

/// `ibv_get_cq_event` on `channel` as a source: taking is a synthetic
/// event, or the real read when the fd is readable.
struct VerbsWait<'a> {
    real_get: crate::verbs::real::GetCqEventFn,
    channel: *mut fastwake::source::verbs::sys::ibv_comp_channel,
    fd: c_int,
    peek: &'a Arc<VerbsPeek>,
    /// The channel fd, to sleep on.
    wake: FdsPeek,
}

impl Source for VerbsWait<'_> {
    type Completion = crate::verbs::event::Event;

    fn name(&self) -> &'static str {
        "verbs-channel"
    }

    fn ready(&self) -> bool {
        crate::verbs::event::channel_ready(self.channel, self.fd)
    }

    fn try_take(&mut self) -> fastwake::Result<Option<Self::Completion>> {
        // SAFETY: we are inside the program's ibv_get_cq_event on channel.
        unsafe { crate::verbs::event::try_event(self.real_get, self.channel, self.fd) }
            .map_err(|e| Fail::new(e, "ibv_get_cq_event"))
    }

    fn arm(&mut self) -> fastwake::Result<()> {
        // The program armed its CQs (req_notify_cq, which the shim makes
        // real); poll on the fd queues us before it checks.
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> fastwake::Result<()> {
        // EINTR is a spurious wake-up here: the blocking read the program
        // asked for is restarted after a handler installed with
        // SA_RESTART, so a signal must not end this wait.
        sleep_poll(&self.wake, timeout, false)
    }

    fn peek_handle(&self) -> Option<Arc<dyn Peek>> {
        Some(self.peek.clone())
    }

    fn peek_id(&self) -> Option<usize> {
        Some(Arc::as_ptr(self.peek) as *const () as usize)
    }
}

/// The program's blocking `ibv_get_cq_event(channel)` in dispatch mode, or
/// `None` when it cannot be dispatched (inactive, or the thread's state
/// busy). Signals do not end it (see `VerbsWait::sleep`).
pub(crate) fn verbs_wait(
    real_get: crate::verbs::real::GetCqEventFn,
    channel: *mut fastwake::source::verbs::sys::ibv_comp_channel,
    fd: c_int,
) -> Option<Result<crate::verbs::event::Event, c_int>> {
    if !begin() {
        return None;
    }
    with_state(|st| {
        if st
            .verbs
            .as_ref()
            .is_none_or(|p| p.channel != channel as usize || p.fd != fd)
        {
            st.verbs = Some(Arc::new(VerbsPeek {
                channel: channel as usize,
                fd,
            }));
        }
        let peek = st.verbs.as_ref()?;
        st.waiter.set_interruptible(false);
        let wake = FdsPeek::new(&[libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }])?;
        let mut src = VerbsWait {
            real_get,
            channel,
            fd,
            peek,
            wake,
        };
        Some(
            wait_counted(&mut st.waiter, &mut src, None)
                .map(|e| e.expect("no deadline"))
                .map_err(|e| e.errno()),
        )
    })
}

/// A millisecond timeout as the hooks get it: negative = forever.
fn ms(timeout_ms: c_int) -> Option<Duration> {
    crate::wait::ms_to_ns(timeout_ms).map(Duration::from_nanos)
}

/// The exit report's dispatch line (FASTWAKE_VERBOSE=1).
pub fn report() {
    let w = WAITS.load(Ordering::Relaxed);
    if w == 0 {
        return;
    }
    crate::diag(&format!(
        "pid={} dispatch_waits={} handoffs={} fallbacks={}",
        std::process::id(),
        w,
        HANDOFFS.load(Ordering::Relaxed),
        FALLBACKS.load(Ordering::Relaxed)
    ));
}
