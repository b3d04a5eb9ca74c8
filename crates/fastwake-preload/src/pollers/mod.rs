//! Threads that busy-poll get their cores back when idle
//! (`FASTWAKE_POLLERS=sleep`, `fastwake run --pollers sleep`; off by
//! default, because it changes a program's timing beyond its waits).
//!
//! Most microsecond software never calls a wait: it polls (`ibv_poll_cq`
//! returning 0, `epoll_wait` with a zero timeout, `recv` on a non-blocking
//! socket returning `EAGAIN`) and holds a core through every idle gap. The
//! hooks of those calls report each poll here: an empty one with the
//! sources it looked at, a non-empty one as a completion. The thread's
//! idle rule ([`fastwake::wait::idle`], owned by its governor) says when a
//! run of empty polls has lasted long enough; then:
//!
//! 1. **Arm**: the CQs of the thread's set are armed (their shim-owned
//!    channels, owned by the verbs hooks) and the poll returns empty as it would have. The
//!    program's loop then polls its sources once more: that is the re-check
//!    of the sleep rule, made by the program itself, so a CQE that came
//!    before the arm is found by the program, never taken by the shim.
//! 2. **Sleep**: at the next empty poll of the same source, with no
//!    completion in between, the thread waits for its whole set (its fds
//!    and its CQs' channel fds, one `ppoll`) through the wait engine
//!    (`crate::wait`: the mode's spin, pre-wake and CPU cap, as for any
//!    wait), for at most the rule's bound. A sleep that follows one its
//!    bound ended, with nothing in between, blocks at once: the thread is
//!    idle, and a spin would find nothing (in `hybrid` it cost 50 µs of
//!    every 100 µs bound of an idle server).
//! 3. **Return**: the channels' events are read and acked, and the polling
//!    call is made once more: it returns exactly what it would have at that
//!    moment (completions, or empty). A socket call whose own fd the last
//!    look saw not readable returns empty without the call
//!    ([`Next::Quiet`]), as the call made at that look would have.
//!
//! A completion, at any point, ends the run: nothing is armed in vain for
//! long (an armed CQ's event is drained at the next sleep). Progress of
//! the thread's own (a send on a socket, a posted work request) after a
//! sleep the bound ended, before any completion, switches sleeping off
//! for that thread (the hazard rule: it polls something the shim cannot
//! see).
//!
//! Not put to sleep (counted as `unsleepable`): a set with a CQ that has
//! the program's own channel (its events are the program's) or none the
//! shim made, or with more sources than a [`Set`] holds.

use crate::pollset::{self, Key, Set};
use crate::wait;
use fastwake::wait::idle::Verdict;
use fastwake_verbs_sys::ibv_cq;
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

/// A test's switch: the hazard rule off (`FASTWAKE_TEST_POLLERS_NO_HAZARD=1`),
/// so a test can show what happens without it.
static NO_HAZARD: AtomicBool = AtomicBool::new(false);

/// Constructor work.
pub fn init() {
    if std::env::var("FASTWAKE_TEST_POLLERS_NO_HAZARD").is_ok_and(|v| v == "1") {
        NO_HAZARD.store(true, Ordering::Relaxed);
    }
}

/// Are busy-polling threads put to sleep?
#[inline]
pub fn on() -> bool {
    crate::config::pollers()
}

/// What the pollers need of a CQ they may sleep on: its shim-owned
/// channel's fd, arming it, reading its events. The verbs hooks own those
/// channels and hand these over at init ([`set_cq_ops`]): the pollers sit
/// below the hooks that report polls to them.
#[derive(Clone, Copy)]
pub struct CqOps {
    pub channel_fd: fn(usize) -> Option<c_int>,
    pub arm: fn(usize) -> bool,
    pub drain: fn(usize),
}

static CQ_OPS: std::sync::OnceLock<CqOps> = std::sync::OnceLock::new();

/// Hand over the CQ operations (once, from the verbs hooks' init).
pub fn set_cq_ops(ops: CqOps) {
    let _ = CQ_OPS.set(ops);
}

fn cq_fd(cq: *mut ibv_cq) -> Option<c_int> {
    CQ_OPS.get().and_then(|o| (o.channel_fd)(cq as usize))
}

struct Thread {
    set: Set,
    /// The set was armed at an empty poll of this source, with this bound.
    armed: Option<(Key, u64)>,
    /// A run of empty polls is in progress (a completion ends it).
    running: bool,
    /// The last sleep ended by its bound and no completion came since (the
    /// rule's suspicion, mirrored so a completion's fast path can see it).
    suspect: bool,
}

thread_local! {
    // Const-initialised, no destructor: safe from any hook at any time.
    static THREAD: RefCell<Thread> = const {
        RefCell::new(Thread { set: Set::EMPTY, armed: None, running: false, suspect: false })
    };
}

