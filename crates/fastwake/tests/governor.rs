//! The wait governor: the one spin-then-block decision of the library's
//! `Waiter` and of every hook of the preload shim. Pure (time passed in),
//! so these run without threads or clocks; the shim's tests and the
//! library's wait-mode tests exercise the same code from each side.

use fastwake::WaitMode;
use fastwake::adaptive::Reason;
use fastwake::wait::{
    DEFAULT_BUDGET, Decision, Ending, Facts, Governor, MIN_BACKOFF_NS, PREEMPTED_NS, Why,
};
use std::time::Duration;

fn hybrid(us: u64) -> Governor {
    Governor::new(WaitMode::Hybrid {
        budget: Duration::from_micros(us),
    })
}

fn facts(now: u64) -> Facts {
    Facts {
        cpu: Some(3),
        ..Facts::at(now, None)
    }
}

/// Waits of `gap` ns one after another through `g` (each wait starts
/// after the previous one ended, plus 1 µs of work); spinning ones are
/// caught, blocking ones pay a 5 µs wake-up. Returns the last spin budget.
fn feed(g: &mut Governor, gaps: impl Iterator<Item = u64>) -> u64 {
    let mut now = 1_000_000;
    let mut b = 0;
    for gap in gaps {
        b = match g.plan(&facts(now)).0 {
            Decision::Spin(b) => b,
            _ => 0,
        };
        if b >= gap {
            g.end(Ending::at(now + gap, gap, false));
            now += gap;
        } else {
            g.end(Ending::at(now + gap + 5_000, b, true));
            now += gap + 5_000;
        }
        now += 1_000;
    }
    b
}

fn adaptive(ceiling_ns: u64) -> Governor {
    Governor::new(WaitMode::Adaptive(Default::default())).with_ceiling(ceiling_ns)
}

#[test]
fn hybrid_spins_its_budget_and_the_default_is_stated_once() {
    let mut g = hybrid(30);
    assert_eq!(g.plan(&facts(1_000)), (Decision::Spin(30_000), Why::Mode));
    let mut g = Governor::new("hybrid".parse().unwrap());
    assert_eq!(
        g.plan(&facts(1_000)).0,
        Decision::Spin(DEFAULT_BUDGET.as_nanos() as u64)
    );
}

#[test]
fn interrupt_blocks_and_poll_spins_until_the_timeout() {
    let mut g = Governor::new(WaitMode::Interrupt);
    assert_eq!(g.plan(&facts(1_000)).0, Decision::Block);
    let mut g = Governor::new(WaitMode::Poll);
    assert_eq!(g.plan(&facts(1_000)).0, Decision::Spin(u64::MAX));
    let f = Facts {
        timeout_ns: Some(7_000),
        ..facts(1_000)
    };
    assert_eq!(g.plan(&f).0, Decision::Spin(7_000));
}

#[test]
fn a_zero_or_short_timeout_is_never_spun_past() {
    let mut g = hybrid(50);
    let f = |t| Facts {
        timeout_ns: Some(t),
        ..facts(1_000)
    };
    assert_eq!(g.plan(&f(0)).0, Decision::Block);
    assert_eq!(g.plan(&f(20_000)).0, Decision::Spin(20_000));
}

#[test]
fn no_spin_against_a_producer_on_the_same_cpu() {
    let mut g = hybrid(50);
    let f = Facts {
        peer_cpu: Some(3),
        ..facts(1_000)
    };
    assert_eq!(g.plan(&f), (Decision::Block, Why::SameCpu));
    let f = Facts {
        peer_cpu: Some(2),
        ..facts(1_000)
    };
    assert_eq!(g.plan(&f).0, Decision::Spin(50_000));
}

/// An interrupt-mode governor whose blocked waits took `ns` each (what
/// the sibling rule judges a sleeping sibling by).
fn sleeper_waiting(ns: u64) -> Governor {
    let mut s = Governor::new(WaitMode::Interrupt);
    for i in 0..8 {
        let t = 1_000 + i * (ns + 1_000);
        s.plan(&Facts::at(t, None));
        s.end(Ending::at(t + ns, 0, true));
    }
    s
}

#[test]
fn no_spin_while_a_sibling_is_blocked_on_the_cpu() {
    // CPU numbers no other test of this binary uses: the count is
    // process-wide.
    let f = Facts {
        cpu: Some(201),
        ..Facts::at(1_000, None)
    };
    let mut sleeper = sleeper_waiting(20_000);
    let mut g = hybrid(50);
    assert_eq!(g.plan(&f).0, Decision::Spin(50_000));
    let asleep = sleeper.blocking(Some(201), 1_000);
    assert_eq!(g.plan(&f), (Decision::Block, Why::Siblings));
    drop(asleep);
    assert_eq!(g.plan(&f).0, Decision::Spin(50_000));
}

