//! The dispatcher thread for ordinary kernel threads (FastWake approach 1
//! without kernel changes).
//!
//! Application threads on a core register their source's [`Peek`] handle
//! and sleep on a per-thread futex ([`super::slot`]). One dispatcher thread
//! on the same core peeks every waiting source; when one is ready it rings
//! that thread's futex. The wake-up is a same-core one (~1 µs here, against
//! ~4 µs for the cross-core wake the producer would otherwise cause), and
//! with the default [`Policy::Idle`] the dispatcher runs only when the core
//! has nothing else to do, so the woken thread preempts it at once and
//! runnable application threads never lose CPU to it.
//!
//! Idle policy: after `idle_after` without a hand-off the dispatcher hands
//! every waiting thread back to interrupt mode (state `PAUSED`: each arms
//! its own source and sleeps on it, the ordinary arm → re-check → sleep) and
//! sleeps itself; the first thread that gets a completion, or starts a new
//! wait, wakes it and polling resumes.
//!
//! Death: if the dispatcher thread exits for any reason (stopped, panicked)
//! a guard marks it dead and rings every waiting thread with `DEAD`; they
//! and all later waits fall back to interrupt mode.

use super::slot::{HANDED, PAUSED, Slot, WAITING, WaitSet};
use super::watch::Watch;
use super::{DispatchStats, Policy, State};
use crate::source::Peek;
use crate::sync::{AtomicU32, AtomicU64, FutexWord, Ordering};
use crate::{Fail, Result};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A registration (`Some`) or unregistration (`None`) of slot `.0`, queued
/// for the dispatcher thread, which alone owns the watched set.
type Change = (usize, Option<Arc<dyn Peek>>);

const MODE_POLLING: u32 = 0;
const MODE_SLEEPING: u32 = 1;
const MODE_DEAD: u32 = 2;

/// Empty passes between clock reads for the idle threshold and heartbeat.
const PASSES_PER_CLOCK: u32 = 256;

/// A polling dispatcher whose heartbeat is older than this is not getting
/// the CPU (with `SCHED_IDLE`, any busy thread on the core starves it), so
/// waits go to interrupt mode rather than rely on it.
const STALE: Duration = Duration::from_micros(500);

/// How a dispatcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The core whose waiting threads it serves: threads that wait in
    /// dispatch mode on this CPU register with it.
    pub cpu: u32,
    /// Where the dispatcher thread itself runs; `None` = `cpu` (the fast
    /// case: a same-core wake-up).
    pub run_on: Option<u32>,
    /// Scheduling policy of the dispatcher thread.
    pub policy: Policy,
    /// Sleep after this long without a hand-off; `None` = never. With
    /// [`Config::learn_idle`], the most the learned threshold may be.
    pub idle_after: Option<Duration>,
    /// Learn the idle threshold instead of fixing it: a polling
    /// dispatcher is a spinning waiter whose wait is "the next hand-off",
    /// so the same controller as adaptive waits ([`crate::adaptive`]: cost
    /// model, catch limit, CPU cap) picks how long it keeps polling after
    /// a hand-off before it hands its waiters back to interrupt mode and
    /// sleeps. Why: a fixed 2 ms threshold keeps polling through every gap
    /// of a stream of fewer than 500 waits per second (86 % of a core for
    /// a 1k/s Poisson stream, measured); the learned one stops where the
    /// wake-ups it saves are not worth the CPU. `None`: fixed.
    pub learn_idle: Option<crate::adaptive::Config>,
    /// Most threads it can serve at once.
    pub capacity: usize,
    /// Use readiness summaries where sources support them, once more than
    /// `summary_above` threads are registered.
    pub summary: bool,
    /// See `summary`.
    pub summary_above: usize,
    /// Relay: a thread about to wait first peeks the core's other waiting
    /// sources (and its own) for up to this long, and hands off to the
    /// owner of the first ready one itself; `None` = never. See
    /// the `dispatch::waiter` module for why this halves the switches per hand-off.
    pub relay: Option<Duration>,
}

/// Default relay spin: about the time a reply takes to come back as the
/// next request over a fast loopback path (one cross-core round trip plus
/// the client's turn-around), so a chain of requests keeps handing off
/// without the dispatcher; short enough to cost little when nothing comes.
pub const DEFAULT_RELAY: Duration = Duration::from_micros(5);

