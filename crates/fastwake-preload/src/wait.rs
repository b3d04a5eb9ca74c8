//! The one wait engine every hook uses: look once, maybe spin within the
//! budget, then make the real (blocking) call for what is left of the
//! timeout.
//!
//! Semantics the engine keeps, whatever the mode:
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

use crate::budget::{Controller, Learned};
use crate::config::{self, Mode};
use crate::peer;
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Spins shorter than this are not worth blocking signals for.
const MIN_SPIN_NS: u64 = 1_000;
/// CPU-cap bucket: spinning may burst this long before the cap's average
/// rate applies.
const BUCKET_NS: i64 = 5_000_000;
/// A gap this long between two looks of one spin means the thread was
/// preempted (a look is a ~1 µs syscall): another task wants this CPU.
const PREEMPTED_NS: u64 = 100_000;
/// After a preempted spin, do not spin for this long (doubling while it
/// keeps happening, up to `MAX_BACKOFF_NS`).
const MIN_BACKOFF_NS: u64 = 10_000_000;
const MAX_BACKOFF_NS: u64 = 1_000_000_000;
/// Threads of this process inside a wait on each CPU (index: CPU mod
/// this). See `engine`: a wait does not spin while another thread of the
/// process waits on its CPU.
const CPU_SLOTS: usize = 256;
static WAITING_ON: [AtomicU32; CPU_SLOTS] = [const { AtomicU32::new(0) }; CPU_SLOTS];

/// Counts the calling thread as waiting on `cpu` until dropped.
struct OnCpu(usize);

impl OnCpu {
    fn enter() -> Option<OnCpu> {
        let c = peer::current_cpu()? as usize % CPU_SLOTS;
        WAITING_ON[c].fetch_add(1, Ordering::Relaxed);
        Some(OnCpu(c))
    }

    /// Other threads of this process waiting on the same CPU.
    fn siblings(&self) -> u32 {
        WAITING_ON[self.0].load(Ordering::Relaxed).saturating_sub(1)
    }
}

impl Drop for OnCpu {
    fn drop(&mut self) {
        WAITING_ON[self.0].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sample the peer's CPU on one wait in this many.
const SAMPLE_EVERY: u32 = 16;
const NO_CPU: u32 = u32::MAX;

/// Signals the engine never blocks: glibc's internal ones (32, 33: thread
/// cancellation and set*id broadcast, which other threads wait for) and the
/// synchronous faults, which the kernel would turn into a kill if blocked.
const NEVER_BLOCK: u64 = bit(32)
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

struct Thread {
    /// No spinning before this time (contention backoff).
    quiet_until: u64,
    backoff_ns: u64,
    last_ns: u64,
    tokens: i64,
    ctl: Learned,
    peer_cpu: u32,
    waits: u32,
}

thread_local! {
    // Const-initialised and without Drop: no lazy initialisation, no
    // destructor registration, safe to touch from any hook at any time.
    static THREAD: RefCell<Thread> = const {
        RefCell::new(Thread {
            quiet_until: 0,
            backoff_ns: MIN_BACKOFF_NS,
            last_ns: 0,
            tokens: BUCKET_NS,
            ctl: Learned::new(),
            peer_cpu: NO_CPU,
            waits: 0,
        })
    };
}

/// Adaptive mode's budget for a wait that is not one of the hooks of this
/// module (libibverbs' `ibv_get_cq_event`): the same per-thread
/// controller, so one thread's waits teach one controller. 0 when the
/// thread-local is gone (thread exit) or in use (a signal handler).
pub fn adaptive_budget(now_ns: u64, ceiling_ns: u64) -> u64 {
    THREAD
        .try_with(|t| {
            t.try_borrow_mut()
                .map_or(0, |mut t| t.ctl.budget_ns(now_ns, ceiling_ns))
        })
        .unwrap_or(0)
}

/// How that wait went (see [`crate::budget::Controller::record`]).
pub fn adaptive_record(wait_ns: u64, spun_ns: u64, slept: bool) {
    let _ = THREAD.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            t.ctl.record(wait_ns, spun_ns, slept);
        }
    });
}

/// Counters, kept only when FASTWAKE_VERBOSE=1.
pub struct Stats {
    pub waits: AtomicU64,
    pub spins: AtomicU64,
    pub spin_hits: AtomicU64,
    pub spin_ns: AtomicU64,
    pub same_cpu: AtomicU64,
    pub capped: AtomicU64,
    pub contended: AtomicU64,
    pub blocked: AtomicU64,
    pub siblings: AtomicU64,
}

