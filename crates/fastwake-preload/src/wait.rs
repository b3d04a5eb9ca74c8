//! The mechanics of an fd hook's wait (`epoll_wait`, `poll`, `select` when
//! not dispatched): look once, spin as the thread's
//! [`Governor`] decides (the library's one decision engine: budgets, CPU
//! cap, same-CPU and sibling rules, back-off, adaptive learning), then make
//! the real (blocking) call for what is left of the timeout.
//!
//! Semantics kept, whatever the mode:
//! - a zero timeout never spins: the real call is made as is;
//! - a wait returns as soon as something is ready, with what the kernel
//!   reported, or after its timeout, give or take the spin (the remaining
//!   time is rounded *up* to the next millisecond, so a wait is never
//!   shorter than asked and at most one spin budget longer);
//! - signals: while spinning, all asynchronous signals are blocked in user
//!   space and each zero-timeout look runs with the caller's mask (its own,
//!   or the one it passed to `epoll_pwait`), so a signal is handled inside
//!   the look and the wait returns -1/EINTR exactly where the plain call
//!   would have;
//! - a hook entered while the thread is already inside one (a signal
//!   handler that polls) passes through.
//!
//! Under `adaptive`, a wait may be planned as a pre-wake (`prewake`):
//! a timed look until shortly before the completion is due, then the
//! spin, then the real call. The fd hooks, the blocking socket calls
//! (`sockets`) and liburing's waits (`uring`) share it through
//! `Prewaker`, each with its own sleep and spin (and so its own signal
//! semantics).

use crate::config;
use fastwake::preload_stats::{Call, Engine, Pass};
use fastwake::wait::{Decision, Ending, Facts, Governor, PREEMPTED_NS, Why};
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::AtomicU64;

/// Sample the peer's CPU on one wait in this many.
const SAMPLE_EVERY: u32 = 16;

/// Signals the engine never blocks: glibc's internal ones (32, 33: thread
/// cancellation and set*id broadcast, which other threads wait for) and the
/// synchronous faults, which the kernel would turn into a kill if blocked.
pub(crate) const NEVER_BLOCK: u64 = bit(32)
    | bit(33)
    | bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGFPE)
    | bit(libc::SIGILL)
    | bit(libc::SIGTRAP)
    | bit(libc::SIGSYS);

const fn bit(sig: c_int) -> u64 {
    1u64 << (sig - 1)
}

/// One thread's waiting state: its governor (every decision), and the
/// peer CPU the hooks sampled (the mechanics of finding it).
struct Thread {
    gov: Governor,
    peer_cpu: Option<u32>,
    waits: u32,
}

thread_local! {
    // Const-initialised and without Drop (a governor owns no heap): no lazy
    // initialisation, no destructor registration, safe to touch from any
    // hook at any time.
    static THREAD: RefCell<Option<Thread>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's governor and sampled peer CPU; `None` when
/// the thread-local is gone (thread exit) or in use (a hook entered from a
/// signal handler while this thread waits): the caller then makes the
/// plain call.
pub fn with_governor<R>(f: impl FnOnce(&mut Governor, Option<u32>) -> R) -> Option<R> {
    THREAD
        .try_with(|t| {
            let mut t = t.try_borrow_mut().ok()?;
            let t = t.get_or_insert_with(|| Thread {
                gov: config::governor(),
                peer_cpu: None,
                waits: 0,
            });
            Some(f(&mut t.gov, t.peer_cpu))
        })
        .ok()
        .flatten()
}

/// After a wait returned events: now and then, note which CPU processed
/// the last incoming packet of `ready_fd()` (SO_INCOMING_CPU), for the
/// same-CPU rule.
fn sample(ready_fd: impl FnOnce() -> Option<c_int>) {
    let _ = THREAD.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut()
            && let Some(t) = t.as_mut()
        {
            t.waits = t.waits.wrapping_add(1);
            if t.waits % SAMPLE_EVERY == 1
                && let Some(fd) = ready_fd().filter(|&fd| fd >= 0)
            {
                // SAFETY: the fd is only borrowed for one getsockopt; if it
                // is not open or not a socket the call fails harmlessly.
                let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
                t.peer_cpu = fastwake::source::socket::incoming_cpu(fd);
            }
        }
    });
}

