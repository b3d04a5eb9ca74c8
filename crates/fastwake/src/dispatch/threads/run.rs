//! The dispatcher thread's loop: drain registrations, pass over the
//! waiting sources, hand off, and under the idle policy hand the waiters
//! back to interrupt mode and sleep.

use super::Hub;
use super::hub::{MODE_POLLING, MODE_SLEEPING};
use super::idle::IdleClock;
use super::lock;
use crate::dispatch::SchedPolicy;
use crate::dispatch::slot::{HANDED, PAUSED, WAITING};
use crate::dispatch::watch::Watch;
use crate::sync::{Ordering, fence};
use std::time::{Duration, Instant};

/// Empty passes between clock reads for the idle threshold and heartbeat.
const PASSES_PER_CLOCK: u32 = 256;

impl Hub {
    /// The dispatcher thread's body, until stopped (or a panic).
    pub(super) fn run(&self) {
        let mut watch = Watch::new(
            self.cfg.capacity,
            self.cfg.summary,
            self.cfg.summary_above,
            // The woken thread reads the slot on this core only when the
            // dispatcher runs on the waiters' core.
            self.cfg.run_on.is_none(),
            self.notices.clone(),
            self.kernel.clone(),
        );
        if !self.cfg.kernel_list {
            watch.without_kernel_list();
        }
        let mut found = Vec::new();
        let mut last_busy = Instant::now();
        let mut idle = IdleClock::new(&self.cfg, last_busy);
        let mut empty: u32 = 0;
        let mut passes: u64 = 0;
        loop {
            if self.exit_requested() {
                break;
            }
            self.faults.crash_point();
            let handed = self.turn(&mut watch);
            passes += 1;
            if handed > 0 {
                match self.cfg.policy {
                    SchedPolicy::Yield => crate::dispatch::sched::yield_now(),
                    SchedPolicy::Fifo => self.step_aside(),
                    SchedPolicy::Idle | SchedPolicy::Normal => {}
                }
                empty = 0;
                let now = Instant::now();
                idle.busy(now);
                self.publish_idle(&idle);
                last_busy = now;
                self.beat(last_busy);
                continue;
            }
            std::hint::spin_loop();
            empty = empty.wrapping_add(1);
            if empty.is_multiple_of(PASSES_PER_CLOCK) {
                self.passes.store(passes, Ordering::Relaxed);
                *super::lock(&self.kernel_list) = watch.kernel_stats();
                self.beat(Instant::now());
                // Now and then the complete test, for closed sources, and
                // a step of the notices' safety net.
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
                self.safety_step(&watch, &mut found);
                if let Some(t) = idle.threshold()
                    && last_busy.elapsed() >= t
                {
                    let (now, handed) = self.idle_period(&mut watch, idle.resume_at());
                    if handed > 0 {
                        idle.busy(now);
                        last_busy = now;
                    } else if !idle.woke(now) {
                        // (A pre-wake's resume continues the stretch: the
                        // threshold counts from its start.)
                        last_busy = now;
                    }
                    self.publish_idle(&idle);
                    self.beat(now);
                }
            }
        }
        self.passes.store(passes, Ordering::Relaxed);
        // Notices still in the ring, so a late one is counted as late.
        watch.noticed_candidates(|_| 0, |_| {});
        *super::lock(&self.kernel_list) = watch.kernel_stats();
    }

    /// One turn of the loop: take in queued (un)registrations, then one
    /// pass over the waiting sources. Returns the hand-offs of the pass.
    /// Separate from `run` for the loom models, which cannot run the loop
    /// itself (it reads the clock).
    pub(in crate::dispatch) fn turn(&self, watch: &mut Watch) -> u32 {
        if self.pending_flag.load(Ordering::Relaxed) {
            self.drain_pending(watch);
        }
        let handed = self.pass(watch);
        if handed > 0 {
            self.handoffs.fetch_add(handed as u64, Ordering::Relaxed);
        }
        handed
    }

