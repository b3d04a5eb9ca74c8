//! [`Hub`]: the state one CPU's dispatch-mode waiters, its dispatcher
//! thread and its watchdog share, and the calls waiters make on it
//! (register, kick, the staleness check).

use super::faults::Faults;
use super::{Config, lock, write};
use crate::dispatch::kernel_list::Shared;
use crate::dispatch::slot::{Slot, WaitSet};
use crate::dispatch::{DispatchStats, KernelListStats, State};
use crate::source::Peek;
use crate::source::notice::NoticeRing;
use crate::sync::{AtomicU32, AtomicU64, FutexWord, LineWords, Ordering};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A registration (`Some`) or unregistration (`None`) of slot `.0`, queued
/// for the dispatcher thread, which alone owns the watched set.
pub(super) type Change = (usize, Option<Arc<dyn Peek>>);

pub(super) const MODE_POLLING: u32 = 0;
pub(super) const MODE_SLEEPING: u32 = 1;
pub(super) const MODE_DEAD: u32 = 2;

/// A polling dispatcher whose heartbeat is older than this is not getting
/// the CPU (with `SCHED_IDLE`, any busy thread on the core starves it), so
/// waits go to interrupt mode rather than rely on it.
const STALE: Duration = Duration::from_micros(500);

/// What one CPU's dispatch-mode waiters, its dispatcher thread and its
/// watchdog share: the slots, the waiting set, the dispatcher's mode and
/// counters.
///
/// Line aligned: the dispatcher writes its counters and heartbeat on every
/// pass, and the `Arc` must not share a line with other heap objects.
#[repr(align(64))]
pub(crate) struct Hub {
    pub(super) cfg: Config,
    pub(crate) slots: Box<[Slot]>,
    pub(crate) waitset: WaitSet,
    pub(super) mode: AtomicU32,
    pub(super) kick: FutexWord,
    pub(super) pending: Mutex<Vec<Change>>,
    pub(super) pending_flag: AtomicBool,
    pub(super) free: Mutex<Vec<usize>>,
    /// Non-zero once the dispatcher thread is asked to exit. A `sync`
    /// atomic, so the loom models see the exit handshake.
    pub(super) stop: AtomicU32,
    pub(super) faults: Faults,
    /// The idle threshold in force, ns (u64::MAX: never), for stats.
    pub(super) idle_ns: AtomicU64,
    pub(super) handoffs: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) idle_sleeps: AtomicU64,
    pub(super) paused: AtomicU64,
    pub(super) registered: AtomicU64,
    /// The dispatcher thread's CPU clock.
    pub(super) clock: Mutex<Option<libc::clockid_t>>,
    /// The watchdog thread's CPU clock.
    pub(super) wclock: Mutex<Option<libc::clockid_t>>,
    pub(super) epoch: Instant,
    /// µs since `epoch` at the dispatcher's last clock read.
    pub(super) heartbeat: AtomicU64,
    /// Registered handles, for the watchdog and relaying waiters (the
    /// dispatcher keeps its own copies in its `Watch`). A read-write lock:
    /// a relaying thread preempted while reading must not block the others.
    pub(super) handles: RwLock<Vec<Option<Arc<dyn Peek>>>>,
    /// Bumped when the dispatcher leaves its idle sleep or dies, or when
    /// a wait starts while the watchdog is parked: the watchdog sleeps on
    /// it meanwhile.
    pub(super) awake: FutexWord,
    /// Non-zero while the watchdog is parked because no thread waits
    /// (`watchdog::park`): the next announced wait wakes it (`kick`).
    pub(super) wd_parked: AtomicU32,
    pub(super) rescued: AtomicU64,
    pub(super) relayed: AtomicU64,
    pub(super) fair_yields: AtomicU64,
    /// `crate::fork::generation` when made: in a forked child, which has
    /// none of its threads, the hub is dead.
    generation: u32,
    /// Where producers push ready notices for this core's waiters
    /// ([`Config::notices`]); popped by the dispatcher and by relays.
    pub(crate) notices: Option<Arc<NoticeRing>>,
    /// Slots whose source the dispatcher serves through notices, one bit
    /// each, so that relays leave them out of their scan.
    pub(super) noticed: LineWords,
    pub(super) notice_handoffs: AtomicU64,
    pub(super) scan_found: AtomicU64,
    /// The dispatcher's kernel ready list counters, published with
    /// `passes`.
    pub(super) kernel_list: Mutex<KernelListStats>,
    /// What relays share of the dispatcher's kernel ready list: its epoll
    /// set, so a relay makes one `epoll_wait` for the core's listed
    /// sockets instead of one `poll` each.
    pub(crate) kernel: Arc<Shared>,
    /// The dispatcher's pre-wake (`idle` module): ns since `epoch` at which
    /// the waiters it pauses now come back to it; 0: none. Written before
    /// it pauses them (the pause's CAS publishes it).
    pub(super) resume_at: AtomicU64,
    /// Bumped by a paused waiter that got its completion in interrupt
    /// mode, before it kicks the dispatcher: that kick ends a pre-wake's
    /// sleep as early, where a new wait's does not.
    pub(super) returned: AtomicU64,
    /// The idle learner's pre-wake counters: planned, early, caught, late,
    /// pauses, and the margin in force (ns).
    pub(super) prewakes: [AtomicU64; 6],
}

