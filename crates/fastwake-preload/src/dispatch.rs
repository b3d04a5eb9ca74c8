//! `FASTWAKE_MODE=dispatch`: serving any hooked wait, expressed as a
//! library [`Source`], by the library's per-CPU dispatcher (FastWake
//! approach 1 for kernel threads, docs/design/dispatcher.md). The hooks' sources
//! live with their hooks: `crate::fds` (`epoll_wait` and `poll` and
//! `select` sets of any size, with their unmasked `epoll_pwait`,
//! `epoll_pwait2`, `ppoll` and `pselect` forms) and `crate::verbs::dispatched`
//! (a blocking `ibv_get_cq_event`); this module knows neither.
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
//! the dispatcher peeking the channel's armed CQs (see `verbs::dispatched`). What
//! stays as in `hybrid`: the waits with a signal mask (`epoll_pwait`,
//! `epoll_pwait2`, `ppoll`, `pselect`), whose mask must hold during the
//! sleep, which the futex sleep cannot give atomically. No dispatcher for the thread's CPU (it failed to
//! start, or is starved: a `SCHED_IDLE` thread next to a busy one) means
//! the library's interrupt-mode fallback, which here is a `poll` on the
//! epoll fd.
//!
//! fork without exec (pre-fork servers): dispatcher threads do not
//! survive it, so a child starts its own, lazily as the parent did, one
//! for each CPU on which its threads wait. The forking thread's waiter,
//! copied into the child, is still registered with a parent's dispatcher;
//! the library counts that one as dead in the child (`fastwake::dispatch`
//! is fork-aware), so the waiter's next wait registers with the child's.

use fastwake::source::Source;
use fastwake::{WaitMode, Waiter};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

/// Dispatch mode is on in this process (set by the constructor).
static STARTED: AtomicBool = AtomicBool::new(false);

/// Per CPU (mod the table size): 0 no dispatcher yet, 1 started, 2 failed
/// to start (reported once; waits there fall back).
const CPUS: usize = 1024;
static CPU_STATE: [AtomicU8; CPUS] = [const { AtomicU8::new(0) }; CPUS];

/// Turn dispatch mode on. Called once, from the library constructor, in
/// dispatch mode. Dispatchers start lazily, one for each CPU on which a
/// thread of the program first waits (a dispatcher is two threads: on a
/// 64-CPU machine, starting them all would add 128 threads to every
/// process, most never used).
pub fn start() {
    // SAFETY: registers a plain function; it runs in the child only,
    // where it touches atomics.
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

/// In a forked child: none of the parent's dispatchers runs here, so each
/// CPU starts its own on its first wait. (A CPU whose start failed in the
/// parent is tried again: the child's limits may differ.)
extern "C" fn after_fork_child() {
    for st in &CPU_STATE {
        st.store(0, Ordering::Relaxed);
    }
}

/// Will `epoll_wait` be dispatched in this process?
pub fn active() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// A thread's dispatch-mode waiter.
struct State {
    waiter: Waiter,
}

thread_local! {
    // Has a destructor (the waiter unregisters at thread exit); only
    // touched in dispatch mode.
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// Serve one wait of `src` through this thread's dispatch-mode waiter:
/// the library registers `src`'s peek handle with the dispatcher of the
/// thread's CPU (once per handle: keep the handle across waits) and
/// sleeps until it hands off. `interruptible`: a signal ends the wait with
/// `EINTR`. `None` when it cannot be served (dispatch inactive, or the
/// thread's state busy: a hook entered from a signal handler during a
/// wait; or gone: thread exit).
pub(crate) fn serve<S: Source>(
    src: &mut S,
    timeout: Option<Duration>,
    interruptible: bool,
) -> Option<fastwake::Result<Option<S::Completion>>> {
    if !begin() {
        return None;
    }
    STATE
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let st = s.get_or_insert_with(|| State {
                waiter: Waiter::new(WaitMode::Dispatch),
            });
            st.waiter.set_interruptible(interruptible);
            Some(wait_counted(&mut st.waiter, src, timeout))
        })
        .ok()
        .flatten()
}

/// One dispatch-mode wait, counted (`crate::stats`: waits, hand-offs and
/// relays, fallbacks to interrupt mode).
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
    if let Some(s) = crate::stats::counters() {
        let after = w.stats();
        let d = &s.dispatch;
        d.waits.fetch_add(1, Ordering::Relaxed);
        d.handoffs.fetch_add(
            (after.handoffs + after.relays) - (before.handoffs + before.relays),
            Ordering::Relaxed,
        );
        d.fallbacks.fetch_add(
            after.dispatch_fallbacks - before.dispatch_fallbacks,
            Ordering::Relaxed,
        );
    }
    r
}