pub static STATS: Stats = Stats {
    waits: AtomicU64::new(0),
    spins: AtomicU64::new(0),
    spin_hits: AtomicU64::new(0),
    spin_ns: AtomicU64::new(0),
    same_cpu: AtomicU64::new(0),
    capped: AtomicU64::new(0),
    contended: AtomicU64::new(0),
    blocked: AtomicU64::new(0),
    siblings: AtomicU64::new(0),
};

fn count(c: &AtomicU64, n: u64) {
    if config::verbose() {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Monotonic time in ns (vDSO, no syscall, no hook).
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

fn sigmask(how: c_int, set: *const u64, old: *mut u64) {
    // SAFETY: rt_sigprocmask with 8-byte kernel sigsets; `set` and `old`
    // point to live u64s (or are null, which the kernel accepts). A raw
    // syscall, so no libc wrapper that could be hooked.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8usize);
    }
}

fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// One intercepted wait.
///
/// - `probe(mask)`: the wait with a zero timeout, run with kernel sigmask
///   `mask` (null: leave the mask alone); returns like libc (n, or -1 with
///   errno).
/// - `timeout`: the caller's timeout in ns (`None`: forever; `Some(0)`: a
///   zero-timeout look, never spun).
/// - `real(remaining)`: the real blocking call; `None` means with the
///   caller's own timeout unchanged, `Some(ns)` with that much left (> 0;
///   the hook rounds it *up* to its call's unit).
/// - `ready_fd()`: after a wait returned events, an fd among them that may
///   be a socket (for the peer-CPU sample).
/// - `user_mask`: the sigmask the caller passed (epoll_pwait), or null.
pub fn wait(
    timeout: Option<u64>,
    user_mask: *const u64,
    mut probe: impl FnMut(*const u64) -> c_int,
    real: impl FnOnce(Option<u64>) -> c_int,
    ready_fd: impl FnOnce() -> Option<c_int>,
) -> c_int {
    let mode = config::mode();
    if timeout == Some(0) || !mode.spins() {
        return real(None);
    }
    let mut real = Some(real);
    let done = THREAD
        .try_with(|t| {
            // Busy: re-entered from a signal handler while this thread waits.
            let mut t = t.try_borrow_mut().ok()?;
            let real = real.take()?;
            Some(engine(
                &mut t, mode, timeout, user_mask, &mut probe, real, ready_fd,
            ))
        })
        .ok()
        .flatten();
    match (done, real.take()) {
        (Some(n), _) => n,
        (None, Some(real)) => real(None),
        // Not reachable: `real` is taken only on the way into the engine.
        (None, None) => real_unreachable(),
    }
}

#[cold]
fn real_unreachable() -> c_int {
    set_errno(libc::EINTR);
    -1
}

fn engine(
    t: &mut Thread,
    mode: Mode,
    timeout_ns: Option<u64>,
    user_mask: *const u64,
    probe: &mut impl FnMut(*const u64) -> c_int,
    real: impl FnOnce(Option<u64>) -> c_int,
    ready_fd: impl FnOnce() -> Option<c_int>,
) -> c_int {
    count(&STATS.waits, 1);
    // First look: exactly the plain call with a zero timeout. A signal
    // handled around it is indistinguishable from one handled just before
    // or after the plain call.
    let r = probe(user_mask);
    if r != 0 {
        return r;
    }
    // Held until the wait returns (it is dropped on every path).
    let on_cpu = OnCpu::enter();
    let t0 = now_ns();
    refill(t, t0);
    let ceiling = config::budget_ns();
    let mut budget = match mode {
        Mode::Poll => timeout_ns.unwrap_or(u64::MAX),
        // Dispatch mode reaches the engine for the hooks it does not
        // dispatch (large fd sets, epoll_pwait with a mask): hybrid.
        Mode::Hybrid | Mode::Dispatch => ceiling,
        Mode::Adaptive => t.ctl.budget_ns(t0, ceiling),
        Mode::Off | Mode::Interrupt => 0,
    };
    if let Some(tn) = timeout_ns {
        budget = budget.min(tn);
    }
    if budget > 0 && t.peer_cpu != NO_CPU && Some(t.peer_cpu) == peer::current_cpu() {
        count(&STATS.same_cpu, 1);
        budget = 0;
    }
    // Another thread of this process waits on this CPU: when its event
    // comes it needs this CPU, and a spin here would hold it (16 epoll
    // threads on one core, scripts/shim-share: hybrid p50 2.9x the plain
    // program's before this rule). Poll mode spins by request.
    if budget > 0 && mode != Mode::Poll && on_cpu.as_ref().is_some_and(|o| o.siblings() > 0) {
        count(&STATS.siblings, 1);
        budget = 0;
    }
    if budget > 0 && t0 < t.quiet_until {
        count(&STATS.contended, 1);
        budget = 0;
    }
    if budget > t.tokens.max(0) as u64 {
        count(&STATS.capped, 1);
        budget = t.tokens.max(0) as u64;
    }
    let r;
    let mut spun_before_block = 0;
    if budget >= MIN_SPIN_NS {
        count(&STATS.spins, 1);
        let block: u64 = !NEVER_BLOCK;
        let mut old: u64 = 0;
        sigmask(libc::SIG_SETMASK, &block, &mut old);
        let eff: *const u64 = if user_mask.is_null() { &old } else { user_mask };
        let mut n;
        let mut prev = t0;
        let mut preempted = false;
        loop {
            n = probe(eff);
            let now = now_ns();
            if now.wrapping_sub(prev) > PREEMPTED_NS {
                // The CPU is contended: spinning now only makes this thread
                // a CPU hog the scheduler will make wait. Back off.
                preempted = true;
                break;
            }
            prev = now;
            if n != 0 || now.wrapping_sub(t0) >= budget {
                break;
            }
            std::hint::spin_loop();
        }
        let e = errno();
        sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        set_errno(e);
        let spun = now_ns().wrapping_sub(t0);
        if preempted {
            t.quiet_until = t0.wrapping_add(spun).wrapping_add(t.backoff_ns);
            t.backoff_ns = (t.backoff_ns * 2).min(MAX_BACKOFF_NS);
        } else if n > 0 {
            t.backoff_ns = MIN_BACKOFF_NS;
        }
        t.tokens = t.tokens.saturating_sub(spun.min(i64::MAX as u64) as i64);
        count(&STATS.spin_ns, spun);
        if n > 0 {
            count(&STATS.spin_hits, 1);
            t.ctl.record(spun, spun, false);
            sample(t, ready_fd);
            return n;
        }
        if n < 0 {
            return n;
        }
        // Nothing within the budget: block for what is left.
        let left = match timeout_ns {
            None => None,
            Some(tn) if spun >= tn => return 0,
            Some(tn) => Some(tn - spun),
        };
        count(&STATS.blocked, 1);
        spun_before_block = spun;
        r = real(left);
    } else {
        count(&STATS.blocked, 1);
        r = real(None);
    }
    if r > 0 {
        t.ctl
            .record(now_ns().wrapping_sub(t0), spun_before_block, true);
        sample(t, ready_fd);
    }
    r
}

/// A millisecond timeout (poll, epoll) in ns: negative = forever.
pub fn ms_to_ns(ms: c_int) -> Option<u64> {
    u64::try_from(ms).ok().map(|m| m * 1_000_000)
}

/// The ms timeout for the real call: the caller's own, or what is left
/// rounded up (never shorter than asked).
pub fn ms_left(orig: c_int, left: Option<u64>) -> c_int {
    match left {
        None => orig,
        Some(ns) => ns.div_ceil(1_000_000).min(c_int::MAX as u64) as c_int,
    }
}

/// Refill the CPU-cap bucket for the wall time since the last wait.
fn refill(t: &mut Thread, now: u64) {
    let cap = config::cap_ppm() as u64;
    if t.last_ns != 0 {
        let dt = now.saturating_sub(t.last_ns).min(BUCKET_NS as u64);
        let add = (dt * cap / 1_000_000) as i64;
        t.tokens = t.tokens.saturating_add(add).min(BUCKET_NS);
    }
    t.last_ns = now;
}

fn sample(t: &mut Thread, ready_fd: impl FnOnce() -> Option<c_int>) {
    t.waits = t.waits.wrapping_add(1);
    if t.waits % SAMPLE_EVERY == 1
        && let Some(fd) = ready_fd()
    {
        t.peer_cpu = peer::incoming_cpu(fd).unwrap_or(NO_CPU);
    }
}

/// Print the counters (FASTWAKE_VERBOSE=1), at exit.
pub fn report() {
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = &STATS;
    // Helper processes that never waited (shell wrappers, …) stay quiet.
    if l(&s.waits) == 0 && l(&s.spins) == 0 {
        return;
    }
    crate::diag(&format!(
        "pid={} waits={} spins={} spin_hits={} spin_ms={:.3} blocked={} same_cpu_skips={} sibling_skips={} capped={} contended={}",
        std::process::id(),
        l(&s.waits),
        l(&s.spins),
        l(&s.spin_hits),
        l(&s.spin_ns) as f64 / 1e6,
        l(&s.blocked),
        l(&s.same_cpu),
        l(&s.siblings),
        l(&s.capped),
        l(&s.contended)
    ));
}
