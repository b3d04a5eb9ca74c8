//! Stackful tasks on one core with a user-level hand-off (FastWake
//! approach 1 with the context switch done in user space).
//!
//! A [`Runtime`] runs on the calling thread. Each task is a coroutine with
//! its own stack (corosensei); a task waits on a source with
//! [`TaskCtx::wait`], the same call shape as [`crate::Waiter::wait`]. The
//! runtime is the dispatcher: it peeks the sources of all waiting tasks
//! (through their [`Peek`] handles and the readiness summary) and switches
//! *directly* into the task whose source is ready; that task takes its
//! completion, runs, and switches back when it waits again. A switch costs
//! a few ns, against ~1 µs for the cheapest kernel wake-up.
//!
//! A task whose source has no [`Peek`] handle is resumed on every pass and
//! peeks its own source (two switches per pass).
//!
//! Ready notices: when a task waits on a source that offers them (the
//! channel), the runtime asks the source's producer for a notice of the
//! next completion on the task's behalf ([`Peek::arm_notice`]), and a pass
//! pops the runtime's [`crate::source::notice::NoticeRing`] instead of
//! peeking such sources: its cost does not grow with the number of idle
//! ones. A safety net peeks a few of them now and then and counts what it
//! finds ([`TaskStats::scan_found`], expected 0).
//!
//! Idle policy: after `idle_after` without any task resumed, the runtime
//! attaches every source to its readiness summary (noticed ones too, for
//! the idle period), arms the summary (one store covers every summarised
//! source) and sleeps on it; the first producer that raises a flag wakes
//! it. If some source is not summarised (no summary support, e.g. a
//! producer in another process), nothing could wake it, so it naps in
//! steps of `idle_nap` instead, peeking between naps: still ~0 CPU, at the
//! cost of up to one nap of extra latency for the first completion after
//! an idle period.

use super::watch::Watch;
use super::{DEFAULT_IDLE_AFTER, State};
use crate::source::notice::NoticeRing;
use crate::source::{Peek, Source};
use crate::{Fail, Result};
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Passes without work between clock reads for the idle threshold.
const PASSES_PER_CLOCK: u32 = 256;

/// How a task runtime runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskConfig {
    /// Sleep after this long without any task resumed; `None` = never.
    pub idle_after: Option<Duration>,
    /// Nap length when some source cannot wake a sleeping runtime.
    pub idle_nap: Duration,
    /// Stack size of each task.
    pub stack_size: usize,
    /// Most tasks.
    pub capacity: usize,
    /// Use readiness summaries where sources support them, once more than
    /// `summary_above` tasks wait on peekable sources.
    pub summary: bool,
    /// See `summary`.
    pub summary_above: usize,
    /// Prefetch the next completion of a ready source before switching
    /// into its task (see [`crate::source::NextAt`]); off only to measure
    /// what it saves.
    pub prefetch: bool,
    /// Serve sources that offer ready notices through them instead of
    /// peeking them every pass; off only to measure what they save.
    pub notices: bool,
    /// Serve sources whose readiness only the kernel knows (sockets) from
    /// one epoll set of the runtime's: one `epoll_wait` a pass instead of
    /// one `poll` per waiting socket; off only to measure what that saves.
    pub kernel_list: bool,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            idle_after: Some(DEFAULT_IDLE_AFTER),
            idle_nap: Duration::from_millis(1),
            stack_size: 128 * 1024,
            capacity: 4096,
            summary: true,
            summary_above: super::watch::SUMMARY_ABOVE,
            prefetch: true,
            notices: true,
            kernel_list: true,
        }
    }
}

/// What a task tells the runtime when it switches back.
enum Ask {
    /// Waiting on a source; `Some` registers a new peek handle.
    Wait(Option<Arc<dyn Peek>>),
    /// Waiting on a source without a peek handle: resume every pass.
    Poll,
    /// Runnable: resume on the next pass.
    Yield,
}

