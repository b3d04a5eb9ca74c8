//! The learner's figures: what each plan is predicted to cost (spin,
//! latency, CPU share) over the recent waits, and the search for the
//! cheapest plan that fits the CPU cap.

use super::{
    Choice, Env, Learner, MAX_BUDGET_NS, MIN_BUDGET_NS, MIN_WEIGHT, Plan, SWITCH_FLOOR_NS,
    SWITCH_MARGIN,
};
use crate::adaptive::hist;
use crate::adaptive::prewake::{self, Candidate};

impl Learner {
    /// A pre-wake plan's predicted figures over the recent waits (`None`:
    /// not a pre-wake, or too few waits).
    pub(super) fn prewake_figures(&self, plan: Plan) -> Option<prewake::Figures> {
        let Plan::Prewake {
            sleep_ns,
            spin_end_ns,
        } = plan
        else {
            return None;
        };
        let c = Candidate {
            sleep_ns,
            spin_end_ns,
        };
        self.prewake.evaluate(c, self.prewake_costs())
    }

    pub(super) fn prewake_costs(&self) -> prewake::Costs {
        prewake::Costs {
            wake_ns: self.model.wake_ns,
            sleep_cpu_ns: self.model.sleep_cpu_ns,
            worth: self.cfg.worth.max(1) as f64,
            spin_max_ns: self.spin_ceiling_ns,
        }
    }

    /// The model's figures for a pre-wake's predicted figures.
    pub(super) fn prewake_choice(&self, f: prewake::Figures) -> Choice {
        Choice {
            plan: Plan::prewake(f.plan),
            cost: f.cost,
            p_hit: f.p_hit,
            spin_frac: self.frac(f.spin),
            cpu: f.cpu,
        }
    }

    /// Of the learned waits, the share that ends within `b` and their
    /// contribution to the mean (Σ w·W over those, / total); `None` before
    /// any wait.
    pub(super) fn within(&self, b: u64) -> Option<(f64, f64)> {
        let total = self.hist.total() as f64;
        if total <= 0.0 {
            return None;
        }
        let (mut w_le, mut s_le) = (0.0f64, 0.0f64);
        for i in 0..hist::BUCKETS {
            if hist::upper(i) > b {
                break;
            }
            let w = self.hist.weight(i) as f64;
            w_le += w;
            s_le += w * hist::mid(i) as f64;
        }
        Some((w_le / total, s_le / total))
    }

    /// Expected spin per wait with budget `b`, ns: E[min(W, b)].
    pub(super) fn spin_per_wait(&self, b: u64) -> f64 {
        self.within(b).map_or(0.0, |(p_le, mean_le)| {
            mean_le + (1.0 - p_le).max(0.0) * b as f64
        })
    }

    /// Share of a core that spinning with budget `b` takes over the long
    /// run (the long-run gap, not the last few dozen waits: the scheduler's
    /// fairness remembers a burst's spin through the idle gap after it).
    pub(super) fn long_run_share(&self, b: u64) -> f64 {
        self.share_of(self.spin_per_wait(b))
    }

    /// Share of a core that spinning `spin_ns` per wait takes over the
    /// long run.
    pub(super) fn share_of(&self, spin_ns: f64) -> f64 {
        let gap = if self.win_waits >= MIN_WEIGHT as f64 {
            self.win_ns / self.win_waits
        } else {
            self.long_gap_ns
        };
        if gap <= 0.0 {
            return 1.0;
        }
        (spin_ns / gap).min(1.0)
    }

    /// Is `c` within the switching margin of the optimum `j_min`?
    pub(super) fn near_optimal(&self, c: &Choice, j_min: f64) -> bool {
        c.cost <= j_min * (1.0 + SWITCH_MARGIN) + SWITCH_FLOOR_NS
    }

