//! A simulated waiter for the adaptive learner's tests: wait times drawn
//! from a distribution, time passed in, no threads and no clocks.
#![allow(dead_code)] // each test binary uses its own subset

use fastwake::adaptive::prewake::Arrival;
use fastwake::adaptive::{Config, Env, Learner, Model, Outcome, Plan};
use fastwake::wait::Allowance;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A wait-time distribution, ns.
#[derive(Debug, Clone, Copy)]
pub enum Dist {
    Exp(f64),
    Const(f64),
    /// With probability p an Exp(short), else Exp(long): bursts and gaps.
    Mix {
        p: f64,
        short: f64,
        long: f64,
    },
    /// A service time: uniform within ± `jitter` of `d`.
    Steady {
        d: f64,
        jitter: f64,
    },
}

impl Dist {
    pub fn sample(&self, r: &mut StdRng) -> u64 {
        let exp = |m: f64, r: &mut StdRng| -m * (1.0 - r.random::<f64>()).ln();
        (match *self {
            Dist::Exp(m) => exp(m, r),
            Dist::Const(c) => c,
            Dist::Mix { p, short, long } => {
                if r.random::<f64>() < p {
                    exp(short, r)
                } else {
                    exp(long, r)
                }
            }
            Dist::Steady { d, jitter } => d * (1.0 + jitter * r.random_range(-1.0..1.0)),
        }) as u64
    }
}

pub struct Sim {
    pub core: Learner,
    /// The CPU cap, kept outside the learner as the wait governor keeps it.
    pub cap: Allowance,
    pub rng: StdRng,
    pub now: u64,
    pub model: Model,
    /// Work between waits, ns.
    pub service: u64,
    pub spun: u64,
    /// Simulated timer lateness of a pre-wake, ns (uniform).
    pub late: (u64, u64),
    /// The true wake-up latency of every sleep the source ends, ns
    /// (`None`: the model's, with jitter). The learner is not told it (a
    /// source that does not date its rings).
    pub early_wake: Option<u64>,
    /// The caller's longest spin, ns (`u64::MAX`: none): told to the
    /// learner in every wait's [`Env`], and cutting a spin as the wait
    /// governor does (a pre-wake's counted from the thread's wake-up).
    pub ceiling: u64,
    /// Pre-wakes by where the completion arrived.
    pub early: u64,
    pub caught: u64,
    pub late_arrivals: u64,
}

impl Sim {
    pub fn new(cfg: Config, seed: u64) -> Sim {
        Sim {
            core: Learner::new(cfg, Model::default()),
            cap: Allowance::new(cfg.cap_pct as u32 * 10_000),
            rng: StdRng::seed_from_u64(seed),
            now: 1_000_000,
            model: Model::default(),
            service: 500,
            spun: 0,
            late: (3_000, 25_000),
            early_wake: None,
            ceiling: u64::MAX,
            early: 0,
            caught: 0,
            late_arrivals: 0,
        }
    }

    /// One wait of true length `w`; the wake-up has jitter, as on a real
    /// machine, so the controller's estimates after a sleep are noisy.
    pub fn step(&mut self, w: u64, env: Env) -> Plan {
        let env = Env {
            allowance_ns: self.cap.refill(self.now),
            spin_ceiling_ns: env.spin_ceiling_ns.min(self.ceiling),
            ..env
        };
        let plan = self.core.plan(self.now, env);
        let b = match plan {
            Plan::Spin(b) => b.min(env.spin_ceiling_ns),
            Plan::Dispatch => 0,
            Plan::Prewake {
                sleep_ns,
                spin_end_ns,
            } => {
                let out = self.prewake(w, sleep_ns, spin_end_ns);
                self.spun += out.spun_ns;
                self.cap.charge(out.spun_ns);
                self.core.record(out);
                self.now += out.waited_ns + self.service;
                return plan;
            }
        };
        let out = if b > 0 && w <= b {
            Outcome {
                waited_ns: w,
                spun_ns: w,
                slept: false,
                wake_ns: None,
                arrival: None,
                late_ns: None,
            }
        } else {
            let jitter = self.rng.random_range(0.6..1.6);
            let wake = self
                .early_wake
                .unwrap_or((self.model.wake_ns * jitter) as u64);
            Outcome {
                waited_ns: w.max(b) + wake,
                spun_ns: b,
                slept: true,
                wake_ns: None,
                arrival: None,
                late_ns: None,
            }
        };
        self.spun += out.spun_ns;
        self.cap.charge(out.spun_ns);
        self.core.record(out);
        self.now += out.waited_ns + self.service;
        plan
    }

    /// A pre-wake of a wait of true length `w`: the timer is late by a
    /// random amount; a completion before the timer wakes the thread as
    /// in interrupt mode.
    pub fn prewake(&mut self, w: u64, sleep: u64, end: u64) -> Outcome {
        let late = self.rng.random_range(self.late.0..=self.late.1);
        let awake = sleep + late;
        let end = end.max(awake).min(awake.saturating_add(self.ceiling));
        let wake = self
            .early_wake
            .unwrap_or((self.model.wake_ns * self.rng.random_range(0.6..1.6)) as u64);
        let (waited_ns, spun_ns, slept, arrival) = if w <= sleep {
            self.early += 1;
            (w + wake, 0, true, Arrival::Early)
        } else if w <= awake {
            // Found at the first look after the timer.
            self.caught += 1;
            (awake, 0, false, Arrival::Caught)
        } else if w <= end {
            self.caught += 1;
            (w, w - awake, false, Arrival::Caught)
        } else {
            self.late_arrivals += 1;
            (w + wake, end - awake, true, Arrival::Late)
        };
        Outcome {
            waited_ns,
            spun_ns,
            slept,
            wake_ns: None,
            arrival: Some(arrival),
            late_ns: (w > sleep).then_some(late),
        }
    }

    pub fn run(&mut self, d: Dist, n: usize) -> Vec<Plan> {
        (0..n)
            .map(|_| {
                let w = d.sample(&mut self.rng);
                self.step(w, Env::default())
            })
            .collect()
    }
}