/// A sibling that sleeps for long stretches (a listener between
/// connections), or has not blocked before, does not stop a spin; a due
/// one stops counting once it has slept twice its usual wait.
#[test]
fn only_a_sibling_whose_wait_is_due_stops_a_spin() {
    let mut g = hybrid(50);
    let at = |cpu, now| Facts {
        cpu: Some(cpu),
        ..Facts::at(now, None)
    };
    // Long sleeper (2 s waits) and a sleeper with no history, on CPU 203.
    let mut listener = sleeper_waiting(2_000_000_000);
    let mut fresh = Governor::new(WaitMode::Interrupt);
    let a = listener.blocking(Some(203), 1_000);
    let b = fresh.blocking(Some(203), 1_000);
    assert_eq!(g.plan(&at(203, 1_000)).0, Decision::Spin(50_000));
    drop((a, b));
    // A due sleeper (20 µs waits) on CPU 204: counts now, not 40 µs on.
    let mut worker = sleeper_waiting(20_000);
    let now = 5_000_000;
    let c = worker.blocking(Some(204), now);
    assert_eq!(g.plan(&at(204, now)), (Decision::Block, Why::Siblings));
    assert_eq!(g.plan(&at(204, now + 100_000)).0, Decision::Spin(50_000));
    drop(c);
}

/// A fixed-mode wait that neither slept nor spun teaches nothing, so its
/// caller need not read the clock for its end; a sleep, a spin or an
/// adaptive (learned) wait does.
#[test]
fn only_a_wait_with_something_to_learn_needs_the_clock_at_its_end() {
    let mut d = Governor::new(WaitMode::Dispatch);
    assert_eq!(d.plan(&facts(1_000)).0, Decision::Dispatch);
    assert!(!d.end_reads_clock(false, false));
    assert!(d.end_reads_clock(true, false));
    assert!(d.end_reads_clock(false, true));
    let mut a = adaptive(50_000);
    a.plan(&facts(1_000));
    assert!(
        a.end_reads_clock(false, false),
        "the learner wants its length"
    );
}

#[test]
fn backs_off_after_a_preempted_spin_and_recovers() {
    let mut g = hybrid(50);
    assert!(matches!(g.plan(&facts(1_000)).0, Decision::Spin(_)));
    g.end(Ending {
        preempted: true,
        ..Ending::at(1_000 + PREEMPTED_NS * 2, PREEMPTED_NS * 2, true)
    });
    let t = 1_000 + PREEMPTED_NS * 3;
    assert_eq!(g.plan(&facts(t)), (Decision::Block, Why::Contended));
    g.end(Ending::at(t + 10, 0, true));
    let later = t + MIN_BACKOFF_NS + PREEMPTED_NS * 2;
    assert!(matches!(g.plan(&facts(later)).0, Decision::Spin(_)));
}

#[test]
fn the_cpu_cap_holds_for_hybrid() {
    // 10 % of a core; a waiter that spins its whole 50 µs budget every
    // 60 µs would take ~83 %.
    let mut g = hybrid(50).with_cap(100_000);
    let (mut now, mut spun, mut capped) = (1_000u64, 0u64, 0u32);
    for _ in 0..20_000 {
        let (d, why) = g.plan(&facts(now));
        if why == Why::Capped {
            capped += 1;
        }
        let b = match d {
            Decision::Spin(b) => b,
            _ => 0,
        };
        spun += b;
        g.end(Ending::at(now + b, b, true));
        now += 60_000;
    }
    let wall = now - 1_000;
    let burst = 0.10 * fastwake::wait::BURST_NS as f64;
    assert!(capped > 0);
    assert!(
        spun as f64 <= 0.10 * wall as f64 + burst + 50_000.0,
        "spun {spun} ns in {wall} ns with a 10% cap"
    );
}

#[test]
fn dispatch_mode_dispatches_what_it_can_and_spins_the_rest() {
    let mut g = Governor::new(WaitMode::Dispatch);
    assert_eq!(g.plan(&facts(1_000)).0, Decision::Dispatch);
    let f = Facts {
        dispatchable: false,
        ..facts(1_000)
    };
    assert_eq!(
        g.plan(&f).0,
        Decision::Spin(DEFAULT_BUDGET.as_nanos() as u64)
    );
    let mut g = Governor::new(WaitMode::Dispatch).with_ceiling(30_000);
    assert_eq!(g.plan(&f).0, Decision::Spin(30_000));
}

#[test]
fn adaptive_learns_before_spinning() {
    let mut g = adaptive(50_000);
    assert_eq!(
        g.plan(&facts(1_000)),
        (Decision::Block, Why::Learned(Reason::Learning))
    );
}