impl Config {
    /// Defaults for `cpu`: same core, `SCHED_IDLE`, sleep after 2 ms idle,
    /// 1024 threads, summaries on, relay 5 µs.
    pub fn new(cpu: u32) -> Config {
        Config {
            cpu,
            run_on: None,
            policy: Policy::Idle,
            idle_after: Some(super::DEFAULT_IDLE_AFTER),
            capacity: 1024,
            summary: true,
            summary_above: super::watch::SUMMARY_ABOVE,
            relay: Some(DEFAULT_RELAY),
            learn_idle: None,
        }
    }
}

/// Line aligned: the dispatcher writes its counters and heartbeat on every
/// pass, and the `Arc` must not share a line with other heap objects.
#[repr(align(64))]
pub(crate) struct Core {
    cfg: Config,
    pub(crate) slots: Box<[Slot]>,
    pub(crate) waitset: WaitSet,
    mode: AtomicU32,
    kick: FutexWord,
    pending: Mutex<Vec<Change>>,
    pending_flag: AtomicBool,
    free: Mutex<Vec<usize>>,
    stop: AtomicBool,
    crash: AtomicBool,
    /// Test hook: ms the dispatcher stays off the CPU after it is woken
    /// from its idle sleep (what a busy core does to a SCHED_IDLE thread,
    /// made deterministic).
    stall_ms: AtomicU64,
    /// The idle threshold in force, ns (u64::MAX: never), for stats.
    idle_ns: AtomicU64,
    handoffs: AtomicU64,
    passes: AtomicU64,
    idle_sleeps: AtomicU64,
    paused: AtomicU64,
    registered: AtomicU64,
    clock: Mutex<Option<libc::clockid_t>>,
    /// The watchdog thread's CPU clock.
    wclock: Mutex<Option<libc::clockid_t>>,
    epoch: Instant,
    /// µs since `epoch` at the dispatcher's last clock read.
    heartbeat: AtomicU64,
    /// Registered handles, for the watchdog and relaying waiters (the
    /// dispatcher keeps its own copies in its `Watch`). A read-write lock:
    /// a relaying thread preempted while reading must not block the others.
    /// copies in its `Watch`).
    handles: RwLock<Vec<Option<Arc<dyn Peek>>>>,
    /// Bumped when the dispatcher leaves its idle sleep or dies: the
    /// watchdog sleeps on it meanwhile.
    awake: FutexWord,
    rescued: AtomicU64,
    relayed: AtomicU64,
}

impl Core {
    /// The dispatcher state.
    pub(crate) fn state(&self) -> State {
        match self.mode.load(Ordering::SeqCst) {
            MODE_POLLING => State::Polling,
            MODE_SLEEPING => State::Sleeping,
            _ => State::Dead,
        }
    }

    /// Polling, but not seen running lately: starved of CPU.
    pub(crate) fn stale(&self) -> bool {
        self.mode.load(Ordering::Relaxed) == MODE_POLLING
            && self.epoch.elapsed().as_micros() as u64
                > self.heartbeat.load(Ordering::Relaxed) + STALE.as_micros() as u64
    }