    fn drain_pending(&self, watch: &mut Watch) {
        self.pending_flag.store(false, Ordering::SeqCst);
        let batch = std::mem::take(&mut *lock(&self.pending));
        let mut freed = Vec::new();
        for (i, p) in batch {
            match p {
                Some(p) => {
                    watch.insert(i, p);
                    self.mark_noticed(i, watch.noticed(i));
                    // The attach may have missed a completion: peek once.
                    if watch.ready_full(i) && self.slots[i].hand(HANDED) {
                        self.handoffs.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    watch.remove(i);
                    self.mark_noticed(i, false);
                    self.slots[i].reset();
                    freed.push(i);
                }
            }
        }
        lock(&self.free).extend(freed);
    }

    /// Tell relays whether slot `i`'s source is served by notices.
    fn mark_noticed(&self, i: usize, on: bool) {
        let (w, b) = (self.noticed.get(i / 64), 1u64 << (i % 64));
        if on {
            w.fetch_or(b, Ordering::Relaxed);
        } else {
            w.fetch_and(!b, Ordering::Relaxed);
        }
    }

    /// One step of the notices' safety net (see `Watch::safety_step`):
    /// hand off, and count, waits whose noticed source is ready although
    /// no notice came.
    fn safety_step(&self, watch: &Watch, found: &mut Vec<usize>) {
        watch.safety_step(|w| self.waitset.word(w), found);
        if found.is_empty() {
            return;
        }
        // A notice may be on its way: serve those first.
        let handed = self.pass(watch);
        self.handoffs.fetch_add(handed as u64, Ordering::Relaxed);
        for i in found.drain(..) {
            let s = &self.slots[i];
            if s.state() == WAITING && watch.ready_full(i) && s.hand(HANDED) {
                self.handoffs.fetch_add(1, Ordering::Relaxed);
                self.scan_found.fetch_add(1, Ordering::Relaxed);
                watch.mark_scanned(i);
            }
        }
    }

    /// One pass over the waiting sources; returns hand-offs made.
    #[inline]
    fn pass(&self, watch: &Watch) -> u32 {
        let mut handed = 0;
        // Shared queues first: routing what they hold pushes the notices.
        watch.pump();
        // What producers said is ready, then whatever is peeked.
        watch.noticed_candidates(
            |w| self.waitset.word(w),
            |i| {
                let s = &self.slots[i];
                if s.state() == WAITING && watch.ready_noticed(i) && s.hand(HANDED) {
                    handed += 1;
                    self.notice_handoffs.fetch_add(1, Ordering::Relaxed);
                }
            },
        );
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

    /// One idle period: sleep until kicked. With a pre-wake's `resume`, a
    /// kick before it that is not a paused waiter back with its completion
    /// (a thread announcing a new wait, a registration) does not end the
    /// period: that wait is served if ready, else paused until `resume`
    /// too, and the sleep goes on. Returns when it woke and the hand-offs
    /// made meanwhile.
    fn idle_period(&self, watch: &mut Watch, resume: Option<Instant>) -> (Instant, u32) {
        let returned = self.returned.load(Ordering::Relaxed);
        loop {
            self.sleep_idle(resume);
            let now = Instant::now();
            if resume.is_none_or(|r| now >= r)
                || self.exit_requested()
                || self.returned.load(Ordering::Relaxed) != returned
            {
                return (now, 0);
            }
            let handed = self.turn(watch);
            if handed > 0 {
                return (now, handed);
            }
            self.beat(now);
        }
    }

    /// Idle: hand every waiting thread back to interrupt mode and sleep
    /// until one of them (or a new wait) kicks us. With `resume` (a
    /// pre-wake, `idle` module), the paused threads come back to us then.
    pub(in crate::dispatch) fn sleep_idle(&self, resume: Option<Instant>) {
        let seq = self.kick.load();
        let ns = resume.map_or(0, |r| {
            r.saturating_duration_since(self.epoch).as_nanos().max(1) as u64
        });
        self.resume_at.store(ns, Ordering::Release);
        self.mode.store(MODE_SLEEPING, Ordering::SeqCst);
        // Dekker with a waiter's announce (`Slot::wait_hand_off`: WAITING
        // and its bit, a fence, then `kick` reads the mode): either the
        // scan below sees its bit and hands the wait back, or it sees
        // SLEEPING and kicks us awake. The SeqCst store and loads alone
        // order this in the C++ model, but loom models SeqCst accesses as
        // acquire/release and finds a lost wake-up without the fence (the
        // loom model `channel_publish_meets_dispatch_wait` checks it). It
        // costs nothing here: once per idle period.
        fence(Ordering::SeqCst);
        self.idle_sleeps.fetch_add(1, Ordering::Relaxed);
        let paused = self
            .waitset
            .marked()
            .filter(|&i| self.slots[i].hand(PAUSED))
            .count();
        self.paused.fetch_add(paused as u64, Ordering::Relaxed);
        while self.mode.load(Ordering::SeqCst) == MODE_SLEEPING
            && !self.exit_requested()
            && !self.pending_flag.load(Ordering::SeqCst)
        {
            // Stop requests and crash injection kick. No timer: a 1 s
            // safety net here woke the dispatcher every second while the
            // program computed (a switch the program pays on a busy core);
            // the watchdog keeps that net, and only while a thread waits.
            self.kick.wait_private(seq, None);
        }
        self.faults.wake_stall();
        let _ = self.mode.compare_exchange(
            MODE_SLEEPING,
            MODE_POLLING,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.awake.bump_and_wake_private();
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

    /// Make the threshold visible in [`crate::dispatch::DispatchStats`] (a store only when
    /// it changed: the line is read by other threads).
    fn publish_idle(&self, idle: &IdleClock) {
        let ns = idle.threshold().map_or(u64::MAX, |d| d.as_nanos() as u64);
        if self.idle_ns.load(Ordering::Relaxed) != ns {
            self.idle_ns.store(ns, Ordering::Relaxed);
        }
        if let Some(s) = idle.stats() {
            let v = [
                s.prewakes,
                s.prewake_early,
                s.prewake_caught,
                s.prewake_late,
                s.prewake_pauses,
                s.margin_ns,
            ];
            // In this order, released: `Hub::stats` reads them backwards,
            // acquiring, so the arrivals it reports never outnumber the
            // pre-wakes it reports.
            for (c, v) in self.prewakes.iter().zip(v) {
                if c.load(Ordering::Relaxed) != v {
                    c.store(v, Ordering::Release);
                }
            }
        }
    }
}
