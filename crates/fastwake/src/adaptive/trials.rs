//! A waiting thread's trials, run by the pressure sampler: whether its
//! short slice while asleep pays, and whether its lean spins do
//! ([`super::trial`] for one trial). Both are the thread's: a slice is a
//! thread's, and a lean spin that loses the CPU costs every wait after it
//! on that thread. They take turns, the slice's first: while one tries
//! its arms, the other holds its resting arm and its periods do not count
//! there, so neither trial's arms are in the other's figures.
//!
//! The waiter's side is [`Published`]: two counters it bumps and two flags
//! it reads, all relaxed atomics; the sampler's side is private to the
//! crate.

use super::trial::{MIN_SLEEPS, Trial, Verdict};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// One trial's state as the waiter and the reports see it.
#[derive(Debug)]
struct View {
    on: AtomicBool,
    verdict: AtomicU8,
    trials: AtomicU32,
    /// The behaviour's cost over none's in the last trial, ‰.
    ratio: AtomicU32,
}

impl View {
    fn new(t: &Trial) -> View {
        View {
            on: AtomicBool::new(t.arm()),
            verdict: AtomicU8::new(Verdict::Unknown as u8),
            trials: AtomicU32::new(0),
            ratio: AtomicU32::new(1000),
        }
    }

    fn publish(&self, t: &Trial) {
        self.on.store(t.arm(), Ordering::Relaxed);
        self.verdict.store(t.verdict() as u8, Ordering::Relaxed);
        self.trials.store(t.trials(), Ordering::Relaxed);
        self.ratio
            .store((t.last_ratio() * 1000.0).min(1e9) as u32, Ordering::Relaxed);
    }

    fn describe(&self, what: &str) -> Option<String> {
        let n = self.trials.load(Ordering::Relaxed);
        let v = match self.verdict.load(Ordering::Relaxed) {
            x if x == Verdict::Pays as u8 => "pays",
            x if x == Verdict::DoesNotPay as u8 => "does not pay",
            _ => return None,
        };
        Some(format!(
            "{what} trials {n}, last: {v} (run-queue delay and CPU/worth {:.2}x those without)",
            self.ratio.load(Ordering::Relaxed) as f64 / 1000.0
        ))
    }
}

/// What one waiter and the sampler share of its thread's trials.
#[derive(Debug)]
pub struct Published {
    /// Sleeps on a contended CPU under the slice trial, and waits on a
    /// contended CPU under the lean trial: which periods count.
    slice_sleeps: AtomicU64,
    contended_waits: AtomicU64,
    /// The waiter's worth ([`super::Config::worth`]): the trials weigh
    /// the thread's CPU time by it.
    worth: AtomicU32,
    slice: View,
    lean: View,
}

impl Default for Published {
    fn default() -> Self {
        let (slice, lean) = fresh();
        Published {
            slice_sleeps: AtomicU64::new(0),
            contended_waits: AtomicU64::new(0),
            worth: AtomicU32::new(super::DEFAULT_WORTH as u32),
            slice: View::new(&slice),
            lean: View::new(&lean),
        }
    }
}

/// A thread's trials before any period: the slice's tries first; lean
/// spins stay allowed (as before their trial existed) until their turn,
/// right after.
fn fresh() -> (Trial, Trial) {
    (Trial::default(), Trial::waiting(true))
}

impl Published {
    /// A sleep on a contended CPU under the slice trial by a waiter whose
    /// µs of latency are `worth` µs of CPU.
    #[inline]
    pub fn note_slice_sleep(&self, worth: u16) {
        self.worth.store(worth.max(1) as u32, Ordering::Relaxed);
        self.slice_sleeps.fetch_add(1, Ordering::Relaxed);
    }