#[test]
fn adaptive_gives_a_quick_peer_a_budget_that_catches_it() {
    let mut g = adaptive(50_000);
    let b = feed(&mut g, (0..400).map(|i| 10_000 + (i % 4) * 1_000));
    assert!((13_000..=50_000).contains(&b), "{b}");
}

#[test]
fn adaptive_gives_a_slow_peer_no_spin() {
    let mut g = adaptive(50_000);
    assert_eq!(feed(&mut g, (0..400).map(|_| 1_000_000)), 0);
}

#[test]
fn adaptive_gives_a_mostly_slow_peer_no_spin_and_recovers() {
    let mut g = adaptive(50_000);
    let slow = (0..600).map(|i| if i % 3 == 0 { 5_000 } else { 2_000_000 });
    assert_eq!(feed(&mut g, slow), 0);
    let b = feed(&mut g, (0..2_000).map(|_| 8_000));
    assert!(b > 8_000, "{b}");
}

#[test]
fn adaptive_never_exceeds_the_ceiling() {
    let mut g = adaptive(20_000);
    assert_eq!(feed(&mut g, (0..400).map(|_| 19_000)), 20_000);
}

#[test]
fn adaptive_dispatches_next_to_a_sibling_when_a_dispatcher_serves_the_cpu() {
    let mut g = adaptive(50_000);
    feed(&mut g, (0..400).map(|_| 10_000));
    let mut sleeper = sleeper_waiting(20_000);
    let asleep = sleeper.blocking(Some(202), 900_000_000);
    let f = |d| Facts {
        cpu: Some(202),
        dispatch_waiters: d,
        ..Facts::at(900_000_000, None)
    };
    assert_eq!(
        g.plan(&f(None)),
        (Decision::Block, Why::Learned(Reason::Siblings))
    );
    g.end(Ending::at(900_010_000, 0, true));
    assert_eq!(
        g.plan(&f(Some(4))),
        (Decision::Dispatch, Why::Learned(Reason::Dispatch))
    );
    drop(asleep);
}

/// The backlog rule: a waiter that took 64 completions in a row without
/// waiting was behind; when such runs are a sustained share of its recent
/// completions, its next adaptive waits do not spin for a while (then they
/// may again), and the backlog is counted. 63 is not a backlog.
#[test]
fn adaptive_stops_spinning_after_a_backlog_and_resumes_later() {
    let mut g = adaptive(50_000);
    feed(&mut g, (0..400).map(|_| 10_000));
    let t = 900_000_000;
    for _ in 0..fastwake::wait::BACKLOG_RUN - 1 {
        g.found_ready();
    }
    assert!(matches!(g.plan(&facts(t)).0, Decision::Spin(_)));
    g.end(Ending::at(t + 10_000, 10_000, false));
    // A backlog that is a sustained share of the recent completions (the
    // 400 waits fed above were one each): 256 of 720.
    for _ in 0..4 * fastwake::wait::BACKLOG_RUN {
        g.found_ready();
    }
    assert_eq!(
        g.plan(&facts(t + 20_000)),
        (Decision::Block, Why::Learned(Reason::Behind))
    );
    g.end(Ending::at(t + 40_000, 0, true));
    assert_eq!(g.adaptive_stats().backlogs, 1);
    // Still within the hold, without a new backlog.
    assert_eq!(
        g.plan(&facts(t + 1_000_000)),
        (Decision::Block, Why::Learned(Reason::Behind))
    );
    g.end(Ending::at(t + 1_010_000, 0, true));
    // The hold has passed.
    let later = t + fastwake::wait::MIN_BEHIND_NS + 2_000_000;
    assert!(matches!(g.plan(&facts(later)).0, Decision::Spin(_)));
}