fn count(f: impl FnOnce(&fastwake::preload_stats::Pollers) -> &std::sync::atomic::AtomicU64) {
    crate::stats::add(|s| f(&s.pollers), 1);
}

/// A poll returned something: the run of empty polls is over.
#[inline]
pub fn completion() {
    let _ = THREAD.try_with(|t| {
        let Ok(mut t) = t.try_borrow_mut() else {
            return;
        };
        if !t.running && !t.suspect {
            return;
        }
        // Also right after a sleep its bound ended (the call made again
        // found what came meanwhile): the suspicion is cleared.
        t.running = false;
        t.suspect = false;
        t.armed = None;
        t.set.clear();
        wait::with_governor(|g, _| g.idle().completion());
    });
}

/// What an empty poll's hook does next.
pub enum Next {
    /// Return empty, as without the shim.
    Empty,
    /// The thread slept; make the polling call again and return its result.
    Again,
    /// The thread slept, and the look that ended its sleep found this
    /// call's own socket not readable (another source of the set, or the
    /// bound, ended it): return empty, as the call made at that look would
    /// have. Only for a socket call's key (`Key::Fd(pollset::KIND_SOCKET, fd)`), whose
    /// readiness is its one fd's; making the call again would cost the
    /// program's next poll of the source that is ready (a non-blocking
    /// `accept4` that finds no connection takes ~3 µs on this project's
    /// VMs, the kernel allocating and freeing the new socket's file).
    Quiet,
}

/// An empty poll of `key`; `add` puts the sources it looked at into the
/// thread's set.
pub fn empty(key: Key, add: impl FnOnce(&mut Set)) -> Next {
    count(|p| &p.empty_polls);
    THREAD
        .try_with(|t| {
            let Ok(mut t) = t.try_borrow_mut() else {
                return Next::Empty;
            };
            wait::with_governor(|g, peer| empty_in(&mut t, g, peer, key, add))
                .unwrap_or(Next::Empty)
        })
        .unwrap_or(Next::Empty)
}

fn empty_in(
    t: &mut Thread,
    g: &mut fastwake::wait::Governor,
    peer: Option<u32>,
    key: Key,
    add: impl FnOnce(&mut Set),
) -> Next {
    if g.idle().off().is_some() {
        return Next::Empty;
    }
    // The run's start is dated by the rule (its first empty poll).
    t.running = true;
    add(&mut t.set);
    if let Some((k, bound)) = t.armed
        && k == key
    {
        // The program polled its whole loop since the arm, and this source
        // came round again empty: sleep.
        t.armed = None;
        return sleep(t, g, peer, bound, key);
    }
    let Verdict::Sleep(bound) = g.idle().empty(fastwake::cpu::monotonic_ns) else {
        return Next::Empty;
    };
    let armed = !t.set.overflow
        && t.set.cqs().all(|cq| cq_fd(cq).is_some())
        && t.set
            .cqs()
            .all(|cq| CQ_OPS.get().is_some_and(|o| (o.arm)(cq as usize)));
    if !armed {
        count(|p| &p.unsleepable);
        // Start the run again: asked once per window, not per poll.
        g.idle().completion();
        t.set.clear();
        return Next::Empty;
    }
    t.armed = Some((key, bound));
    Next::Empty
}

/// Largest pollfd array a sleep builds (the set's fds and its CQs'
/// channel fds).
const MAX_POLL: usize = pollset::MAX_FDS + pollset::MAX_CQS;