impl Hub {
    /// A polling hub for `cfg` with every slot free. The caller checked
    /// `cfg.capacity`.
    pub(crate) fn new(cfg: Config) -> Hub {
        Hub {
            cfg,
            slots: (0..cfg.capacity).map(|_| Slot::default()).collect(),
            waitset: WaitSet::new(cfg.capacity),
            mode: AtomicU32::new(MODE_POLLING),
            kick: FutexWord::new(0),
            pending: Mutex::new(Vec::new()),
            pending_flag: AtomicBool::new(false),
            free: Mutex::new((0..cfg.capacity).rev().collect()),
            stop: AtomicU32::new(0),
            faults: Faults::default(),
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
            wd_parked: AtomicU32::new(0),
            rescued: AtomicU64::new(0),
            relayed: AtomicU64::new(0),
            fair_yields: AtomicU64::new(0),
            generation: crate::fork::generation(),
            notices: cfg.notices.then(|| NoticeRing::new(cfg.capacity)),
            noticed: LineWords::new(cfg.capacity.div_ceil(64), || AtomicU64::new(0)),
            notice_handoffs: AtomicU64::new(0),
            scan_found: AtomicU64::new(0),
            kernel_list: Mutex::new(KernelListStats::default()),
            kernel: Arc::new(Shared::new(cfg.capacity)),
            resume_at: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            prewakes: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

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

    /// Dead: its thread exited, or this is a forked child, where the
    /// thread never was (its waits then fall back or find the child's own
    /// dispatcher; nothing here touches the hub's locks, which the
    /// parent's threads may have held at the fork).
    pub(crate) fn is_dead(&self) -> bool {
        self.mode.load(Ordering::SeqCst) == MODE_DEAD || self.made_before_fork()
    }

    /// Made in the parent of this forked child.
    pub(super) fn made_before_fork(&self) -> bool {
        self.generation != crate::fork::current()
    }

    /// Register a waiter's source; `None` when dead or full.
    pub(crate) fn register(&self, peek: Arc<dyn Peek>) -> Option<usize> {
        if self.is_dead() {
            return None;
        }
        let Some(i) = lock(&self.free).pop() else {
            // Slots of exited threads come back when the dispatcher drains
            // its queue; a sleeping one drains only when kicked (it has no
            // timer), so a full hub with frees queued kicks it.
            if self.pending_flag.load(Ordering::SeqCst) {
                self.kick();
            }
            return None;
        };
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

    /// Ask the dispatcher thread to exit (it then dies: see `die`).
    pub(in crate::dispatch) fn request_exit(&self) {
        self.stop.store(1, Ordering::Release);
        // Rung whatever the mode, not through `kick` (which rings only a
        // dispatcher it sees SLEEPING): a dispatcher about to sleep reads
        // the bell before it checks `stop`, so it sees the flag or is woken
        // by this ring, with no store→load race on the mode to lose.
        self.kick.bump_and_wake_private();
    }

    /// Has [`Hub::request_exit`] been called?
    pub(in crate::dispatch) fn exit_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed) != 0
    }

    /// Wake the dispatcher if it sleeps (idle policy), and the watchdog if
    /// it is parked. A waiter calls this after announcing its wait and a
    /// `SeqCst` fence: that is one side of both Dekker pairs (with
    /// `sleep_idle` and with `watchdog::park`).
    pub(crate) fn kick(&self) {
        let woke = self.mode.load(Ordering::SeqCst) == MODE_SLEEPING
            && self
                .mode
                .compare_exchange(
                    MODE_SLEEPING,
                    MODE_POLLING,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok();
        if woke {
            // Its heartbeat is as old as its sleep: without a fresh one,
            // the next wait (this thread's own, a few µs on) would judge a
            // dispatcher that has not had a chance to run yet starved and
            // fall back to interrupt mode (after every idle period longer
            // than `STALE`: half the waits of a 1k/s stream, measured).
            self.beat(Instant::now());
            self.kick.bump_and_wake_private();
        }
        // A plain load first: the swap (a locked RMW on a shared line) only
        // when the watchdog is parked, i.e. after a few ms without waits.
        let parked = self.wd_parked.load(Ordering::SeqCst) != 0
            && self.wd_parked.swap(0, Ordering::SeqCst) != 0;
        if woke || parked {
            // The watchdog sleeps while the dispatcher does, and while no
            // thread waits; wake it here, not when the dispatcher gets
            // going: a SCHED_IDLE dispatcher next to a busy thread may not
            // run for hundreds of ms, and the waits that kicked it must be
            // rescued meanwhile (measured: a 1k/s stream next to a CPU hog
            // waited 434 ms at p50).
            self.awake.bump_and_wake_private();
        }
    }

    /// Does this dispatcher take ready notices? Then a waiter asks its
    /// source for one as it announces its wait.
    pub(crate) fn takes_notices(&self) -> bool {
        self.notices.is_some()
    }

    /// When a waiter the dispatcher paused now should come back to it
    /// (the dispatcher's pre-wake, `idle` module); `None`: when its
    /// completion wakes it.
    pub(crate) fn resume_at(&self) -> Option<Instant> {
        match self.resume_at.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }

    /// A paused waiter got its completion (in interrupt mode): kick the
    /// dispatcher so polling resumes.
    pub(crate) fn returned(&self) {
        self.returned.fetch_add(1, Ordering::Relaxed);
        self.kick();
    }

    /// The idle threshold in force now (`None`: never sleeps).
    pub(crate) fn idle_threshold(&self) -> Option<Duration> {
        match self.idle_ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub(crate) fn stats(&self) -> DispatchStats {
        // Backwards from the order `publish_idle` releases them in: an
        // arrival read here was published with (or after) its pre-wake,
        // whose count is then read at least as new.
        let [margin_ns, pauses, late, caught, early, prewakes] =
            std::array::from_fn(|i| self.prewakes[5 - i].load(Ordering::Acquire));
        DispatchStats {
            handoffs: self.handoffs.load(Ordering::Relaxed),
            rescued: self.rescued.load(Ordering::Relaxed),
            relayed: self.relayed.load(Ordering::Relaxed),
            fair_yields: self.fair_yields.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
            notices: self.notice_handoffs.load(Ordering::Relaxed),
            scan_found: self.scan_found.load(Ordering::Relaxed),
            late_notices: self.notices.as_ref().map_or(0, |r| r.late()),
            idle_sleeps: self.idle_sleeps.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            registered: self.registered.load(Ordering::Relaxed),
            // The relays' counters live: the rest is published by the
            // dispatcher now and then.
            kernel_list: self.kernel.with_relays(*lock(&self.kernel_list)),
            idle_after: self.idle_threshold(),
            prewakes,
            prewake_early: early,
            prewake_caught: caught,
            prewake_late: late,
            prewake_pauses: pauses,
            margin_ns,
            state: self.state(),
        }
    }

    /// Mark dead and release every waiter.
    pub(in crate::dispatch) fn die(&self) {
        self.mode.store(MODE_DEAD, Ordering::SeqCst);
        for s in self.slots.iter() {
            s.kill();
        }
        self.awake.bump_and_wake_private();
    }
}
