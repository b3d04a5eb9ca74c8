//! Property tests of the adaptive learner's pre-wakes (sleep until just
//! before the completion is due, then poll), on the same simulated waiter
//! as adaptive_controller.rs.

use fastwake::adaptive::{Config, Env, Outcome, Plan};
use proptest::prelude::*;

mod adaptive_sim;
use adaptive_sim::{Dist, Sim};

// --- Pre-wakes (sleep, then poll) -------------------------------------

/// Pre-wakes planned and how they went, over the last `n` waits of `d`.
fn prewake_run(cfg: Config, d: Dist, seed: u64, late: (u64, u64)) -> Sim {
    let mut s = Sim::new(cfg, seed);
    s.late = late;
    s.run(d, 1_500);
    (s.early, s.caught, s.late_arrivals, s.spun) = (0, 0, 0, 0);
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A steady service time (50 µs to 2 ms, ± 10 %) is slept through to
    /// just before its earliest completion: after learning, nearly every
    /// wait is a pre-wake caught while spinning, the spin per wait is the
    /// jitter plus the timer's lateness (not the wait), and the margin
    /// holds: a completion the waits predict is almost never early.
    #[test]
    fn prewake_converges_on_a_steady_service_time(d in 50_000.0f64..2_000_000.0, seed in any::<u64>()) {
        let dist = Dist::Steady { d, jitter: 0.1 };
        let mut s = prewake_run(Config::default(), dist, seed, (3_000, 25_000));
        s.run(dist, 1_000);
        let n = (s.early + s.caught + s.late_arrivals) as f64;
        let explain = fastwake::adaptive::explain(&s.core, None);
        prop_assert!(n >= 950.0, "only {n} pre-wakes in 1000 waits: {explain}");
        prop_assert!(s.caught as f64 >= 0.9 * n, "caught {} of {n}: {explain}", s.caught);
        prop_assert!(s.early as f64 <= 0.05 * n, "early {} of {n}: {explain}", s.early);
        // Spin per wait: at most the whole jitter band (0.2 D) plus the
        // lateness spread and margin (25 µs) and a little.
        let spin = s.spun as f64 / 1_000.0;
        prop_assert!(spin <= 0.2 * d + 30_000.0, "spun {spin:.0} ns per {d:.0} ns wait: {explain}");
    }

    /// Wide distributions get today's plans: no pre-wakes where the waits
    /// do not say when the completion comes.
    #[test]
    fn wide_distributions_are_not_prewoken(mean in 20_000.0f64..2_000_000.0, seed in any::<u64>()) {
        let s = {
            let mut s = prewake_run(Config::default(), Dist::Exp(mean), seed, (3_000, 25_000));
            s.run(Dist::Exp(mean), 1_000);
            s
        };
        let n = s.early + s.caught + s.late_arrivals;
        prop_assert!(n <= 20, "{n} pre-wakes of Exp({mean:.0}): {}", fastwake::adaptive::explain(&s.core, None));
    }
}

#[test]
fn prewake_margin_follows_the_measured_lateness() {
    // The same service time with a quiet timer and a noisy one: the noisy
    // one is planned to wake earlier (a wider margin), and both keep their
    // completions from coming early.
    let dist = Dist::Steady {
        d: 300_000.0,
        jitter: 0.1,
    };
    let sleep = |late: (u64, u64)| {
        let mut s = prewake_run(Config::default(), dist, 7, late);
        s.run(dist, 500);
        let n = (s.early + s.caught + s.late_arrivals) as f64;
        assert!(
            s.early as f64 <= 0.05 * n,
            "{late:?}: early {} of {n}",
            s.early
        );
        match s.core.current_plan() {
            Plan::Prewake { sleep_ns, .. } => sleep_ns,
            p => panic!(
                "{late:?}: plan {p:?}: {}",
                fastwake::adaptive::explain(&s.core, None)
            ),
        }
    };
    let quiet = sleep((2_000, 6_000));
    let noisy = sleep((10_000, 60_000));
    assert!(
        quiet >= noisy + 20_000,
        "quiet timer sleeps to {quiet} ns, noisy one to {noisy} ns"
    );
}

/// A source that does not date its rings, on a host whose wake-ups take
/// 30 µs (the model says 4.3): an early completion must not be learned as
/// a later one, or the plan keeps sleeping past its completions. The
/// waits are 30-40 µs, shorter than the timer's margin would like.
#[test]
fn early_completions_pull_the_prewake_earlier() {
    let dist = Dist::Steady {
        d: 35_000.0,
        jitter: 0.15,
    };
    let mut s = Sim::new(Config::default(), 11);
    s.early_wake = Some(30_000);
    s.late = (2_000, 6_000);
    s.run(dist, 2_000);
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    s.run(dist, 1_000);
    let n = s.early + s.caught + s.late_arrivals;
    assert!(
        n >= 500,
        "{n} pre-wakes: {}",
        fastwake::adaptive::explain(&s.core, None)
    );
    assert!(
        s.early * 4 <= n,
        "early {} of {n} pre-wakes: {}",
        s.early,
        fastwake::adaptive::explain(&s.core, None)
    );
}