    /// A wait planned on a contended CPU under the lean trial.
    #[inline]
    pub fn note_contended_wait(&self, worth: u16) {
        self.worth.store(worth.max(1) as u32, Ordering::Relaxed);
        self.contended_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Does the slice trial give the thread's sleeps the short slice now?
    #[inline]
    pub fn slice_on(&self) -> bool {
        self.slice.on.load(Ordering::Relaxed)
    }

    /// Does the lean trial allow lean spins now?
    #[inline]
    pub fn lean_on(&self) -> bool {
        self.lean.on.load(Ordering::Relaxed)
    }

    /// The trials' verdicts for reports (`slice`, `lean`: the waiter runs
    /// that trial), once one ended.
    pub fn describe(&self, slice: bool, lean: bool) -> Option<String> {
        let parts: Vec<String> = [
            slice.then(|| self.slice.describe("slice")).flatten(),
            lean.then(|| self.lean.describe("lean-spin")).flatten(),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Periods a trying trial may go without counting, while the other's
/// would count, before it yields its turn: a waiter that spins through
/// most waits sleeps too rarely for the slice's trial to end, and its
/// lean spins are then the behaviour to try.
pub const STALL_PERIODS: u32 = 10;

/// One thread's two trials and the counts its waiters had reached.
struct PerThread {
    slice: Trial,
    lean: Trial,
    seen_sleeps: u64,
    seen_waits: u64,
    /// Whose turn it is to try (the slice's, else lean spins'), and for
    /// how many periods in a row it could not count one the other could.
    slice_turn: bool,
    stalled: u32,
}

/// The sampler's side: the trials of each waiting thread.
#[derive(Default)]
pub(super) struct Driver {
    by_tid: HashMap<i32, PerThread>,
}

impl Driver {
    /// One sampler period of `dt_ns` has passed. `ran` holds each thread's
    /// (CPU ns, run-queue delay ns) over it, where schedstat was read at
    /// both ends; `live` the waiters, with their thread. Each thread's
    /// trial whose turn it is observes the period; the arms for the next
    /// one are published.
    pub(super) fn step(
        &mut self,
        dt_ns: f64,
        ran: &HashMap<i32, (u64, u64)>,
        live: &[(i32, &Published)],
    ) {
        // Per thread: its waiters' counts, and the least worth among those
        // that counted (the one that weighs CPU most).
        let mut counts: HashMap<i32, (u64, u64, u32)> = HashMap::new();
        for &(tid, p) in live {
            let e = counts.entry(tid).or_insert((0, 0, u32::MAX));
            let (s, w) = (
                p.slice_sleeps.load(Ordering::Relaxed),
                p.contended_waits.load(Ordering::Relaxed),
            );
            e.0 += s;
            e.1 += w;
            if s + w > 0 {
                e.2 = e.2.min(p.worth.load(Ordering::Relaxed));
            }
        }
        self.by_tid.retain(|tid, _| counts.contains_key(tid));
        for (&tid, &(sleeps, waits, worth)) in &counts {
            let t = self.by_tid.entry(tid).or_insert_with(|| {
                let (slice, lean) = fresh();
                PerThread {
                    slice,
                    lean,
                    seen_sleeps: sleeps,
                    seen_waits: waits,
                    slice_turn: true,
                    stalled: 0,
                }
            });
            let cost = match ran.get(&tid) {
                Some(&(run, delay)) if dt_ns > 0.0 => {
                    (run as f64 / worth.clamp(1, 65_535) as f64 + delay as f64) / dt_ns
                }
                _ => f64::NAN,
            };
            let (ds, dw) = (sleeps - t.seen_sleeps, waits - t.seen_waits);
            (t.seen_sleeps, t.seen_waits) = (sleeps, waits);
            // The turn: held by the trial that has it while it tries and
            // can count its periods; passed on when it holds a verdict, or
            // when it stalled where the other's periods would count.
            let (mine, other) = if t.slice_turn { (ds, dw) } else { (dw, ds) };
            let (tries, other_tries) = if t.slice_turn {
                (t.slice.trying(), t.lean.trying())
            } else {
                (t.lean.trying(), t.slice.trying())
            };
            t.stalled = if tries && mine < MIN_SLEEPS && other >= MIN_SLEEPS {
                t.stalled + 1
            } else {
                0
            };
            if other_tries && (!tries || t.stalled >= STALL_PERIODS) {
                t.slice_turn = !t.slice_turn;
                t.stalled = 0;
            }
            // The trial with the turn observes; the other too while it
            // holds a verdict (its arm does not move), else it waits.
            let (slice_turn, st, lt) = (t.slice_turn, t.slice.trying(), t.lean.trying());
            if slice_turn || !st {
                t.slice.observe(ds, cost);
            } else {
                t.slice.pause();
            }
            if !slice_turn || !lt {
                t.lean.observe(dw, cost);
            } else {
                t.lean.pause();
            }
            // A hold that ended just now, without the turn, waits from the
            // start: its arms must not move under the other's trial.
            if t.slice_turn && t.lean.trying() {
                t.lean.pause();
            } else if !t.slice_turn && t.slice.trying() {
                t.slice.pause();
            }
        }
        for &(tid, p) in live {
            if let Some(t) = self.by_tid.get(&tid) {
                p.slice.publish(&t.slice);
                p.lean.publish(&t.lean);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// One period as the waiters saw it: (slice on, lean spins on), and
    /// which trial was trying its arms (slice, lean).
    type Seen = ((bool, bool), (bool, bool));

    /// Drive one thread with two waiters through `steps` periods: each
    /// period both waiters count 10 slice sleeps and 10 contended waits,
    /// and the thread's (CPU, delay) come from `cost(slice_on, lean_on)`.
    fn drive(
        worth: u16,
        steps: u32,
        cost: impl Fn(bool, bool) -> (u64, u64),
    ) -> (Arc<Published>, Vec<Seen>) {
        drive_sleeping(worth, steps, 10, cost)
    }

    /// [`drive`], with `sleeps` slice sleeps a period per waiter.
    fn drive_sleeping(
        worth: u16,
        steps: u32,
        sleeps: u32,
        cost: impl Fn(bool, bool) -> (u64, u64),
    ) -> (Arc<Published>, Vec<Seen>) {
        let (a, b) = (
            Arc::new(Published::default()),
            Arc::new(Published::default()),
        );
        let mut d = Driver::default();
        let mut seen = Vec::new();
        d.step(50e6, &HashMap::new(), &[(7, &a), (7, &b)]);
        for _ in 0..steps {
            let on = (a.slice_on(), a.lean_on());
            assert_eq!(
                on,
                (b.slice_on(), b.lean_on()),
                "one thread, one set of arms"
            );
            let t = &d.by_tid[&7];
            // Which trial tries its arms now: the one with the turn.
            seen.push((
                on,
                (
                    t.slice_turn && t.slice.trying(),
                    !t.slice_turn && t.lean.trying(),
                ),
            ));
            for p in [&a, &b] {
                for i in 0..10 {
                    if i < sleeps {
                        p.note_slice_sleep(worth);
                    }
                    p.note_contended_wait(worth);
                }
            }
            d.step(
                50e6,
                &HashMap::from([(7, cost(on.0, on.1))]),
                &[(7, &a), (7, &b)],
            );
        }
        (a, seen)
    }

    /// The slice is tried first while lean spins stay allowed; then lean
    /// spins are tried while the slice holds its verdict; each trial finds
    /// its own behaviour's cost, and the two never try at once: while one
    /// does, the other's arm stays put.
    #[test]
    fn the_two_trials_take_turns_and_each_finds_its_own_cost() {
        // The slice costs 3 ms of delay a period, lean spins 2 ms.
        let (p, seen) = drive(100, 300, |slice, lean| {
            (
                1_000_000,
                5_000_000 + 3_000_000 * slice as u64 + 2_000_000 * lean as u64,
            )
        });
        let d = p.describe(true, true).expect("both ended a trial");
        assert!(
            d.contains("slice trials") && d.contains("lean-spin trials"),
            "{d}"
        );
        assert!(!p.lean_on(), "{d}");
        assert!(seen[0].1.0, "the slice tries first");
        // The lean trial's turn comes right after the slice's first one.
        let slice_done = seen.iter().position(|s| !s.1.0).unwrap();
        assert!(
            seen[slice_done..slice_done + 2].iter().any(|s| s.1.1),
            "lean spins are tried next"
        );
        for w in seen.windows(2) {
            let ((on0, (st0, lt0)), (on1, (st1, lt1))) = (w[0], w[1]);
            if st0 && st1 {
                assert_eq!(on0.1, on1.1, "lean spins moved during the slice's trial");
            }
            if lt0 && lt1 {
                assert_eq!(on0.0, on1.0, "the slice moved during the lean trial");
            }
        }
        assert!(seen.iter().any(|s| s.1.1), "lean spins were tried");
    }

    /// A waiter that spins through most waits sleeps too rarely for the
    /// slice's trial to count a period: after [`STALL_PERIODS`] the lean
    /// spins' trial takes the turn and ends, and lean spins that cost are
    /// barred.
    #[test]
    fn a_stalled_slice_trial_yields_to_the_lean_one() {
        let (p, seen) = drive_sleeping(100, 60, 1, |_, lean| {
            (1_000_000, 5_000_000 + 2_000_000 * lean as u64)
        });
        let d = p.describe(true, true).expect("the lean trial ended");
        assert!(d.contains("lean-spin trials 1, last: does not pay"), "{d}");
        assert!(!d.contains("slice trials"), "{d}");
        assert!(!p.lean_on());
        let handed = seen.iter().position(|s| s.1.1).expect("lean took the turn");
        assert!(handed >= STALL_PERIODS as usize, "{handed}");
    }

    /// The trials weigh the thread's CPU time by the waiter's worth: a
    /// slice that cuts the delay by 1 ms a period and costs 6 ms of CPU
    /// pays where a µs of latency is worth 100 µs of CPU, not at par.
    #[test]
    fn the_trials_weigh_cpu_by_the_waiters_worth() {
        let cost = |slice: bool, _| {
            if slice {
                (8_000_000, 5_000_000)
            } else {
                (2_000_000, 6_000_000)
            }
        };
        let (latency_first, _) = drive(100, 24, cost);
        assert!(
            latency_first.slice_on(),
            "{:?}",
            latency_first.describe(true, false)
        );
        let (cpu_at_par, _) = drive(1, 24, cost);
        assert!(
            !cpu_at_par.slice_on(),
            "{:?}",
            cpu_at_par.describe(true, false)
        );
    }

    /// A behaviour that pays is kept by its trial while the other is
    /// dropped.
    #[test]
    fn a_paying_behaviour_is_kept_beside_one_that_does_not() {
        let (p, _) = drive(100, 200, |slice, lean| {
            (
                1_000_000,
                8_000_000 + 3_000_000 * slice as u64 - 2_000_000 * lean as u64,
            )
        });
        assert!(!p.slice_on() && p.lean_on(), "{:?}", p.describe(true, true));
    }
}