/// Wait for the thread's set through the engine, for at most `bound` ns.
fn sleep(
    t: &mut Thread,
    g: &mut fastwake::wait::Governor,
    peer: Option<u32>,
    bound: u64,
    key: Key,
) -> Next {
    let mut fds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_POLL];
    let mut n = 0;
    for p in t.set.fds() {
        fds[n] = *p;
        n += 1;
    }
    let mut chans = [0usize; pollset::MAX_CQS];
    let mut nch = 0;
    for cq in t.set.cqs() {
        let Some(fd) = cq_fd(cq) else {
            continue;
        };
        chans[nch] = cq as usize;
        nch += 1;
        fds[n] = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        n += 1;
    }
    let set = &fds[..n];
    // The channels any look saw readable (bit i: chans[i]): only those
    // hold events to read.
    let first_ch = n - nch;
    let ready = std::cell::Cell::new(0u32);
    // A socket call's own fd, and what the last look saw of it.
    let own = match key {
        Key::Fd(pollset::KIND_SOCKET, fd) => set[..first_ch].iter().position(|p| p.fd == fd),
        _ => None,
    };
    let own_revents = std::cell::Cell::new(0i16);
    let look = |mask: *const u64, ns: u64| -> c_int {
        let mut copy = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_POLL];
        copy[..set.len()].copy_from_slice(set);
        // SAFETY: a live stack array of set.len() pollfds; mask null or the
        // engine's live sigset.
        let r = unsafe { crate::sys::ppoll_ns(copy.as_mut_ptr(), set.len() as _, ns, mask) };
        if let Some(i) = own {
            own_revents.set(if r > 0 { copy[i].revents } else { 0 });
        }
        if r > 0 {
            for (i, p) in copy[first_ch..set.len()].iter().enumerate() {
                if p.revents != 0 {
                    ready.set(ready.get() | 1 << i);
                }
            }
        }
        r
    };
    let t0 = fastwake::cpu::monotonic_ns();
    let run_t0 = g.idle().run_start().unwrap_or(t0);
    crate::stats::add(|s| &s.pollers.polling_ns, t0.saturating_sub(run_t0));
    count(|p| &p.sleeps);
    let r = if t.suspect {
        // The last sleep ended by its bound and nothing came since: the
        // thread is idle, and a spin would find nothing. Block at once.
        look(std::ptr::null(), bound)
    } else {
        wait::engine(
            g,
            peer,
            Some(bound),
            std::ptr::null(),
            &mut |m, ns| look(m, ns),
            |left| look(std::ptr::null(), left.unwrap_or(bound).max(1)),
        )
    };
    // A channel no look saw readable has no event: not read (its CQ stays
    // armed for the next sleep). After a signal, all are.
    let ready = if r < 0 { u32::MAX } else { ready.get() };
    if let Some(ops) = CQ_OPS.get() {
        for (i, &cq) in chans[..nch].iter().enumerate() {
            if ready & 1 << i != 0 {
                (ops.drain)(cq);
            }
        }
    }
    let t1 = fastwake::cpu::monotonic_ns();
    let slept = t1.saturating_sub(t0);
    crate::stats::add(|s| &s.pollers.sleep_ns, slept);
    // A signal (EINTR) is neither: it teaches the bound nothing, and the
    // program's call, made again, sees what there is.
    t.suspect = false;
    if r > 0 {
        count(|p| &p.woke_by_completion);
        g.idle().slept(slept, true);
    } else if r == 0 {
        count(|p| &p.woke_by_bound);
        g.idle().slept(slept, false);
        t.suspect = true;
    } else {
        g.idle().completion();
    }
    t.set.clear();
    t.running = false;
    if r >= 0 && own.is_some() && own_revents.get() == 0 {
        Next::Quiet
    } else {
        Next::Again
    }
}

/// Is this thread under the hazard rule's suspicion (its last sleep ended
/// by the bound, no completion since)? Cheap: the send hooks ask it first.
#[inline]
pub fn suspect() -> bool {
    wait::with_governor(|g, _| g.idle().suspect()).unwrap_or(false)
}

/// The thread made progress of its own (a send, a posted work request):
/// the hazard rule's evidence.
#[inline]
pub fn progress() {
    if !on() || NO_HAZARD.load(Ordering::Relaxed) {
        return;
    }
    let off = wait::with_governor(|g, _| g.idle().progress()).unwrap_or(false);
    if off {
        count(|p| &p.off_hazard);
        let _ = THREAD.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut() {
                t.armed = None;
                t.set.clear();
                t.running = false;
                t.suspect = false;
            }
        });
        if crate::config::verbose() {
            crate::diag(
                "pollers: a thread made progress after a sleep its bound ended, with no completion of what it polls: it polls something the shim cannot see; sleeping is off for it",
            );
        }
    }
}

// ------------------------------------------------------------ the hooks' side

/// A zero-timeout fd call (`epoll_wait`, `poll`, `select`, ...) returned
/// `n`: report it, and when the thread slept make the call `again`.
#[inline]
pub fn after_fd_call(
    n: c_int,
    key: Key,
    add: impl FnOnce(&mut Set),
    again: impl FnOnce() -> c_int,
) -> c_int {
    if n != 0 {
        if n > 0 {
            completion();
        }
        return n;
    }
    match empty(key, add) {
        Next::Empty => 0,
        // (Quiet is a socket call's alone.)
        Next::Again | Next::Quiet => found(again()),
    }
}

/// An `ibv_poll_cq` of `cq` returned `n`: report it, and when the thread
/// slept poll `again`.
#[inline]
pub fn after_poll_cq(cq: *mut ibv_cq, n: c_int, again: impl FnOnce() -> c_int) -> c_int {
    if n != 0 {
        if n > 0 {
            completion();
        }
        return n;
    }
    match empty(Key::Cq(cq as usize), |s| s.add_cq(cq)) {
        Next::Empty => 0,
        Next::Again | Next::Quiet => found(again()),
    }
}

/// The call made again after a sleep returned `n`: what it found is a
/// completion (the sleep's own end does not clear a bound's suspicion).
#[inline]
pub fn found(n: c_int) -> c_int {
    if n > 0 {
        completion();
    }
    n
}