/// A steady 300 µs ±10 % service time: what pre-wakes are for.
const STEADY_300US: Dist = Dist::Steady {
    d: 300_000.0,
    jitter: 0.1,
};

/// A learner that has learned a steady 300 µs ±10 % service time and
/// plans pre-wakes for it (asserted), with that distribution.
fn prewaking(seed: u64) -> (Sim, Dist) {
    let dist = STEADY_300US;
    let mut s = Sim::new(Config::default(), seed);
    s.run(dist, 1_500);
    assert!(
        matches!(s.core.current_plan(), Plan::Prewake { .. }),
        "{}",
        fastwake::adaptive::explain(&s.core, None)
    );
    (s, dist)
}

#[test]
fn a_caller_that_cannot_prewake_gets_the_other_plans() {
    let (mut s, dist) = prewaking(3);
    let no = Env {
        prewake: false,
        ..Env::default()
    };
    for _ in 0..200 {
        let w = dist.sample(&mut s.rng);
        assert!(!matches!(s.step(w, no), Plan::Prewake { .. }));
    }
}

#[test]
fn prewake_is_not_planned_against_a_producer_on_its_cpu_or_past_the_cap() {
    let (mut s, _) = prewaking(5);
    let same = Env {
        same_cpu: true,
        ..Env::default()
    };
    assert_eq!(s.step(300_000, same), Plan::Spin(0));
    // The cap's allowance is the caller's (Sim keeps none here): one that
    // affords less than the plan's spin rules the pre-wake out.
    let broke = Env {
        allowance_ns: 1_000,
        ..Env::default()
    };
    interrupt_for(&mut s, broke, fastwake::adaptive::Reason::Cap);
}

/// The plan for `env` now is interrupt mode, for reason `why`.
fn interrupt_for(s: &mut Sim, env: Env, why: fastwake::adaptive::Reason) {
    assert_eq!(s.core.plan(s.now, env), Plan::Spin(0));
    assert_eq!(
        s.core.last_reason(),
        why,
        "{}",
        fastwake::adaptive::explain(&s.core, None)
    );
}

/// A margin past the caller's longest spin (the shim's 50 µs ceiling,
/// timers 20-90 µs late, as measured on this project's VMs on a bad day)
/// still pre-wakes: the ceiling counts from the thread's wake-up, and the
/// figures cut every spin there, so the plan is weighed as it will run.
/// Ruling such pre-wakes out (as a margin-past-the-ceiling rule did) left
/// a 1 kHz stream in interrupt mode, every completion paying a whole
/// wake-up.
#[test]
fn a_margin_past_the_ceiling_still_prewakes_and_catches() {
    let dist = Dist::Steady {
        d: 1_000_000.0,
        jitter: 0.01,
    };
    let mut s = Sim::new(Config::default(), 17);
    s.late = (20_000, 90_000);
    s.ceiling = 50_000;
    s.run(dist, 2_000);
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    s.run(dist, 1_000);
    let explain = fastwake::adaptive::explain(&s.core, None);
    let margin = s.core.prewake().margin_ns().unwrap_or(0);
    assert!(margin > 50_000, "margin {margin}: {explain}");
    let n = s.early + s.caught + s.late_arrivals;
    assert!(n >= 900, "{n} pre-wakes in 1000 waits: {explain}");
    assert!(
        s.caught * 10 >= n * 8,
        "caught {} of {n}: {explain}",
        s.caught
    );
}

/// A steady 1 ms stream with one stray short wait in a hundred (a message
/// sent early, two requests close together): the stray is weighed as an
/// early completion, and the plan stays a pre-wake. Placed by the very
/// shortest recent wait, each stray stopped every pre-wake for the next
/// 64 waits.
#[test]
fn a_stray_short_wait_does_not_stop_the_prewakes() {
    let dist = Dist::Steady {
        d: 1_000_000.0,
        jitter: 0.02,
    };
    let mut s = Sim::new(Config::default(), 23);
    let stream = |s: &mut Sim, n: usize| {
        for i in 0..n {
            let w = if i % 100 == 50 {
                200_000
            } else {
                dist.sample(&mut s.rng)
            };
            s.step(w, Env::default());
        }
    };
    stream(&mut s, 1_000);
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    stream(&mut s, 1_000);
    let n = s.early + s.caught + s.late_arrivals;
    let explain = fastwake::adaptive::explain(&s.core, None);
    assert!(n >= 900, "{n} pre-wakes in 1000 waits: {explain}");
    assert!(
        s.caught * 10 >= n * 9,
        "caught {} of {n}: {explain}",
        s.caught
    );
}