/// A pre-wake's spin is bounded by the ceiling from the thread's own
/// wake-up, not from its timer's: on a host whose timers run 25 µs late, a
/// 50 µs ceiling counted from the timer left 25 µs of spin, and a steady
/// 1 ms stream with ±20 µs of jitter missed a third of its completions
/// (sockperf's busy-polling server under the shim's `--pollers sleep`).
#[test]
fn a_prewakes_ceiling_counts_from_the_wake_up_not_the_timer() {
    const LATE: u64 = 25_000;
    const CEILING: u64 = 50_000;
    let mut g = adaptive(CEILING);
    let mut now = 1_000_000u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let (mut prewakes, mut caught, mut longest_spin) = (0, 0, 0);
    for i in 0..1_500 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let gap = 980_000 + (seed >> 33) % 40_000;
        let f = Facts {
            cpu: Some(3),
            prewake: true,
            ..Facts::at(now, None)
        };
        let end = match g.plan(&f).0 {
            Decision::Prewake {
                wake_at_ns,
                spin_until_ns,
                spin_max_ns,
            } => {
                assert_eq!(spin_max_ns, CEILING);
                let run = wake_at_ns + LATE;
                let until = spin_until_ns.min(run + spin_max_ns);
                let arrive = now + gap;
                let mut e = Ending::at(arrive.max(run), 0, false);
                e.late_ns = Some(LATE);
                if i >= 1_000 {
                    prewakes += 1;
                }
                if arrive <= until {
                    e.spun_ns = arrive.saturating_sub(run);
                    longest_spin = longest_spin.max(e.spun_ns);
                    e.arrival = Some(fastwake::adaptive::prewake::Arrival::Caught);
                    if i >= 1_000 {
                        caught += 1;
                    }
                } else {
                    e.now_ns = arrive + LATE;
                    e.spun_ns = until.saturating_sub(run);
                    e.slept = true;
                    e.arrival = Some(fastwake::adaptive::prewake::Arrival::Late);
                }
                e
            }
            Decision::Spin(b) if b >= gap => Ending::at(now + gap, gap, false),
            Decision::Spin(b) => Ending::at(now + gap + LATE, b, true),
            _ => Ending::at(now + gap + LATE, 0, true),
        };
        now = end.now_ns + 1_000;
        g.end(end);
    }
    assert!(
        prewakes >= 450,
        "{prewakes} pre-wakes in the last 500 waits"
    );
    assert!(
        caught * 10 >= prewakes * 9,
        "caught {caught} of {prewakes} pre-wakes"
    );
    assert!(longest_spin <= CEILING, "spun {longest_spin} ns");
}

/// Adaptive sleeps under a short slice only while its CPU is contended,
/// and only where its settings ask for one; the fixed modes never do.
#[test]
fn a_short_slice_is_asked_for_a_contended_adaptive_sleep_only() {
    let g = adaptive(50_000);
    assert_eq!(
        g.sleep_slice(true),
        Some((Duration::from_micros(100), Some(100)))
    );
    assert_eq!(g.sleep_slice(false), None);
    let off = Governor::new("adaptive:slice=off".parse().unwrap());
    assert_eq!(off.sleep_slice(true), None);
    let long = Governor::new("adaptive:slice=1ms".parse().unwrap());
    assert_eq!(
        long.sleep_slice(true),
        Some((Duration::from_millis(1), Some(100)))
    );
    // The trial weighs CPU by the waiter's worth.
    let cheap = Governor::new("adaptive:worth=3".parse().unwrap());
    assert_eq!(
        cheap.sleep_slice(true),
        Some((Duration::from_micros(100), Some(3)))
    );
    // Without the trial, every contended sleep takes it.
    let always = Governor::new("adaptive:slicetrial=off".parse().unwrap());
    assert_eq!(
        always.sleep_slice(true),
        Some((Duration::from_micros(100), None))
    );
    // The lean-spin trial runs for adaptive waits whose learned plan
    // spins, with their worth: not while learning, not for a slow peer.
    let mut cheap = Governor::new("adaptive:worth=3".parse().unwrap()).with_ceiling(50_000);
    assert_eq!(cheap.lean_trial_worth(), None, "learning");
    feed(&mut cheap, (0..400).map(|_| 10_000));
    assert_eq!(cheap.lean_trial_worth(), Some(3));
    let mut slow = adaptive(50_000);
    // Slow and spread (no pre-wake either: the median is 3x the shortest).
    feed(&mut slow, (0..400).map(|i| 1_000_000 + (i % 7) * 700_000));
    assert_eq!(slow.lean_trial_worth(), None, "interrupt mode");
    let mut no_lean_trial =
        Governor::new("adaptive:leantrial=off".parse().unwrap()).with_ceiling(50_000);
    feed(&mut no_lean_trial, (0..400).map(|_| 10_000));
    assert_eq!(no_lean_trial.lean_trial_worth(), None);
    for m in ["poll", "interrupt", "hybrid", "dispatch"] {
        let g = Governor::new(m.parse().unwrap());
        assert_eq!(g.lean_trial_worth(), None, "{m}");
        assert_eq!(g.sleep_slice(true), None, "{m}");
    }
    let mut g = adaptive(50_000);
    g.note_short_slice();
    g.note_short_slice();
    assert_eq!(g.adaptive_stats().short_slice_sleeps, 2);
    // A give-back of a few µs is the two system calls; one past 50 µs
    // lost the CPU on the way out and is counted with its time.
    g.gave_back_slice(3_000);
    g.gave_back_slice(50_000);
    g.gave_back_slice(2_100_000);
    let s = g.adaptive_stats();
    assert_eq!((s.slow_give_backs, s.slow_give_back_ns), (1, 2_100_000));
}