    /// Record that the core's sources were just being polled, by the
    /// dispatcher or by a relaying waiter: either way sleeping waiters are
    /// being looked after, so new waits may trust the core.
    pub(crate) fn beat(&self, now: Instant) {
        self.heartbeat.store(
            now.duration_since(self.epoch).as_micros() as u64,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.mode.load(Ordering::SeqCst) == MODE_DEAD
    }

    /// Register a waiter's source; `None` when dead or full.
    pub(crate) fn register(&self, peek: Arc<dyn Peek>) -> Option<usize> {
        if self.is_dead() {
            return None;
        }
        let i = lock(&self.free).pop()?;
        write(&self.handles)[i] = Some(peek.clone());
        lock(&self.pending).push((i, Some(peek)));
        self.pending_flag.store(true, Ordering::SeqCst);
        self.registered.fetch_add(1, Ordering::Relaxed);
        Some(i)
    }

    pub(crate) fn unregister(&self, i: usize) {
        if self.is_dead() {
            return;
        }
        write(&self.handles)[i] = None;
        lock(&self.pending).push((i, None));
        self.pending_flag.store(true, Ordering::SeqCst);
        self.registered.fetch_sub(1, Ordering::Relaxed);
        // A sleeping dispatcher drains on its next wake; the slot stays
        // unusable until then, which is harmless.
    }

    /// Wake the dispatcher if it sleeps (idle policy).
    pub(crate) fn kick(&self) {
        if self.mode.load(Ordering::SeqCst) == MODE_SLEEPING
            && self
                .mode
                .compare_exchange(
                    MODE_SLEEPING,
                    MODE_POLLING,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
        {
            self.kick.bump_and_wake_private();
            // The watchdog sleeps while the dispatcher does; wake it here,
            // not when the dispatcher gets going: a SCHED_IDLE dispatcher
            // next to a busy thread may not run for hundreds of ms, and
            // the waits that kicked it must be rescued meanwhile (measured:
            // a 1k/s stream next to a CPU hog waited 434 ms at p50).
            self.awake.bump_and_wake_private();
        }
    }

    /// Make the threshold visible in [`DispatchStats`] (a store only when
    /// it changed: the line is read by other threads).
    fn publish_idle(&self, idle: &IdleClock) {
        let ns = idle.threshold().map_or(u64::MAX, |d| d.as_nanos() as u64);
        if self.idle_ns.load(Ordering::Relaxed) != ns {
            self.idle_ns.store(ns, Ordering::Relaxed);
        }
    }

    /// The idle threshold in force now (`None`: never sleeps).
    pub(crate) fn idle_threshold(&self) -> Option<Duration> {
        match self.idle_ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub(crate) fn stats(&self) -> DispatchStats {
        DispatchStats {
            handoffs: self.handoffs.load(Ordering::Relaxed),
            rescued: self.rescued.load(Ordering::Relaxed),
            relayed: self.relayed.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
            idle_sleeps: self.idle_sleeps.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            registered: self.registered.load(Ordering::Relaxed),
            idle_after: self.idle_threshold(),
            state: self.state(),
        }
    }

    fn drain_pending(&self, watch: &mut Watch) {
        self.pending_flag.store(false, Ordering::SeqCst);
        let batch = std::mem::take(&mut *lock(&self.pending));
        let mut freed = Vec::new();
        for (i, p) in batch {
            match p {
                Some(p) => {
                    watch.insert(i, p);
                    // The attach may have missed a completion: peek once.
                    if watch.ready_full(i) && self.slots[i].hand(HANDED) {
                        self.handoffs.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    watch.remove(i);
                    self.slots[i].reset();
                    freed.push(i);
                }
            }
        }
        lock(&self.free).extend(freed);
    }

    /// One pass over the waiting sources; returns hand-offs made.
    #[inline]
    fn pass(&self, watch: &Watch) -> u32 {
        let mut handed = 0;
        watch.candidates(
            |w| self.waitset.word(w),
            |i| {
                let s = &self.slots[i];
                if s.state() != WAITING {
                    self.waitset.unmark(i, s);
                } else if watch.ready(i) && s.hand(HANDED) {
                    handed += 1;
                }
            },
        );
        handed
    }

    /// Idle: hand every waiting thread back to interrupt mode and sleep
    /// until one of them (or a new wait) kicks us.
    fn sleep_idle(&self) {
        let seq = self.kick.load();
        self.mode.store(MODE_SLEEPING, Ordering::SeqCst);
        self.idle_sleeps.fetch_add(1, Ordering::Relaxed);
        let mut paused = 0;
        for w in 0..self.waitset.words() {
            let mut bits = self.waitset.word(w);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.slots[i].hand(PAUSED) {
                    paused += 1;
                }
            }
        }
        self.paused.fetch_add(paused, Ordering::Relaxed);
        while self.mode.load(Ordering::SeqCst) == MODE_SLEEPING
            && !self.stop.load(Ordering::SeqCst)
            && !self.pending_flag.load(Ordering::SeqCst)
        {
            // Stop requests and crash injection kick; the timeout is only a
            // safety net, long enough to cost nothing.
            self.kick.wait_private(seq, Some(Duration::from_secs(1)));
        }
        let stall = self.stall_ms.load(Ordering::Relaxed);
        if stall > 0 {
            std::thread::sleep(Duration::from_millis(stall));
        }
        let _ = self.mode.compare_exchange(
            MODE_SLEEPING,
            MODE_POLLING,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.awake.bump_and_wake_private();
    }

    /// µs since the dispatcher last read its clock (it does every few
    /// hundred empty passes and after each hand-off).
    fn heartbeat_age(&self) -> Duration {
        let now = self.epoch.elapsed().as_micros() as u64;
        Duration::from_micros(now.saturating_sub(self.heartbeat.load(Ordering::Relaxed)))
    }

    /// The watchdog's pass, for a dispatcher that is not getting the CPU:
    /// hand off every waiting thread whose source is ready.
    fn rescue(&self) {
        let handles = read(&self.handles);
        let mut n = 0;
        for w in 0..self.waitset.words() {
            let mut bits = self.waitset.word(w);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.slots[i].state() == WAITING
                    && handles[i].as_ref().is_some_and(|p| p.ready())
                    && self.slots[i].hand(HANDED)
                {
                    n += 1;
                }
            }
        }
        self.rescued.fetch_add(n, Ordering::Relaxed);
    }

    /// The relay budget, when relaying makes sense now: the dispatcher is
    /// polling (asleep, its waiters are paused in interrupt mode anyway).
    pub(crate) fn relay_budget(&self) -> Option<Duration> {
        self.cfg
            .relay
            .filter(|_| self.mode.load(Ordering::Relaxed) == MODE_POLLING)
    }

    /// One relay pass by the waiting thread that owns slot `me`: hand off
    /// to the first other waiting thread whose source is ready. True when
    /// it handed one.
    ///
    /// The handles are read under the read lock, and the hand-off (a futex
    /// wake, after which the woken thread may preempt us at once) happens
    /// after it is released: a relayer preempted inside the lock would
    /// otherwise stall the next relayer (measured: that turned most relays
    /// into two extra switches).
    pub(crate) fn relay_pass(&self, me: usize) -> bool {
        let found = {
            let handles = read(&self.handles);
            let mut found = None;
            'scan: for w in 0..self.waitset.words() {
                let mut bits = self.waitset.word(w);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if i != me
                        && self.slots[i].state() == WAITING
                        && handles[i].as_ref().is_some_and(|p| p.ready())
                    {
                        found = Some(i);
                        break 'scan;
                    }
                }
            }
            found
        };
        // Slots live as long as the core, so no lock is needed to hand.
        match found {
            Some(i) if self.slots[i].hand(HANDED) => {
                self.relayed.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// FIFO policy: after a hand-off, let the woken thread run until it
    /// waits again (its announce kicks us) or 100 µs pass.
    fn step_aside(&self) {
        let seq = self.kick.load();
        self.mode.store(MODE_SLEEPING, Ordering::SeqCst);
        self.kick
            .wait_private(seq, Some(Duration::from_micros(100)));
        let _ = self.mode.compare_exchange(
            MODE_SLEEPING,
            MODE_POLLING,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    fn run(&self) {
        let mut watch = Watch::new(
            self.cfg.capacity,
            self.cfg.summary,
            self.cfg.summary_above,
            // The woken thread reads the slot on this core only when the
            // dispatcher runs on the waiters' core.
            self.cfg.run_on.is_none(),
        );
        let mut last_busy = Instant::now();
        let mut idle = IdleClock::new(&self.cfg, last_busy);
        let mut empty: u32 = 0;
        let mut passes: u64 = 0;
        loop {
            if self.pending_flag.load(Ordering::Relaxed) {
                self.drain_pending(&mut watch);
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if self.crash.load(Ordering::Relaxed) {
                panic!("fastwake dispatcher: injected crash");
            }
            let handed = self.pass(&watch);
            passes += 1;
            if handed > 0 {
                self.handoffs.fetch_add(handed as u64, Ordering::Relaxed);
                match self.cfg.policy {
                    Policy::Yield => super::sched::yield_now(),
                    Policy::Fifo => self.step_aside(),
                    Policy::Idle | Policy::Normal => {}
                }
                empty = 0;
                let now = Instant::now();
                idle.busy(last_busy, now);
                self.publish_idle(&idle);
                last_busy = now;
                self.beat(last_busy);
                continue;
            }
            std::hint::spin_loop();
            empty = empty.wrapping_add(1);
            if empty.is_multiple_of(PASSES_PER_CLOCK) {
                self.passes.store(passes, Ordering::Relaxed);
                self.beat(Instant::now());
                // Now and then the complete test, for closed sources.
                let mut n = 0;
                watch.slow_pass(
                    |w| self.waitset.word(w),
                    |i| {
                        if self.slots[i].hand(HANDED) {
                            n += 1;
                        }
                    },
                );
                self.handoffs.fetch_add(n, Ordering::Relaxed);
                if let Some(t) = idle.threshold()
                    && last_busy.elapsed() >= t
                {
                    self.sleep_idle();
                    let now = Instant::now();
                    idle.woke(last_busy, now);
                    self.publish_idle(&idle);
                    last_busy = now;
                    self.beat(last_busy);
                }
            }
        }
        self.passes.store(passes, Ordering::Relaxed);
    }

    /// Mark dead and release every waiter.
    fn die(&self) {
        self.mode.store(MODE_DEAD, Ordering::SeqCst);
        for s in self.slots.iter() {
            s.kill();
        }
        unregister_core(self);
        self.awake.bump_and_wake_private();
    }
}

impl Slot {
    /// Back to `RUNNING` for reuse by a new registration.
    fn reset(&self) {
        // Only the dispatcher resets, and only slots whose owner is gone.
        let _ = self.cancel();
        let _ = self.reclaim();
    }
}

/// The dispatcher's idle threshold: fixed, or learned per dispatcher by an
/// adaptive core that sees each stretch from one hand-off to the next as a
/// wait (see [`Config::learn_idle`]).
struct IdleClock {
    fixed: Option<Duration>,
    learn: Option<(crate::adaptive::Learner, Instant)>,
    /// The threshold planned for the stretch in progress.
    now: Option<Duration>,
}

impl IdleClock {
    fn new(cfg: &Config, start: Instant) -> IdleClock {
        let mut c = IdleClock {
            fixed: cfg.idle_after,
            learn: cfg.learn_idle.map(|a| {
                (
                    crate::adaptive::Learner::new(a, crate::adaptive::Model::default()),
                    start,
                )
            }),
            now: cfg.idle_after,
        };
        c.plan(start);
        c
    }

    fn threshold(&self) -> Option<Duration> {
        self.now
    }

    fn plan(&mut self, at: Instant) {
        let Some((core, epoch)) = self.learn.as_mut() else {
            return;
        };
        let ns = at.saturating_duration_since(*epoch).as_nanos() as u64;
        let b = match core.plan(ns, crate::adaptive::Env::FREE) {
            crate::adaptive::Plan::Spin(b) => Duration::from_nanos(b),
            crate::adaptive::Plan::Dispatch => Duration::ZERO,
        };
        self.now = Some(self.fixed.map_or(b, |f| b.min(f)));
    }

    /// A hand-off at `now`; the previous one (or wake-up) was at `since`.
    fn busy(&mut self, since: Instant, now: Instant) {
        self.learned(since, now, None);
    }

    /// Woken from the idle sleep at `now`, having polled from `since`.
    fn woke(&mut self, since: Instant, now: Instant) {
        let spun = self.now.unwrap_or_default();
        self.learned(since, now, Some(spun));
    }

    fn learned(&mut self, since: Instant, now: Instant, slept_after: Option<Duration>) {
        let Some((core, _)) = self.learn.as_mut() else {
            return;
        };
        let waited = now.saturating_duration_since(since).as_nanos() as u64;
        core.record(crate::adaptive::Outcome {
            waited_ns: waited,
            spun_ns: slept_after.map_or(waited, |d| (d.as_nanos() as u64).min(waited)),
            slept: slept_after.is_some(),
            wake_ns: None,
        });
        self.plan(now);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data that is still
    // consistent (a Vec push/pop), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // As for `lock`: the guarded data stays consistent across a panic.
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// Dispatchers by served CPU. Weak: a dispatcher's lifetime is its handle's.
static REGISTRY: Mutex<Vec<(u32, Weak<Core>)>> = Mutex::new(Vec::new());

/// The live dispatcher serving `cpu`, if any.
pub(crate) fn lookup(cpu: u32) -> Option<Arc<Core>> {
    let reg = lock(&REGISTRY);
    reg.iter()
        .filter(|(c, _)| *c == cpu)
        .filter_map(|(_, w)| w.upgrade())
        .find(|c| !c.is_dead())
}

fn unregister_core(core: &Core) {
    lock(&REGISTRY).retain(|(_, w)| w.upgrade().is_some_and(|c| !std::ptr::eq(&*c, core)));
}

/// The dispatcher thread's entry in the pressure sampler's list of
/// idle-class threads, removed when the thread leaves `run` (or unwinds).
struct IdleClass(i32);

impl IdleClass {
    fn declare(cpu: u32) -> IdleClass {
        IdleClass(crate::adaptive::pressure::declare_idle_thread(cpu))
    }
}

impl Drop for IdleClass {
    fn drop(&mut self) {
        crate::adaptive::pressure::forget_idle_thread(self.0);
    }
}

struct DeathGuard(Arc<Core>);

impl Drop for DeathGuard {
    fn drop(&mut self) {
        // Runs on return and on panic alike.
        self.0.die();
    }
}

/// A running dispatcher; dropping it stops the thread (its waiters fall
/// back to interrupt mode).
pub struct Dispatcher {
    core: Arc<Core>,
    thread: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("config", &self.core.cfg)
            .field("state", &self.core.state())
            .finish()
    }
}

impl Dispatcher {
    /// Start a dispatcher for `cfg.cpu`. Fails if the CPU does not exist,
    /// already has a live dispatcher, or the policy cannot be set.
    pub fn start(cfg: Config) -> Result<Dispatcher> {
        // Not cpu::online(): that counts the CPUs the *caller* may use,
        // which is one when the caller is pinned.
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        let run_on = cfg.run_on.unwrap_or(cfg.cpu);
        if cfg.cpu >= n || run_on >= n {
            return Err(Fail::invalid(format!(
                "dispatcher CPU {} does not exist (this host has {n})",
                cfg.cpu.max(run_on)
            )));
        }
        if cfg.capacity == 0 || cfg.capacity > 1 << 16 {
            return Err(Fail::invalid("dispatcher capacity must be in 1..=65536"));
        }
        let core = Arc::new(Core {
            cfg,
            slots: (0..cfg.capacity).map(|_| Slot::default()).collect(),
            waitset: WaitSet::new(cfg.capacity),
            mode: AtomicU32::new(MODE_POLLING),
            kick: FutexWord::new(0),
            pending: Mutex::new(Vec::new()),
            pending_flag: AtomicBool::new(false),
            free: Mutex::new((0..cfg.capacity).rev().collect()),
            stop: AtomicBool::new(false),
            crash: AtomicBool::new(false),
            stall_ms: AtomicU64::new(0),
            idle_ns: AtomicU64::new(cfg.idle_after.map_or(u64::MAX, |d| d.as_nanos() as u64)),
            handoffs: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            idle_sleeps: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            registered: AtomicU64::new(0),
            clock: Mutex::new(None),
            wclock: Mutex::new(None),
            epoch: Instant::now(),
            heartbeat: AtomicU64::new(0),
            handles: RwLock::new(vec![None; cfg.capacity]),
            awake: FutexWord::new(0),
            rescued: AtomicU64::new(0),
            relayed: AtomicU64::new(0),
        });
        {
            let mut reg = lock(&REGISTRY);
            reg.retain(|(_, w)| w.upgrade().is_some_and(|c| !c.is_dead()));
            if reg.iter().any(|(c, _)| *c == cfg.cpu) {
                return Err(Fail::new(
                    libc::EBUSY,
                    format!("CPU {} already has a dispatcher", cfg.cpu),
                ));
            }
            reg.push((cfg.cpu, Arc::downgrade(&core)));
        }
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        let c2 = core.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fw-dispatch{}", cfg.cpu))
            .spawn(move || {
                let guard = DeathGuard(c2);
                let setup = crate::cpu::pin(run_on).and_then(|_| cfg.policy.apply());
                let ok = setup.is_ok();
                *lock(&guard.0.clock) = thread_clock();
                let _ = tx.send(setup);
                if ok {
                    // Adaptive waiters must not count a SCHED_IDLE
                    // dispatcher as a thread competing for their CPU.
                    let _idle = (cfg.policy == Policy::Idle).then(|| IdleClass::declare(run_on));
                    guard.0.run();
                }
            })
            .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn dispatcher thread: {e}")));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                core.die();
                return Err(e);
            }
        };
        let c3 = core.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("fw-watchdog{}", cfg.cpu))
            .spawn(move || watchdog(&c3))
            .ok();
        let d = Dispatcher {
            core,
            thread: Some(thread),
            watchdog,
        };
        match rx.recv() {
            Ok(Ok(())) => Ok(d),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Fail::new(libc::EIO, "dispatcher thread died at start")),
        }
    }

    /// Running, sleeping (idle policy) or dead.
    pub fn state(&self) -> State {
        self.core.state()
    }

    /// Counters so far.
    pub fn stats(&self) -> DispatchStats {
        self.core.stats()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> Config {
        self.core.cfg
    }

    /// CPU time the dispatcher thread and its watchdog have used (`None`
    /// once they exited).
    pub fn cpu_time(&self) -> Option<Duration> {
        if self.core.is_dead() {
            return None;
        }
        let read = |clock: libc::clockid_t| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid out-pointer; a stale clock id fails
            // with EINVAL, which we report as None.
            let r = unsafe { libc::clock_gettime(clock, &mut ts) };
            (r == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
        };
        let d = read((*lock(&self.core.clock))?)?;
        let w = (*lock(&self.core.wclock))
            .and_then(read)
            .unwrap_or_default();
        Some(d + w)
    }

    /// Make the dispatcher thread panic, to test that its waiters survive.
    #[doc(hidden)]
    pub fn inject_crash(&self) {
        self.core.crash.store(true, Ordering::SeqCst);
        self.core.kick();
    }

    /// Keep the dispatcher off the CPU for `ms` each time it is woken from
    /// its idle sleep, to test that its waiters are served meanwhile.
    #[doc(hidden)]
    pub fn inject_wake_stall(&self, ms: u64) {
        self.core.stall_ms.store(ms, Ordering::SeqCst);
    }

    /// Wait until the dispatcher thread has exited (after a crash).
    #[doc(hidden)]
    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::SeqCst);
        self.core.kick();
        self.join();
    }
}

/// How often the watchdog looks at a polling dispatcher.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(1);

/// The watchdog: a normal-priority thread, allowed on every CPU, that does
/// the dispatcher's job when the dispatcher is polling but has not run for
/// a period (a `SCHED_IDLE` thread gets next to no CPU on a busy core). It
/// bounds how long a thread that went to sleep trusting the dispatcher can
/// be left waiting, without a timer on every sleep. It costs one wake-up per
/// period while the dispatcher polls, and nothing while the dispatcher
/// sleeps (it sleeps too) or is dead (it exits).
fn watchdog(core: &Core) {
    // Not pinned with whoever started the dispatcher: it must be able to
    // run where the dispatcher cannot.
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut set = rustix::thread::CpuSet::new();
    for c in 0..n.min(rustix::thread::CpuSet::MAX_CPU) {
        set.set(c);
    }
    let _ = rustix::thread::sched_setaffinity(None, &set);
    *lock(&core.wclock) = thread_clock();
    loop {
        let seq = core.awake.load();
        match core.mode.load(Ordering::SeqCst) {
            MODE_DEAD => return,
            MODE_SLEEPING => {
                // The dispatcher bumps `awake` when it leaves its idle
                // sleep or dies, so an idle core costs no wake-up here. A
                // FIFO dispatcher's short step-asides are SLEEPING too
                // without a bump: bounded for that policy only.
                let limit = (core.cfg.policy == Policy::Fifo).then_some(Duration::from_millis(100));
                core.awake.wait_private(seq, limit);
                continue;
            }
            _ => {}
        }
        std::thread::sleep(WATCHDOG_PERIOD);
        if core.heartbeat_age() > WATCHDOG_PERIOD {
            core.rescue();
        }
    }
}

fn thread_clock() -> Option<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self is always valid for the calling thread; id is a
    // valid out-pointer.
    let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    (r == 0).then_some(id)
}