    /// The model's figures for one plan; `None` if the plan is not allowed
    /// (over the cap, or no dispatcher).
    pub(super) fn figures(&self, plan: Plan, env: Env) -> Option<Choice> {
        let total = self.hist.total() as f64;
        if total <= 0.0 {
            return None;
        }
        let worth = self.cfg.worth.max(1) as f64;
        let m = &self.model;
        match plan {
            Plan::Spin(b) => {
                let (p_le, mean_le) = self.within(b)?;
                Some(self.spin_figures(b, p_le, mean_le)).filter(|c| self.fits(c))
            }
            Plan::Dispatch => {
                let n = env.dispatch_waiters? as f64;
                // The dispatcher spins through the gaps on idle CPU, shared
                // by the n waiters of its core.
                let mean = (0..hist::BUCKETS)
                    .map(|i| self.hist.weight(i) as f64 * hist::mid(i) as f64)
                    .sum::<f64>()
                    / total;
                let cpu = m.dispatch_cpu_ns + mean / n.max(1.0);
                Some(Choice {
                    plan,
                    cost: m.dispatch_ns + cpu / worth,
                    p_hit: 0.0,
                    spin_frac: self.frac(mean / n.max(1.0)),
                    cpu,
                })
                .filter(|c| self.fits(c))
            }
            Plan::Prewake { .. } => self
                .prewake_figures(plan)
                .map(|f| self.prewake_choice(f))
                .filter(|c| self.fits(c)),
        }
    }

    pub(super) fn spin_figures(&self, b: u64, p_le: f64, mean_le: f64) -> Choice {
        self.spin_figures_at(b, p_le, mean_le, self.cfg.worth.max(1) as f64)
    }

    pub(super) fn spin_figures_at(&self, b: u64, p_le: f64, mean_le: f64, worth: f64) -> Choice {
        let m = &self.model;
        let p_over = (1.0 - p_le).max(0.0);
        let spin = mean_le + p_over * b as f64;
        let cpu = spin + p_over * m.sleep_cpu_ns;
        Choice {
            plan: Plan::Spin(b),
            cost: p_over * m.wake_ns + cpu / worth,
            p_hit: p_le,
            spin_frac: self.frac(spin),
            cpu,
        }
    }

    /// Fraction of a core that spinning `spin_ns` per wait costs at the
    /// current wait rate.
    pub(super) fn frac(&self, spin_ns: f64) -> f64 {
        if self.cycle_ns <= 0.0 {
            return 0.0;
        }
        (spin_ns / self.cycle_ns).min(1.0)
    }

    pub(super) fn fits(&self, c: &Choice) -> bool {
        !self.capped() || c.spin_frac <= self.cap()
    }

    /// The plan to take, and the minimum objective: interrupt mode when it
    /// is within the switching margin of the minimum (near the optimum J is
    /// flat while CPU is not: a 5 µs spin on a 1 ms gap barely moves J but
    /// nearly triples the CPU of interrupt mode), else the plan with the
    /// least J.
    /// Also returns the plan to take where a pre-wake cannot be done
    /// ([`Env::prewake`]).
    pub(super) fn evaluate(&self, env: Env, prewake: bool) -> Option<(Choice, f64, Plan)> {
        let interrupt = self.spin_figures(0, 0.0, 0.0);
        let mut best = self.best_spin(self.cfg.worth.max(1) as f64)?;
        if let Some(d) = self.figures(Plan::Dispatch, env)
            && d.cost < best.cost
        {
            best = d;
        }
        let fallback = if self.near_optimal(&interrupt, best.cost) {
            interrupt.plan
        } else {
            best.plan
        };
        if self.cfg.prewake
            && prewake
            && let Some(p) = self.prewake.best(self.prewake_costs())
            && let c = self.prewake_choice(p)
            && self.fits(&c)
            && c.cost < best.cost
        {
            best = c;
        }
        let j_min = best.cost;
        if self.near_optimal(&interrupt, j_min) {
            best = interrupt;
        }
        Some((best, j_min, fallback))
    }

    /// The spin budget (0 = interrupt mode) with the least J at `worth`,
    /// within the cap.
    pub(super) fn best_spin(&self, worth: f64) -> Option<Choice> {
        let total = self.hist.total() as f64;
        if total <= 0.0 {
            return None;
        }
        let mut best = self.spin_figures_at(0, 0.0, 0.0, worth);
        let (mut w_le, mut s_le) = (0.0f64, 0.0f64);
        let top = (0..hist::BUCKETS)
            .rev()
            .find(|&i| self.hist.weight(i) > 1e-3)
            .unwrap_or(0);
        for i in 0..=top {
            let b = hist::upper(i);
            if b > MAX_BUDGET_NS {
                break;
            }
            let w = self.hist.weight(i) as f64;
            w_le += w;
            s_le += w * hist::mid(i) as f64;
            if w <= 0.0 {
                continue;
            }
            if b < MIN_BUDGET_NS {
                continue;
            }
            let c = self.spin_figures_at(b, w_le / total, s_le / total, worth);
            if self.fits(&c) && c.cost < best.cost {
                best = c;
            }
        }
        Some(best)
    }
}