/// Count what the governor decided.
pub fn count_why(why: Why) {
    use fastwake::adaptive::Reason;
    match why {
        Why::SameCpu | Why::Learned(Reason::SameCpu) => count(|e| &e.same_cpu, 1),
        Why::Siblings | Why::Learned(Reason::Siblings) => count(|e| &e.siblings, 1),
        Why::Contended | Why::Learned(Reason::Contended) => count(|e| &e.contended, 1),
        Why::Capped | Why::Learned(Reason::Cap) => count(|e| &e.capped, 1),
        _ => {}
    }
}

/// Add `n` to the engine counter `f` picks (`crate::stats`: live
/// counters in shared memory).
pub(crate) fn count(f: impl FnOnce(&Engine) -> &AtomicU64, n: u64) {
    crate::stats::add(|s| f(&s.engine), n);
}

pub(crate) fn sigmask(how: c_int, set: *const u64, old: *mut u64) {
    // SAFETY: rt_sigprocmask with 8-byte kernel sigsets; `set` and `old`
    // point to live u64s (or are null, which the kernel accepts). A raw
    // syscall, so no libc wrapper that could be hooked.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8usize);
    }
}

pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Asynchronous signals pending for this thread or process that the
/// caller's mask `old` lets through.
pub(crate) fn deliverable(old: u64) -> u64 {
    let mut set: u64 = 0;
    // SAFETY: rt_sigpending writes 8 bytes to a live u64.
    unsafe { libc::syscall(libc::SYS_rt_sigpending, &mut set as *mut u64, 8usize) };
    set & !old & !NEVER_BLOCK
}

/// How a spin with signals held ended ([`spin_holding_signals`]).
pub(crate) struct HeldSpin<R> {
    /// The last look's result.
    pub last: R,
    /// A signal the caller's mask lets through became pending (it is
    /// delivered as the mask comes back, before this returns).
    pub signalled: bool,
    /// `interrupts(pending)`'s answer, asked before the mask came back.
    pub interrupted: bool,
    /// `now_ns`, `spun_ns` and `preempted` filled in; `slept` as given.
    pub ending: Ending,
}

