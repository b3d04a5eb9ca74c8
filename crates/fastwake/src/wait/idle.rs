//! The idle rule for programs that busy-poll: when a thread's polls have
//! all come back empty for long enough, its next empty poll becomes a
//! wait (the preload shim's `FASTWAKE_POLLERS=sleep`).
//!
//! A program that never calls a wait (perftest's default `ib_send_lat`, a
//! DPDK-style loop, sockperf's server with `--timeout 0`) holds a whole
//! core through every idle gap. The shim sees its empty polls; this rule
//! decides, from nothing but their timing and how the sleeps it ordered
//! ended, when such a thread should sleep and for how long at most. It is
//! pure (the caller passes the time), owned by the thread's
//! [`Governor`](super::Governor), and has three parts:
//!
//! - **The window** (how long a run of empty polls must last before the
//!   next one sleeps) is learned as KVM learns its halt-poll window: it
//!   grows (from 0 to [`WINDOW_START_NS`], then doubling, up to
//!   [`WINDOW_MAX_NS`]) after a sleep that a completion ended within
//!   [`WINDOW_MAX_NS`] of its start, since polling a little longer would
//!   have caught that completion without a wake-up; it halves (to 0 below
//!   [`WINDOW_START_NS`]) after a longer sleep or one the bound ended,
//!   since then the polling before it was wasted. Back-to-back traffic
//!   thus keeps a thread polling as before; an idle thread sleeps at its
//!   first empty poll.
//! - **The bound** (the longest sleep): a program may also poll what the
//!   shim cannot see (memory an RDMA WRITE fills, a flag another thread
//!   sets), and only a bound ends a sleep for those. It starts at
//!   [`BOUND_START_NS`] and doubles, up to [`BOUND_MAX_NS`], only after a
//!   sleep that a completion of the polled set ended; a sleep the bound
//!   ended leaves it where it is.
//! - **The hazard rule**: after a sleep the bound ended, a thread that
//!   makes progress (sends, posts work) before any completion of its set
//!   has come must have been woken by something the shim cannot see:
//!   sleeping is switched off for that thread, for good. A completion first
//!   clears the suspicion.
//!
//! Why these numbers: [`BOUND_START_NS`] (100 µs) is about five cross-core
//! wake-ups on the measured VMs, so the one sleep that can delay an
//! invisible event before the hazard rule sees the thread's progress costs
//! at most that; [`BOUND_MAX_NS`] (2 ms) caps what a thread that polls
//! something invisible and never shows progress can lose per event, makes
//! an idle poller wake 500 times a second (about 0.5 % of a core at this
//! VM's ~10 µs of CPU per wake-up), and is twice the period of a 1 kHz
//! stream, whose sleeps then end by its completions (at a 1 ms cap they
//! raced the bound: sockperf's server at `--mps 1000` had 8 of 9 sleeps
//! ended by the bound); [`WINDOW_MAX_NS`] is KVM's
//! default `halt_poll_ns` on x86 (200 µs); [`WINDOW_START_NS`] is KVM's
//! `halt_poll_ns_grow_start` (10 µs).

/// First non-zero window.
pub const WINDOW_START_NS: u64 = 10_000;
/// Longest window; a sleep longer than this shrinks it.
pub const WINDOW_MAX_NS: u64 = 200_000;
/// First sleep bound.
pub const BOUND_START_NS: u64 = 100_000;
/// Longest sleep bound.
pub const BOUND_MAX_NS: u64 = 2_000_000;
/// Read the clock on one empty poll in this many (the first of a run is
/// always dated): a poller's loop calls at tens of ns a look, and a clock
/// read costs about as much.
pub const CHECK_EVERY: u32 = 16;

/// Why a thread's sleeping was switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Off {
    /// It made progress after a sleep the bound ended, before any
    /// completion of its set: it polls something the shim cannot see.
    Hazard,
}

/// What an empty poll should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Return empty, as without the rule.
    Poll,
    /// Wait for the polled set, for at most this many ns.
    Sleep(u64),
}

/// One thread's idle rule (see the module docs). `const`-constructible, no
/// heap, no destructor: it lives in the governor, in the shim's
/// const-initialised thread-local.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    window_ns: u64,
    bound_ns: u64,
    /// When the current run of empty polls began (`None`: no run).
    run_start: Option<u64>,
    empties: u32,
    /// The last sleep ended by the bound and no completion came since.
    suspect: bool,
    off: Option<Off>,
}

impl Default for IdleRule {
    fn default() -> Self {
        IdleRule::new()
    }
}

impl IdleRule {
    /// A rule in its first state: window [`WINDOW_START_NS`], bound
    /// [`BOUND_START_NS`].
    pub const fn new() -> IdleRule {
        IdleRule {
            window_ns: WINDOW_START_NS,
            bound_ns: BOUND_START_NS,
            run_start: None,
            empties: 0,
            suspect: false,
            off: None,
        }
    }

    /// The learned window, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// The current sleep bound, ns.
    pub fn bound_ns(&self) -> u64 {
        self.bound_ns
    }

    /// Switched off, and why.
    pub fn off(&self) -> Option<Off> {
        self.off
    }

    /// When the current run of empty polls began (`None`: no run), in the
    /// clock the polls were dated with.
    pub fn run_start(&self) -> Option<u64> {
        self.run_start
    }

    /// The last sleep ended by the bound, and no completion came since.
    pub fn suspect(&self) -> bool {
        self.suspect
    }

    /// A poll returned something: the run of empty polls is over.
    #[inline]
    pub fn completion(&mut self) {
        self.run_start = None;
        self.empties = 0;
        self.suspect = false;
    }