/// The probes that measure the timers (planned with the bootstrap margin,
/// 100 µs, before the lateness is known) run whatever the ceiling: the
/// shim's default is 50 µs, and without them no margin would ever be
/// learned, so no pre-wake planned at all.
#[test]
fn timer_probes_run_under_a_ceiling_shorter_than_the_bootstrap_margin() {
    let dist = STEADY_300US;
    let mut s = Sim::new(Config::default(), 5);
    let tiny = Env {
        spin_ceiling_ns: 1_000,
        ..Env::default()
    };
    let mut probes = 0;
    for _ in 0..2_000 {
        let w = dist.sample(&mut s.rng);
        if matches!(s.step(w, tiny), Plan::Prewake { .. }) {
            probes += 1;
        }
        if s.core.prewake().margin_ns().is_some() {
            break;
        }
    }
    assert!(
        probes > 0 && s.core.prewake().margin_ns().is_some(),
        "{probes} probes, margin {:?}: {}",
        s.core.prewake().margin_ns(),
        fastwake::adaptive::explain(&s.core, None)
    );
}

/// Pre-wakes whose completions keep coming before the timer (whatever the
/// cause) are paused for a while, then tried again.
#[test]
fn prewakes_that_keep_coming_early_are_paused() {
    let (mut s, dist) = prewaking(21);
    // Every pre-wake now ends early: the completion before the timer.
    let mut prewakes = 0;
    for _ in 0..200 {
        let p = s.core.plan(s.now, Env::default());
        let (waited, arrival) = match p {
            Plan::Prewake { sleep_ns, .. } => {
                prewakes += 1;
                (
                    sleep_ns / 2,
                    Some(fastwake::adaptive::prewake::Arrival::Early),
                )
            }
            _ => (300_000, None),
        };
        s.core.record(Outcome {
            waited_ns: waited + 5_000,
            spun_ns: 0,
            slept: true,
            wake_ns: None,
            arrival,
            late_ns: None,
        });
        s.now += waited + 10_000;
    }
    let st = s.core.stats();
    assert!(
        st.prewake_pauses >= 1,
        "{}",
        fastwake::adaptive::explain(&s.core, None)
    );
    assert!(prewakes < 60, "{prewakes} pre-wakes planned of 200");
    // After the pause, steady waits bring them back.
    s.now += fastwake::adaptive::learner::PREWAKE_PAUSE_NS;
    s.run(dist, 1_000);
    assert!(
        matches!(s.core.current_plan(), Plan::Prewake { .. }),
        "{}",
        fastwake::adaptive::explain(&s.core, None)
    );
}

/// A burst of very late timers (seen once in CI: 329 µs at p90, in 300
/// µs waits) leaves no room to sleep, so pre-wakes stop; and since only
/// pre-wakes measure the timers, their lateness must age out or they
/// never come back once the timers recover.
#[test]
fn prewakes_come_back_after_a_burst_of_late_timers() {
    let (mut s, dist) = prewaking(5);
    s.late = (320_000, 340_000);
    s.run(dist, 40);
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    s.run(dist, 100);
    assert_eq!(
        s.early + s.caught + s.late_arrivals,
        0,
        "still pre-waking with no room to sleep: {}",
        fastwake::adaptive::explain(&s.core, None)
    );
    // While the timers stay late, the probes cost at most a lateness
    // window's worth of pre-wakes per LATENESS_TTL_WAITS waits.
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    let ttl = fastwake::adaptive::prewake::LATENESS_TTL_WAITS as u64;
    s.run(dist, 4 * ttl as usize);
    let probes = s.early + s.caught + s.late_arrivals;
    let window = fastwake::adaptive::prewake::LATENESS as u64;
    assert!(
        (1..=4 * window).contains(&probes),
        "{probes} probes in {} waits of late timers: {}",
        4 * ttl,
        fastwake::adaptive::explain(&s.core, None)
    );
    // The timers recover: within a few windows of waits the samples age
    // out, the timers are probed and the pre-wakes are back.
    s.late = (3_000, 25_000);
    s.run(dist, 1_000);
    (s.early, s.caught, s.late_arrivals) = (0, 0, 0);
    s.run(dist, 500);
    let n = s.early + s.caught + s.late_arrivals;
    assert!(
        n >= 450 && s.caught >= 400,
        "{n} pre-wakes, {} caught of the last 500 waits: {}",
        s.caught,
        fastwake::adaptive::explain(&s.core, None)
    );
}