/// The spin of the calls whose plain form the kernel interrupts or
/// restarts as a signal's disposition says (the blocking socket calls,
/// liburing's waits): asynchronous signals held, `look()` until `done`,
/// the budget is spent, the thread lost its CPU, or a signal the caller's
/// mask lets through is pending. `interrupts(pending)` decides, before the
/// mask comes back (a handler may change the disposition it runs under),
/// whether the plain call would have been interrupted. Counts the spin.
pub(crate) fn spin_holding_signals<R>(
    t0: u64,
    budget: u64,
    mut look: impl FnMut() -> R,
    done: impl Fn(&R) -> bool,
    interrupts: impl FnOnce(u64) -> bool,
    mut ending: Ending,
) -> HeldSpin<R> {
    count(|e| &e.spins, 1);
    let block: u64 = !NEVER_BLOCK;
    let mut old: u64 = 0;
    sigmask(libc::SIG_SETMASK, &block, &mut old);
    let mut signals = 0;
    let mut prev = t0;
    let last = loop {
        let r = look();
        let now = fastwake::cpu::monotonic_ns();
        if now.wrapping_sub(prev) > PREEMPTED_NS {
            ending.preempted = true;
            break r;
        }
        prev = now;
        if done(&r) || now.wrapping_sub(t0) >= budget {
            break r;
        }
        signals = deliverable(old);
        if signals != 0 {
            break r;
        }
        std::hint::spin_loop();
    };
    let interrupted = signals != 0 && interrupts(signals);
    sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    ending.now_ns = fastwake::cpu::monotonic_ns();
    ending.spun_ns = ending.now_ns.wrapping_sub(t0);
    count(|e| &e.spin_ns, ending.spun_ns);
    HeldSpin {
        last,
        signalled: signals != 0,
        interrupted,
        ending,
    }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// One intercepted wait of a call of kind `call` (counted as served or
/// passed through, and why).
///
/// - `probe(mask, ns)`: the wait with a timeout of `ns` (0: a look; more:
///   a pre-wake's timed sleep, exact to the ns), run with kernel sigmask
///   `mask` (null: leave the mask alone); returns like libc (n, or -1 with
///   errno; -1/ENOSYS for a timed sleep the kernel cannot do, which turns
///   pre-wakes off for the process).
/// - `timeout`: the caller's timeout in ns (`None`: forever; `Some(0)`: a
///   zero-timeout look, never spun).
/// - `real(remaining)`: the real blocking call; `None` means with the
///   caller's own timeout unchanged, `Some(ns)` with that much left (> 0;
///   the hook rounds it *up* to its call's unit).
/// - `ready_fd()`: after a wait returned events, an fd among them that may
///   be a socket (for the peer-CPU sample).
/// - `user_mask`: the sigmask the caller passed (epoll_pwait), or null.
pub fn wait(
    call: Call,
    timeout: Option<u64>,
    user_mask: *const u64,
    mut probe: impl FnMut(*const u64, u64) -> c_int,
    real: impl FnOnce(Option<u64>) -> c_int,
    ready_fd: impl FnOnce() -> Option<c_int>,
) -> c_int {
    // Interrupt mode is the kernel's own wait, and a zero timeout a look.
    let pass = match config::mode() {
        None => Some(Pass::ModeOff),
        Some(fastwake::WaitMode::Interrupt) => Some(Pass::Interrupt),
        Some(_) if timeout == Some(0) => Some(Pass::ZeroTimeout),
        Some(_) => None,
    };
    if let Some(why) = pass {
        crate::stats::passed(call, why);
        return real(None);
    }
    let mut real = Some(real);
    let done = with_governor(|gov, peer| {
        let real = real.take()?;
        Some(engine(gov, peer, timeout, user_mask, &mut probe, real))
    })
    .flatten();
    let n = match (done, real.take()) {
        (Some(n), _) => n,
        (None, Some(real)) => {
            crate::stats::passed(call, Pass::Busy);
            return real(None);
        }
        // Not reachable: `real` is taken only on the way into the engine.
        (None, None) => return real_unreachable(),
    };
    crate::stats::served(call);
    if n > 0 {
        sample(ready_fd);
    }
    n
}

#[cold]
fn real_unreachable() -> c_int {
    set_errno(libc::EINTR);
    -1
}

/// Timed looks work (cleared when the kernel has no `epoll_pwait2`): the
/// engine offers pre-wakes to the governor only while they do.
static TIMED_LOOKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Look until something is ready, `budget` ns from `start` pass, or the
/// thread loses its CPU, with asynchronous signals held (each look runs
/// with the caller's mask, so a signal is handled inside a look and the
/// wait returns -1/EINTR where the plain call would). Fills in `ending`'s
/// time, spin and preemption; counts the spin.
fn spin_looking(
    probe: &mut impl FnMut(*const u64, u64) -> c_int,
    user_mask: *const u64,
    start: u64,
    budget: u64,
    ending: &mut Ending,
) -> c_int {
    count(|e| &e.spins, 1);
    let block: u64 = !NEVER_BLOCK;
    let mut old: u64 = 0;
    sigmask(libc::SIG_SETMASK, &block, &mut old);
    let eff: *const u64 = if user_mask.is_null() { &old } else { user_mask };
    let mut n;
    let mut prev = start;
    loop {
        n = probe(eff, 0);
        let now = fastwake::cpu::monotonic_ns();
        if now.wrapping_sub(prev) > PREEMPTED_NS {
            // Lost the CPU mid-spin: the governor backs off.
            ending.preempted = true;
            break;
        }
        prev = now;
        if n != 0 || now.wrapping_sub(start) >= budget {
            break;
        }
        std::hint::spin_loop();
    }
    let e = errno();
    sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    set_errno(e);
    ending.now_ns = fastwake::cpu::monotonic_ns();
    ending.spun_ns = ending.now_ns.wrapping_sub(start);
    count(|e| &e.spin_ns, ending.spun_ns);
    if n > 0 {
        count(|e| &e.spin_hits, 1);
    }
    n
}

/// The engine's wait: a first look, then what the governor plans (spin,
/// pre-wake or block) for at most `timeout_ns`. Also the sleep of a
/// busy-polling thread on its polled set (the pollers').
pub(crate) fn engine(
    gov: &mut Governor,
    peer_cpu: Option<u32>,
    timeout_ns: Option<u64>,
    user_mask: *const u64,
    probe: &mut impl FnMut(*const u64, u64) -> c_int,
    real: impl FnOnce(Option<u64>) -> c_int,
) -> c_int {
    count(|e| &e.waits, 1);
    // First look: exactly the plain call with a zero timeout. A signal
    // handled around it is indistinguishable from one handled just before
    // or after the plain call.
    let r = probe(user_mask, 0);
    if r != 0 {
        if r > 0 {
            // Ready at the first look: the backlog rule's count.
            gov.found_ready();
        }
        return r;
    }
    let planned = plan_prewake(gov, peer_cpu, timeout_ns);
    if let Some(at) = planned.prewake_at() {
        let call = Looked {
            probe,
            user_mask,
            real,
        };
        return prewake(gov, planned, timeout_ns, at, call);
    }
    let Planned {
        t0,
        cpu,
        decision,
        mut ending,
    } = planned;
    let left = match decision {
        Decision::Spin(budget) => {
            let n = spin_looking(probe, user_mask, t0, budget, &mut ending);
            if n != 0 {
                ending.slept = false;
                ending.failed = n < 0;
                gov.end(ending);
                return n;
            }
            // Nothing within the budget: block for what is left.
            match timeout_ns {
                None => None,
                Some(tn) if ending.spun_ns >= tn => {
                    ending.slept = false;
                    gov.end(ending);
                    return 0;
                }
                Some(tn) => Some(tn - ending.spun_ns),
            }
        }
        Decision::Dispatch | Decision::Block | Decision::Prewake { .. } => None,
    };
    block(gov, cpu, ending, || real(left), |&r| r < 0)
}

/// What a pre-wake ([`prewake`]) needs of the call it serves: its timed
/// look, its spin and its ways of ending. The fd hooks' is [`Looked`]
/// (their own call with a timeout); the blocking socket calls' peeks the
/// socket with signals held (`sockets::Peeked`); liburing's sleeps in the
/// kernel's timed CQ wait (`uring::Entered`).
pub(crate) trait Prewaker {
    /// What the call returns.
    type Out;
    /// The timed look: something ready or a completion (> 0), nothing
    /// within `ns` (0), or the wait ended (< 0, errno set: the call
    /// returns it); `None`: no timed look here, this wait goes on as a
    /// plain one.
    fn sleep(&mut self, ns: u64) -> Option<c_int>;
    /// Look from `start` for `budget` ns (as [`sleep`](Self::sleep)
    /// returns; filling in `ending`'s time, spin and preemption; counting
    /// the spin).
    fn spin(&mut self, start: u64, budget: u64, ending: &mut Ending) -> c_int;
    /// The call's result once a look returned `n` (not 0).
    fn found(self, n: c_int) -> Self::Out;
    /// The call's result when its timeout ran out.
    fn timed_out(self) -> Self::Out;
    /// The real, blocking call with what is left of the timeout (`None`:
    /// there is none).
    fn block(self, left: Option<u64>) -> Self::Out;
    /// Did the call fail (nothing to learn from its length)?
    fn failed(out: &Self::Out) -> bool;
}

/// An fd hook's wait as a [`Prewaker`]: its timed look is its own call
/// with a ns timeout and the caller's mask, so a signal ends it with EINTR
/// as it would end the plain call.
struct Looked<'a, P, F> {
    probe: &'a mut P,
    user_mask: *const u64,
    real: F,
}