    /// A poll came back empty. `now` reads the clock; it is called on the
    /// first empty poll of a run and on one in [`CHECK_EVERY`] after it.
    #[inline]
    pub fn empty(&mut self, now: impl FnOnce() -> u64) -> Verdict {
        if self.off.is_some() {
            return Verdict::Poll;
        }
        self.empties = self.empties.wrapping_add(1);
        let Some(start) = self.run_start else {
            let t = now();
            self.run_start = Some(t);
            self.empties = 1;
            return if self.window_ns == 0 {
                Verdict::Sleep(self.bound_ns)
            } else {
                Verdict::Poll
            };
        };
        if !self.empties.is_multiple_of(CHECK_EVERY) {
            return Verdict::Poll;
        }
        if now().saturating_sub(start) >= self.window_ns {
            Verdict::Sleep(self.bound_ns)
        } else {
            Verdict::Poll
        }
    }

    /// A sleep ordered by [`empty`](Self::empty) ended: it lasted
    /// `slept_ns`, and a completion of the set ended it (`by_completion`)
    /// or the bound did. The run of empty polls starts again after it.
    pub fn slept(&mut self, slept_ns: u64, by_completion: bool) {
        self.run_start = None;
        self.empties = 0;
        if by_completion && slept_ns <= WINDOW_MAX_NS {
            self.window_ns = match self.window_ns {
                0 => WINDOW_START_NS,
                w => (w * 2).min(WINDOW_MAX_NS),
            };
        } else {
            self.window_ns /= 2;
            if self.window_ns < WINDOW_START_NS {
                self.window_ns = 0;
            }
        }
        if by_completion {
            self.bound_ns = (self.bound_ns * 2).min(BOUND_MAX_NS);
            self.suspect = false;
        } else {
            self.suspect = true;
        }
    }

    /// The thread made progress of its own (a send, a posted work
    /// request). After a sleep the bound ended, with no completion since,
    /// that switches sleeping off (the hazard rule); returns true when it
    /// did so now.
    #[inline]
    pub fn progress(&mut self) -> bool {
        if self.suspect && self.off.is_none() {
            self.off = Some(Off::Hazard);
            self.suspect = false;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty polls every `step` ns from `t` until the rule says sleep;
    /// returns the time it did and the bound.
    fn run_until_sleep(r: &mut IdleRule, t: &mut u64, step: u64) -> u64 {
        for _ in 0..10_000_000 {
            *t += step;
            let now = *t;
            if let Verdict::Sleep(b) = r.empty(|| now) {
                return b;
            }
        }
        panic!("never slept");
    }

    #[test]
    fn sleeps_after_the_window_of_empty_polls() {
        let mut r = IdleRule::new();
        let mut t = 1_000;
        let start = t + 50;
        let b = run_until_sleep(&mut r, &mut t, 50);
        assert_eq!(b, BOUND_START_NS);
        // Not before the window, and within one clock check after it.
        assert!(t - start >= WINDOW_START_NS, "slept after {} ns", t - start);
        assert!(t - start <= WINDOW_START_NS + 50 * CHECK_EVERY as u64);
    }

    #[test]
    fn a_completion_restarts_the_run() {
        let mut r = IdleRule::new();
        let mut t = 0;
        for _ in 0..100 {
            for _ in 0..10 {
                t += 500;
                assert_eq!(r.empty(|| t), Verdict::Poll);
            }
            r.completion();
        }
    }

    #[test]
    fn window_grows_on_short_sleeps_and_shrinks_on_long_ones() {
        let mut r = IdleRule::new();
        for _ in 0..10 {
            r.slept(20_000, true);
        }
        assert_eq!(r.window_ns(), WINDOW_MAX_NS);
        r.slept(WINDOW_MAX_NS + 1, true);
        assert_eq!(r.window_ns(), WINDOW_MAX_NS / 2);
        for _ in 0..10 {
            r.slept(BOUND_MAX_NS, false);
        }
        assert_eq!(r.window_ns(), 0);
        // Window 0: the first empty poll of a run sleeps.
        assert!(matches!(r.empty(|| 5), Verdict::Sleep(_)));
        r.slept(1_000, true);
        assert_eq!(r.window_ns(), WINDOW_START_NS);
    }

    #[test]
    fn bound_grows_only_on_sleeps_ended_by_completions_and_is_capped() {
        let mut r = IdleRule::new();
        r.slept(BOUND_START_NS, false);
        assert_eq!(r.bound_ns(), BOUND_START_NS);
        r.completion();
        let mut last = r.bound_ns();
        for _ in 0..20 {
            r.slept(10_000, true);
            assert!(r.bound_ns() >= last);
            last = r.bound_ns();
        }
        assert_eq!(r.bound_ns(), BOUND_MAX_NS);
        r.slept(BOUND_MAX_NS, false);
        assert_eq!(r.bound_ns(), BOUND_MAX_NS);
    }

    #[test]
    fn progress_after_a_bound_ended_sleep_switches_sleeping_off() {
        let mut r = IdleRule::new();
        assert!(!r.progress(), "progress with no sleep is no hazard");
        r.slept(BOUND_START_NS, true);
        assert!(!r.progress(), "a sleep a completion ended is no hazard");
        r.slept(BOUND_START_NS, false);
        assert!(r.suspect());
        assert!(r.progress());
        assert_eq!(r.off(), Some(Off::Hazard));
        let mut t = 0;
        for _ in 0..100_000 {
            t += 100;
            assert_eq!(r.empty(|| t), Verdict::Poll);
        }
        assert!(!r.progress(), "counted once");
    }

    #[test]
    fn a_completion_clears_the_suspicion() {
        let mut r = IdleRule::new();
        r.slept(BOUND_START_NS, false);
        r.completion();
        assert!(!r.progress());
        assert_eq!(r.off(), None);
    }
}