type Co = Coroutine<(), Ask, Result<()>, DefaultStack>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TState {
    Runnable,
    Waiting,
    Polling,
    Done,
}

struct Task {
    co: Co,
    state: TState,
}

/// Counters of a [`Runtime`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TaskStats {
    /// Switches into a task because its source was ready.
    pub handoffs: u64,
    /// Switches into polling or yielding tasks.
    pub resumes: u64,
    /// Passes over the sources.
    pub passes: u64,
    /// Times the runtime went to sleep (idle policy).
    pub idle_sleeps: u64,
    /// Tasks that returned an error or panicked.
    pub failed: u64,
    /// Hand-offs found through a ready notice.
    pub notices: u64,
    /// Waiting tasks the safety net found ready although no notice named
    /// them yet: each is a lost or a late notice (expected 0; they are
    /// handed off anyway, up to a safety-net round late).
    pub scan_found: u64,
    /// Of `scan_found`, notices that came after all (their producer was
    /// held up between its publish and its notice): `scan_found -
    /// late_notices` were lost.
    pub late_notices: u64,
    /// The kernel ready list's counters ([`TaskConfig::kernel_list`]).
    pub kernel_list: super::KernelListStats,
}

/// The handle a task gets to wait and yield.
pub struct TaskCtx<'a> {
    y: &'a Yielder<(), Ask>,
    key: Cell<usize>,
}

impl TaskCtx<'_> {
    /// Wait for one completion of `src`, switching to other tasks
    /// meanwhile. Errors as [`Source::try_take`] does.
    pub fn wait<S: Source + ?Sized>(&self, src: &mut S) -> Result<S::Completion> {
        loop {
            if let Some(c) = src.try_take()? {
                return Ok(c);
            }
            // Same identity rule as dispatch-mode threads: the handle's
            // address, kept unique by the runtime holding the handle.
            let ask = match src.peek() {
                // The handle's address is its identity: the runtime holds
                // the handle it registered, so no other source's handle
                // can share the address meanwhile.
                Some(p) if self.key.get() == Arc::as_ptr(p).cast::<()>() as usize => {
                    Ask::Wait(None)
                }
                Some(p) => {
                    self.key.set(Arc::as_ptr(p).cast::<()>() as usize);
                    Ask::Wait(Some(p.clone()))
                }
                None => {
                    self.key.set(0);
                    Ask::Poll
                }
            };
            self.y.suspend(ask);
        }
    }

    /// Let the other tasks run; come back on the next pass.
    pub fn yield_now(&self) {
        self.y.suspend(Ask::Yield);
    }
}

/// A per-core runtime of stackful tasks; see the [module docs](self).
pub struct Runtime {
    cfg: TaskConfig,
    tasks: Vec<Task>,
    watch: Watch,
    /// Waiting tasks, one bit each (the interest mask for plain sources).
    waiting: Vec<u64>,
    ready: Vec<usize>,
    stats: TaskStats,
    errors: Vec<(usize, Fail)>,
    state: StateCell,
    /// Tasks not done.
    live: usize,
    /// Tasks runnable or polling (resumed every pass).
    active: usize,
    /// Where the next plain scan starts (round-robin).
    cursor: usize,
    /// The safety net's finds, reused.
    found: Vec<usize>,
}

/// A runtime's state, readable from other threads (the runtime itself runs
/// on its caller's thread, so only another thread can see it sleep).
#[derive(Clone, Debug, Default)]
pub struct StateCell(Arc<std::sync::atomic::AtomicU8>);