impl<P, F> Prewaker for Looked<'_, P, F>
where
    P: FnMut(*const u64, u64) -> c_int,
    F: FnOnce(Option<u64>) -> c_int,
{
    type Out = c_int;

    fn sleep(&mut self, ns: u64) -> Option<c_int> {
        let n = (self.probe)(self.user_mask, ns);
        if n < 0 && errno() == libc::ENOSYS {
            // No timed look here: no more pre-wakes in this process.
            TIMED_LOOKS.store(false, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        Some(n)
    }

    fn spin(&mut self, start: u64, budget: u64, ending: &mut Ending) -> c_int {
        spin_looking(self.probe, self.user_mask, start, budget, ending)
    }

    fn found(self, n: c_int) -> c_int {
        n
    }

    fn timed_out(self) -> c_int {
        0
    }

    fn block(self, left: Option<u64>) -> c_int {
        (self.real)(left)
    }

    fn failed(r: &c_int) -> bool {
        *r < 0
    }
}

/// A pre-wake ([`Planned::prewake_at`]): `call`'s timed look until
/// `wake_at`, then looks until `spin_until` (for at most `spin_max` from
/// the wake-up: [`Decision::Prewake`]), then the real call for what
/// is left of the timeout. What is ready during the sleep ends the wait at
/// once, as in interrupt mode. Counts the pre-wake and its catch, and
/// tells the governor where the completion arrived and how late the timer
/// was.
pub(crate) fn prewake<W: Prewaker>(
    gov: &mut Governor,
    planned: Planned,
    timeout_ns: Option<u64>,
    (wake_at, spin_until, spin_max): (u64, u64, u64),
    mut call: W,
) -> W::Out {
    use fastwake::adaptive::prewake::Arrival;
    let Planned {
        t0,
        cpu,
        mut ending,
        ..
    } = planned;
    count(|e| &e.prewakes, 1);
    let asleep = gov.blocking(cpu, fastwake::cpu::monotonic_ns());
    let n = {
        let _slack = fastwake::cpu::FineTimerSlack::set();
        let now = fastwake::cpu::monotonic_ns();
        call.sleep(wake_at.saturating_sub(now).max(1))
    };
    drop(asleep);
    let t1 = fastwake::cpu::monotonic_ns();
    ending.now_ns = t1;
    let Some(n) = n else {
        // No timed look: this wait goes on as a plain one.
        let left = timeout_ns.map(|t| t.saturating_sub(t1.wrapping_sub(t0)).max(1));
        return block(gov, cpu, ending, || call.block(left), W::failed);
    };
    if n > 0 && t1 >= wake_at {
        // Ready when the thread ran, after the timer had expired: it came
        // while the thread was waking (the kernel's timed wait looks once
        // more when its timer fires), so it is caught at the first look
        // after the timer, and the lateness is what it was. Counting it
        // early (a wake-up by the fds) left the lateness unlearned where
        // it exceeds the sleep: sockperf's epoll server had 2,300
        // pre-wakes, none caught.
        count(|e| &e.prewake_caught, 1);
        ending.late_ns = Some(t1 - wake_at);
        ending.slept = false;
        ending.arrival = Some(Arrival::Caught);
        gov.end(ending);
        return call.found(n);
    }
    if n != 0 {
        ending.arrival = Some(Arrival::Early);
        ending.failed = n < 0;
        gov.end(ending);
        return call.found(n);
    }
    ending.late_ns = Some(t1.saturating_sub(wake_at));
    let used = t1.wrapping_sub(t0);
    if timeout_ns.is_some_and(|t| used >= t) {
        gov.end(ending);
        return call.timed_out();
    }
    let n = call.spin(t1, spin_until.saturating_sub(t1).min(spin_max), &mut ending);
    if n != 0 {
        if n > 0 {
            count(|e| &e.prewake_caught, 1);
        }
        ending.slept = false;
        ending.arrival = Some(Arrival::Caught);
        ending.failed = n < 0;
        gov.end(ending);
        return call.found(n);
    }
    ending.slept = true;
    ending.arrival = Some(Arrival::Late);
    let used = ending.now_ns.wrapping_sub(t0);
    let left = match timeout_ns {
        None => None,
        Some(t) if used >= t => {
            gov.end(ending);
            return call.timed_out();
        }
        Some(t) => Some(t - used),
    };
    block(gov, cpu, ending, || call.block(left), W::failed)
}

/// A wait the engines ([`engine`], the socket calls, liburing) plan after
/// their first look found nothing.
pub(crate) struct Planned {
    pub t0: u64,
    pub cpu: Option<u32>,
    pub decision: Decision,
    /// Started at `t0`, as if it will sleep; the spin fills in the rest.
    pub ending: Ending,
}

impl Planned {
    /// A [`Decision::Prewake`]'s wake-up, spin end and longest spin, for
    /// [`prewake`].
    pub(crate) fn prewake_at(&self) -> Option<(u64, u64, u64)> {
        match self.decision {
            Decision::Prewake {
                wake_at_ns,
                spin_until_ns,
                spin_max_ns,
            } => Some((wake_at_ns, spin_until_ns, spin_max_ns)),
            _ => None,
        }
    }
}

/// [`plan_with`], offering pre-wakes ([`Decision::Prewake`], served by
/// [`prewake`]) while timed looks work in this process.
pub(crate) fn plan_prewake(
    gov: &mut Governor,
    peer_cpu: Option<u32>,
    timeout_ns: Option<u64>,
) -> Planned {
    plan_with(
        gov,
        peer_cpu,
        timeout_ns,
        TIMED_LOOKS.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// Read the clock and the CPU and ask the thread's governor, counting why
/// it said what it said, offering pre-wakes if `prewake` (the caller can
/// make a timed look: [`plan_prewake`]'s, or liburing's own kind in
/// `uring`). These waits are never dispatched: they are what dispatch mode
/// could not dispatch, or calls it does not serve.
pub(crate) fn plan_with(
    gov: &mut Governor,
    peer_cpu: Option<u32>,
    timeout_ns: Option<u64>,
    prewake: bool,
) -> Planned {
    let t0 = fastwake::cpu::monotonic_ns();
    let cpu = fastwake::cpu::current();
    let facts = Facts {
        cpu,
        peer_cpu,
        dispatchable: false,
        prewake,
        ..Facts::at(t0, timeout_ns)
    };
    let (decision, why) = gov.plan(&facts);
    count_why(why);
    Planned {
        t0,
        cpu,
        decision,
        ending: Ending::at(t0, 0, true),
    }
}

/// Make the real, blocking call, counted as blocked on `cpu` while it
/// lasts (the sibling rule), and end the wait with the governor.
pub(crate) fn block<R>(
    gov: &mut Governor,
    cpu: Option<u32>,
    mut ending: Ending,
    real: impl FnOnce() -> R,
    failed: impl FnOnce(&R) -> bool,
) -> R {
    count(|e| &e.blocked, 1);
    let asleep = gov.blocking(cpu, fastwake::cpu::monotonic_ns());
    let r = real();
    drop(asleep);
    ending.now_ns = fastwake::cpu::monotonic_ns();
    ending.failed = failed(&r);
    gov.end(ending);
    r
}

/// A timespec timeout (ppoll, pselect, epoll_pwait2) in ns: null =
/// forever; `Err` for one the kernel rejects (negative, or nanoseconds out
/// of range), which the hook leaves to the real call.
///
/// # Safety
/// `ts` is null or points to a readable timespec (the caller's argument,
/// which the real call would read too).
pub unsafe fn ts_to_ns(ts: *const libc::timespec) -> Result<Option<u64>, BadTimeout> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, readable by the contract above.
    let t = unsafe { ts.read() };
    secs_nsecs_to_ns(t.tv_sec, t.tv_nsec).map(Some)
}

/// A timeout of `sec` s and `nsec` ns in ns, or `Err` where the kernel
/// says EINVAL (negative, or nanoseconds out of range).
pub fn secs_nsecs_to_ns(sec: i64, nsec: i64) -> Result<u64, BadTimeout> {
    if sec < 0 || !(0..1_000_000_000).contains(&nsec) {
        return Err(BadTimeout);
    }
    Ok((sec as u64).saturating_mul(1_000_000_000) + nsec as u64)
}

/// A timeout the kernel would reject with EINVAL.
#[derive(Debug)]
pub struct BadTimeout;

/// `ns` as a timespec (what is left of a timespec timeout; exact).
pub fn ns_to_ts(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    }
}

/// A millisecond timeout (poll, epoll) in ns: negative = forever.
pub fn ms_to_ns(ms: c_int) -> Option<u64> {
    u64::try_from(ms).ok().map(|m| m * 1_000_000)
}

/// A ms timeout as a duration: negative = forever.
pub fn ms(ms: c_int) -> Option<std::time::Duration> {
    ms_to_ns(ms).map(std::time::Duration::from_nanos)
}

/// The ms timeout for the real call: the caller's own, or what is left
/// rounded up (never shorter than asked).
pub fn ms_left(orig: c_int, left: Option<u64>) -> c_int {
    match left {
        None => orig,
        Some(ns) => ns.div_ceil(1_000_000).min(c_int::MAX as u64) as c_int,
    }
}