impl StateCell {
    /// Polling or sleeping.
    pub fn get(&self) -> State {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => State::Polling,
            _ => State::Sleeping,
        }
    }

    fn set(&self, s: State) {
        self.0.store(
            (s != State::Polling) as u8,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("tasks", &self.tasks.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Runtime {
    /// A runtime with no tasks.
    pub fn new(cfg: TaskConfig) -> Result<Runtime> {
        if cfg.capacity == 0 || cfg.capacity > 1 << 20 {
            return Err(Fail::invalid("task capacity must be in 1..=1048576"));
        }
        if cfg.stack_size < 16 * 1024 {
            return Err(Fail::invalid("task stack must be at least 16 KiB"));
        }
        let mut watch = Watch::new(
            cfg.capacity,
            cfg.summary,
            cfg.summary_above,
            cfg.prefetch,
            cfg.notices.then(|| NoticeRing::new(cfg.capacity)),
            // Nobody relays for a runtime: the shared part is its own.
            Arc::new(super::kernel_list::Shared::new(cfg.capacity)),
        );
        if !cfg.kernel_list {
            watch.without_kernel_list();
        }
        Ok(Runtime {
            cfg,
            tasks: Vec::new(),
            watch,
            waiting: vec![0; cfg.capacity.div_ceil(64)],
            ready: Vec::new(),
            stats: TaskStats::default(),
            errors: Vec::new(),
            state: StateCell::default(),
            live: 0,
            active: 0,
            cursor: 0,
            found: Vec::new(),
        })
    }

    /// Add a task; it first runs when [`Runtime::run`] does. Returns its
    /// index.
    pub fn spawn<F>(&mut self, f: F) -> Result<usize>
    where
        F: FnOnce(&TaskCtx<'_>) -> Result<()> + 'static,
    {
        if self.tasks.len() >= self.cfg.capacity {
            return Err(Fail::invalid(format!(
                "runtime is full ({} tasks)",
                self.cfg.capacity
            )));
        }
        let stack = DefaultStack::new(self.cfg.stack_size)
            .map_err(|e| Fail::new(libc::ENOMEM, format!("task stack: {e}")))?;
        let co = Coroutine::with_stack(stack, move |y: &Yielder<(), Ask>, ()| {
            let ctx = TaskCtx {
                y,
                key: Cell::new(0),
            };
            f(&ctx)
        });
        self.tasks.push(Task {
            co,
            state: TState::Runnable,
        });
        self.live += 1;
        self.active += 1;
        Ok(self.tasks.len() - 1)
    }

    /// Counters so far.
    pub fn stats(&self) -> TaskStats {
        TaskStats {
            late_notices: self.watch.late_notices(),
            kernel_list: self.watch.kernel_stats(),
            ..self.stats
        }
    }

    /// A handle to watch the runtime's state from another thread.
    pub fn state(&self) -> StateCell {
        self.state.clone()
    }

    /// Errors of tasks that failed (index, error), taken.
    pub fn take_errors(&mut self) -> Vec<(usize, Fail)> {
        std::mem::take(&mut self.errors)
    }

    /// Move task `i` to `to`, keeping the wait set and counters in step.
    fn set_state(&mut self, i: usize, to: TState) {
        let from = std::mem::replace(&mut self.tasks[i].state, to);
        let act = |s: TState| matches!(s, TState::Runnable | TState::Polling);
        if act(from) {
            self.active -= 1;
        }
        if act(to) {
            self.active += 1;
        }
        if to == TState::Done && from != TState::Done {
            self.live -= 1;
        }
        if to == TState::Waiting {
            self.waiting[i / 64] |= 1 << (i % 64);
        } else {
            self.waiting[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Switch into task `i` and handle what it asks on the way back.
    fn resume(&mut self, i: usize) {
        let t = &mut self.tasks[i];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.co.resume(())));
        match r {
            Ok(CoroutineResult::Yield(Ask::Wait(p))) => {
                self.set_state(i, TState::Waiting);
                let mut ready = false;
                if let Some(p) = p {
                    self.watch.insert(i, p);
                    // The attach may have missed a completion: peek once.
                    ready = self.watch.ready(i);
                }
                // The task's wait starts here, so here is where its
                // producer is asked for a notice (unless the source is hot:
                // peeked every pass); the arm re-checks.
                if !ready && self.watch.noticed(i) && !self.watch.hot(i) {
                    ready = self.watch.arm_notice(i);
                }
                if ready {
                    self.ready.push(i);
                }
            }
            Ok(CoroutineResult::Yield(Ask::Poll)) => {
                self.set_state(i, TState::Polling);
                self.watch.remove(i);
            }
            Ok(CoroutineResult::Yield(Ask::Yield)) => {
                self.set_state(i, TState::Runnable);
            }
            Ok(CoroutineResult::Return(r)) => {
                self.set_state(i, TState::Done);
                self.watch.remove(i);
                if let Err(e) = r {
                    self.stats.failed += 1;
                    self.errors.push((i, e));
                }
            }
            Err(_) => {
                self.set_state(i, TState::Done);
                self.watch.remove(i);
                self.stats.failed += 1;
                self.errors.push((i, Fail::new(libc::EIO, "task panicked")));
            }
        }
    }

    /// Push the waiting tasks whose noticed sources are ready onto
    /// `ready`: the notices popped.
    #[inline]
    fn collect_noticed(&mut self) {
        // Shared queues first: routing what they hold pushes the notices.
        self.watch.pump();
        let waiting = &self.waiting;
        let ready = &mut self.ready;
        let watch = &self.watch;
        let stats = &mut self.stats;
        watch.noticed_candidates(
            |w| waiting[w],
            |i| {
                if waiting[i / 64] & (1 << (i % 64)) != 0 && watch.ready_noticed(i) {
                    stats.notices += 1;
                    ready.push(i);
                }
            },
        );
    }

    /// Task `i`'s noticed source was found ready: keep it hot (peeked,
    /// no notices) while it is busy, and arm the notice of the entry that
    /// cools down to make room.
    fn promote(&mut self, i: usize) {
        if let Some(j) = self.watch.promote(i) {
            self.arm_cooled(j);
        }
    }

    /// Entry `j` is no longer peeked every pass: if its task waits, ask
    /// its producer for a notice (and take it now if the arm finds it
    /// ready).
    fn arm_cooled(&mut self, j: usize) {
        if self.tasks[j].state == TState::Waiting && self.watch.arm_notice(j) {
            self.ready.push(j);
        }
    }

    /// One step of the safety net (see `Watch::safety_step`): waiting
    /// tasks whose noticed source is ready although no notice came.
    fn safety_step(&mut self) {
        let mut found = std::mem::take(&mut self.found);
        self.watch.safety_step(|w| self.waiting[w], &mut found);
        if !found.is_empty() {
            // A notice may be on its way: take those first.
            self.collect_noticed();
            for &i in &found {
                if self.tasks[i].state == TState::Waiting && !self.ready.contains(&i) {
                    self.stats.scan_found += 1;
                    self.watch.mark_scanned(i);
                    self.ready.push(i);
                }
            }
            found.clear();
        }
        self.found = found;
    }

    /// Push the waiting tasks whose plain or summarised sources are ready
    /// onto `ready`.
    #[inline]
    /// `full`: use every handle's complete test (sees closed sources too),
    /// not just the fast counters.
    fn collect_ready(&mut self, full: bool) {
        let waiting = &self.waiting;
        let ready = &mut self.ready;
        let watch = &self.watch;
        if full {
            watch.slow_pass(|w| waiting[w], |i| ready.push(i));
            return;
        }
        watch.candidates(
            |w| waiting[w],
            |i| {
                if waiting[i / 64] & (1 << (i % 64)) != 0 && watch.ready(i) {
                    ready.push(i);
                }
            },
        );
    }

    /// Run until every task has returned. Task failures do not stop the
    /// others; see [`Runtime::take_errors`].
    pub fn run(&mut self) -> Result<TaskStats> {
        let mut last_busy = Instant::now();
        let mut empty: u32 = 0;
        let mut worked_since_clock = false;
        while self.live > 0 {
            let mut worked = false;
            // Runnable and polling tasks first.
            if self.active > 0 {
                for i in 0..self.tasks.len() {
                    if matches!(self.tasks[i].state, TState::Runnable | TState::Polling) {
                        self.stats.resumes += 1;
                        self.resume(i);
                        worked = true;
                    }
                }
            }
            // The dispatcher pass: find ready sources, switch into their
            // tasks directly. Notices first (what producers said is ready),
            // then whatever is peeked.
            self.stats.passes += 1;
            self.collect_noticed();
            if self.watch.plain_only() {
                // Few plain sources: switch into each ready one as soon as
                // it is found, not after peeking the rest, round-robin
                // from the last one served, for one round of them: when
                // they are busy, the pass's fixed costs (the notices, the
                // loop) are paid once a round instead of once a hand-off
                // (10 % of the throughput load at 16 connections), and a
                // noticed source still waits at most one round.
                // (`waiting` is the scan's interest mask: `i` waits.)
                let mut round = self.watch.plain_count();
                while round > 0
                    && let Some(i) = self.watch.next_plain_ready(&self.waiting, self.cursor)
                {
                    round -= 1;
                    self.cursor = i + 1;
                    if self.tasks[i].state == TState::Waiting {
                        self.stats.handoffs += 1;
                        self.promote(i);
                        self.resume(i);
                        worked = true;
                    }
                }
            } else {
                self.collect_ready(false);
            }
            while let Some(i) = self.ready.pop() {
                if self.tasks[i].state == TState::Waiting {
                    self.stats.handoffs += 1;
                    self.promote(i);
                    self.resume(i);
                    worked = true;
                }
            }
            if worked {
                // No clock read here: it would sit on the hot path.
                empty = 0;
                worked_since_clock = true;
                continue;
            }
            // No pause here: a pass already spaces the peeks, and a pause
            // (up to ~40 ns) would add to every hand-off.

            empty = empty.wrapping_add(1);
            if empty.is_multiple_of(PASSES_PER_CLOCK) {
                // Now and then the complete test, for closed sources, and
                // a step of the notices' safety net.
                self.collect_ready(true);
                self.safety_step();
                if let Some(t) = self.cfg.idle_after {
                    let now = Instant::now();
                    if std::mem::take(&mut worked_since_clock) {
                        last_busy = now;
                    } else if now - last_busy >= t && self.live > 0 && self.ready.is_empty() {
                        self.sleep_idle();
                        last_busy = Instant::now();
                    }
                }
            }
        }
        // Notices still in the ring: a late one (its wait served by the
        // safety net) is counted as late here, not left looking lost.
        self.collect_noticed();
        self.ready.clear();
        Ok(self.stats())
    }

    /// Idle: sleep on the summary if every waiting source is summarised,
    /// else nap. Returns when something may be ready.
    fn sleep_idle(&mut self) {
        // Tasks that poll their own sources need passes: no sleep.
        if self.tasks.iter().any(|t| t.state == TState::Polling) {
            return;
        }
        self.stats.idle_sleeps += 1;
        self.state.set(State::Sleeping);
        let mut cooled = Vec::new();
        let all = self.watch.arm_all(&mut cooled);
        for j in cooled {
            self.arm_cooled(j);
        }
        let summary = self.watch.summary().cloned();
        loop {
            let token = match &summary {
                Some(s) if all => Some(s.arm()),
                _ => None,
            };
            // The re-check after arming: collect what is ready now. For
            // noticed sources that is the ring: their tasks asked for
            // notices when they began to wait, so a completion since then
            // is in the ring (pushed before the producer raises the flag
            // that rings the summary).
            self.collect_noticed();
            self.collect_ready(true);
            if !self.ready.is_empty() {
                if let Some(s) = &summary {
                    s.disarm();
                }
                break;
            }
            match (&summary, token) {
                (Some(s), Some(tok)) => {
                    s.sleep(tok, None);
                    s.disarm();
                }
                _ => std::thread::sleep(self.cfg.idle_nap),
            }
        }
        self.watch.unarm();
        self.state.set(State::Polling);
    }
}
