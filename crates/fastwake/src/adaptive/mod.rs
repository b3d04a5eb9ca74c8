//! Adaptive waiting, the learning half: what the waits have looked like,
//! and which plan that makes best. Pure: no clock, no thread of its own
//! (except the [`pressure`] sampler, which waiters opt into), and nothing
//! about sources, dispatchers or wait modes, so every layer above can use
//! it.
//!
//! No single wait mode wins: polling is fastest but burns a core, interrupt
//! mode is cheap but pays a kernel wake-up (~4 µs cross-core here), hybrid
//! wins only when its fixed budget matches the peer. The [`Learner`] keeps
//! the distribution of a waiter's wait times and picks, per wait, the spin
//! budget minimising expected latency + CPU/worth (0 = interrupt mode, so
//! idle periods and slow peers fall back to plain interrupt mode), or the
//! core's dispatcher where one serves the CPU ([`Plan::Dispatch`]), within
//! the CPU cap ([`Config::cap_pct`]) and never against a producer on the
//! same CPU or a CPU other threads want ([`Env`]).
//!
//! Who feeds it: the wait governor ([`crate::wait::Governor`]), which owns
//! the clock, the CPU cap's allowance, the same-CPU and sibling rules and
//! the back-off after preemption, for the library's
//! [`WaitMode::Adaptive`] and the preload shim alike. A plan costs a
//! histogram increment and, every [`learner::RECOMPUTE_EVERY`] waits, a scan
//! of 85 buckets. Decisions are observable through [`AdaptiveStats`] and
//! [`explain`]. Design notes and measurements: docs/design/adaptive.md.
//!
//! [`WaitMode::Adaptive`]: crate::WaitMode::Adaptive

pub mod hist;
pub mod learner;
pub mod pressure;
pub mod prewake;
pub mod trial;
pub mod trials;

use crate::{Fail, Result};

pub use learner::{Choice, Env, Learner, Model, Outcome, Plan};

/// Settings of adaptive mode (part of [`crate::WaitMode::Adaptive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// Most of one core this waiter may spend spinning, in percent
    /// (1..=100; 100 = no cap).
    pub cap_pct: u8,
    /// How many µs of CPU one µs of latency is worth (λ = 1/worth).
    /// Under a Poisson stream the controller spins when the mean gap is
    /// below about `4.3 µs · worth`: with the default 100, streams slower
    /// than ~2,300 waits/s are served in interrupt mode.
    pub worth: u16,
    /// A waiter averaging fewer waits per second than this over its last
    /// ~512 waits ([`learner::RATE_MEMORY`], each gap counted at most
    /// [`learner::MAX_RATE_GAP_NS`]) is idle: it waits in interrupt mode
    /// whatever the short gaps inside its bursts look like (0 = never).
    /// Waits that found their completion ready at the first look count
    /// too, in runs of [`learner::RATE_RUN`] or more: a waiter behind its
    /// stream ([`learner::Learner::note_found_ready`]).
    /// At 2,000 waits/s that is a quarter of a second, at 10,000/s 50 ms,
    /// so a 10 % duty ON/OFF stream is judged on two or three bursts and
    /// the long idle gaps between them. Why: such a waiter's total
    /// wake-up latency is small in absolute terms (2,000 × ~8 µs = 16 ms
    /// per second), while spinning through its bursts costs many times the
    /// CPU of its interrupt-mode waits (measured: 14× on a 1k/s ON/OFF
    /// stream), so thrift wins.
    pub idle_rate: u32,
    /// Spin at most long enough to catch this percentage of waits (the
    /// quantile of the learned wait times), however far the model would
    /// spin (100 = no limit). Why: past the typical wait, a longer spin
    /// buys only tail latency, and pays for it on every wait that ends
    /// a burst. Always allowed: the CPU-only optimum and the ski-rental
    /// budget (a spin as long as a sleep's own cost, wake-up plus CPU). Measured on a 10k/s ON/OFF
    /// stream: the model alone spun to ~200 µs at 1.46× the CPU of a
    /// 20 µs hybrid for the same p50.
    pub catch_pct: u8,
    /// Use the measured wake-up latency as the model's cost of a sleep
    /// (`wake=learn`) instead of the default 4.3 µs (`wake=model`). Either
    /// way it is measured where the source dates its rings (the channel)
    /// and shown by `explain`, and each slept wait's own wake-up is
    /// subtracted when its length is learned. Why off by default: this
    /// VM's measured wake-ups (12-57 µs, most of it the idle vCPU being
    /// woken by the host) make the model spin through the ends of bursts,
    /// which on a 10k/s ON/OFF stream bought a lower p99 (138 against
    /// 213 µs) for 1.33-1.37x the CPU of a fixed hybrid at the same p50
    /// (docs/design/adaptive.md, "Wake-up latency").
    pub learn_wake: bool,
    /// Plan pre-wakes (`prewake=on`, the default): where the waits are
    /// concentrated, sleep on the source until shortly before the earliest
    /// typical completion, then spin ([`prewake`]). `prewake=off` gives
    /// the controller as it was before pre-wakes, for side-by-side runs.
    pub prewake: bool,
    /// The backlog rule (`backlog=on`, the default): after runs of
    /// completions taken without waiting that show the waiter fell behind,
    /// hold spinning off while that helps (`wait::BACKLOG_RUN`).
    /// `backlog=off` for side-by-side runs.
    pub backlog: bool,
    /// Slice for a sleep on a contended CPU, µs (`slice=100us`, the
    /// default; `slice=off` or 0: none): while the pressure sampler finds
    /// other threads busy on the waiter's CPU, a sleep of a wait runs
    /// under this scheduler slice ([`crate::slice::for_sleep`]) where the
    /// slice trial finds it pays ([`Config::slice_trial`]), so the
    /// waiter, woken by its completion, preempts the neighbour instead of
    /// waiting out its turn; the thread's own slice comes back before the
    /// wait returns. Linux 6.12 or later; elsewhere nothing happens. Why:
    /// beside two bursty neighbours at 100k requests/s a woken waiter
    /// waited behind their slices while its requests queued (see
    /// docs/design/adaptive.md, "A short slice while asleep").
    pub sleep_slice_us: u32,
    /// Try the slice of [`Config::sleep_slice_us`] against none and keep
    /// whichever costs the thread less (`slicetrial=on`, the default;
    /// `slicetrial=off`: every sleep on a contended CPU takes it): the
    /// pressure sampler compares the thread's run-queue delay plus its
    /// CPU time over [`Config::worth`] in adjacent periods with and
    /// without it
    /// ([`trial`]). Why: the slice paid beside bursty neighbours at
    /// 100k requests/s and cost a 10k/s stream beside a hog and bursty
    /// neighbours its p50 (docs/design/adaptive.md, "A short slice while
    /// asleep").
    pub slice_trial: bool,
    /// Try lean spins (spinning through short waits on a contended CPU)
    /// against none and keep them only where they cost the thread less
    /// (`leantrial=on`, the default; `leantrial=off`: lean spins as the
    /// share rule allows): the same trial as the slice's, in turn with it
    /// ([`trials`]). Why: beside a hog and two neighbours that never rest,
    /// a 10k/s Poisson stream spun lean through 78 % of its waits and 93 %
    /// of those spins caught their completion, yet the waiter lost its
    /// CPU between waits (run-queue delay 34.5 % of the time) and its p50
    /// was 5.3× interrupt mode's.
    pub lean_trial: bool,
}

/// Default [`Config::worth`].
pub const DEFAULT_WORTH: u16 = 100;

/// Default [`Config::idle_rate`], waits per second.
pub const DEFAULT_IDLE_RATE: u32 = 2_000;

/// Default [`Config::catch_pct`].
pub const DEFAULT_CATCH_PCT: u8 = 90;

/// Default [`Config::sleep_slice_us`]: the shortest slice the kernel
/// takes.
pub const DEFAULT_SLEEP_SLICE_US: u32 = 100;

impl Config {
    /// The defaults, as a constant.
    pub const DEFAULT: Config = Config {
        cap_pct: 100,
        worth: DEFAULT_WORTH,
        idle_rate: DEFAULT_IDLE_RATE,
        catch_pct: DEFAULT_CATCH_PCT,
        learn_wake: false,
        prewake: true,
        backlog: true,
        sleep_slice_us: DEFAULT_SLEEP_SLICE_US,
        slice_trial: true,
        lean_trial: true,
    };
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("adaptive")?;
        let mut sep = ':';
        if self.cap_pct != 100 {
            write!(f, "{sep}cap={}%", self.cap_pct)?;
            sep = ',';
        }
        if self.worth != DEFAULT_WORTH {
            write!(f, "{sep}worth={}", self.worth)?;
            sep = ',';
        }
        if self.idle_rate != DEFAULT_IDLE_RATE {
            write!(f, "{sep}idle={}", self.idle_rate)?;
            sep = ',';
        }
        if self.catch_pct != DEFAULT_CATCH_PCT {
            write!(f, "{sep}catch={}%", self.catch_pct)?;
            sep = ',';
        }
        if self.learn_wake {
            write!(f, "{sep}wake=learn")?;
            sep = ',';
        }
        if !self.prewake {
            write!(f, "{sep}prewake=off")?;
            sep = ',';
        }
        if !self.backlog {
            write!(f, "{sep}backlog=off")?;
            sep = ',';
        }
        if self.sleep_slice_us != DEFAULT_SLEEP_SLICE_US {
            match self.sleep_slice_us {
                0 => write!(f, "{sep}slice=off")?,
                us => write!(f, "{sep}slice={us}us")?,
            }
            sep = ',';
        }
        if !self.slice_trial {
            write!(f, "{sep}slicetrial=off")?;
            sep = ',';
        }
        if !self.lean_trial {
            write!(f, "{sep}leantrial=off")?;
        }
        Ok(())
    }
}

impl Config {
    /// Parse the part after `adaptive:`: comma-separated `cap=N%` (a
    /// share of one core in the one grammar, [`crate::grammar::share`]:
    /// `cap=20%`, `cap=0.2`, `cap=20`), `worth=N`, `idle=N` (waits/s) and
    /// `catch=N%` (percent of waits a spin should catch; 100 = no limit),
    /// `wake=learn|model` ([`Config::learn_wake`]), `prewake=on|off`
    /// ([`Config::prewake`]), `backlog=on|off` ([`Config::backlog`]),
    /// `slice=DURATION|off` ([`Config::sleep_slice_us`], 100us to 100ms),
    /// `slicetrial=on|off` ([`Config::slice_trial`]) and
    /// `leantrial=on|off` ([`Config::lean_trial`]).
    pub fn parse_options(s: &str) -> Result<Config> {
        let mut c = Config::default();
        for kv in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                Fail::invalid(format!(
                    "bad adaptive option '{kv}': expected cap=N%, worth=N, idle=N, catch=N%, wake=learn|model, prewake=on|off, backlog=on|off, slice=DURATION|off, slicetrial=on|off or leantrial=on|off"
                ))
            })?;
            match k.trim() {
                "cap" => c.cap_pct = percent(v, 1, "cap", "of a core")?,
                "worth" => {
                    c.worth = v.trim().parse::<u16>().ok().filter(|w| *w >= 1).ok_or_else(|| {
                        Fail::invalid(format!(
                            "bad adaptive worth '{v}': expected 1 to 65535 (µs of CPU per µs of latency)"
                        ))
                    })?;
                }
                "idle" => {
                    c.idle_rate = v.trim().parse::<u32>().ok().ok_or_else(|| {
                        Fail::invalid(format!(
                            "bad adaptive idle rate '{v}': expected waits per second (0 = off)"
                        ))
                    })?;
                }
                "catch" => c.catch_pct = percent(v, 50, "catch", "of waits")?,
                "wake" => {
                    c.learn_wake = match v.trim() {
                        "learn" => true,
                        "model" => false,
                        _ => {
                            return Err(Fail::invalid(format!(
                                "bad adaptive wake '{v}': expected learn or model"
                            )));
                        }
                    }
                }
                "prewake" => c.prewake = on_off(v, "prewake")?,
                "backlog" => c.backlog = on_off(v, "backlog")?,
                "slicetrial" => c.slice_trial = on_off(v, "slicetrial")?,
                "leantrial" => c.lean_trial = on_off(v, "leantrial")?,
                "slice" => {
                    c.sleep_slice_us = match v.trim() {
                        "off" | "0" => 0,
                        d => crate::slice::parse(d)
                            .map_err(|e| Fail::invalid(format!("bad adaptive slice '{d}': {e}")))?
                            .as_micros() as u32,
                    }
                }
                other => {
                    return Err(Fail::invalid(format!(
                        "unknown adaptive option '{other}': expected cap, worth, idle, catch, wake, prewake, backlog, slice, slicetrial or leantrial"
                    )));
                }
            }
        }
        Ok(c)
    }
}

fn on_off(v: &str, what: &str) -> Result<bool> {
    match v.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(Fail::invalid(format!(
            "bad adaptive {what} '{v}': expected on or off"
        ))),
    }
}

/// A share in the one grammar ([`crate::grammar::share`]: `20%`, `0.2`,
/// `20`), as whole percent from `lo` to 100.
fn percent(v: &str, lo: u8, what: &str, of: &str) -> Result<u8> {
    crate::grammar::share(v)
        .ok()
        .map(|f| (f * 100.0).round() as u8)
        .filter(|p| (lo..=100).contains(p))
        .ok_or_else(|| {
            Fail::invalid(format!(
                "bad adaptive {what} '{v}': expected {lo}% to 100% {of} (or a fraction, e.g. 0.2)"
            ))
        })
}

/// Why a wait was done the way it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Spun with the learned budget.
    Spin,
    /// Interrupt mode: not enough waits seen yet.
    Learning,
    /// Interrupt mode: the waits are long (idle or slow peer), spinning
    /// would cost more than it saves.
    LongWaits,
    /// Interrupt mode: fewer waits per second than [`Config::idle_rate`].
    IdleRate,
    /// Spun on a contended CPU: with the model's budget (no catch limit)
    /// while that spin is a small share of the core over the long run,
    /// else with the catch-limited one, else with the budget of the
    /// CPU-only objective, each while its share is small.
    LeanSpin,
    /// Interrupt mode: the producer runs on this CPU.
    SameCpu,
    /// Interrupt mode: another thread of this process waits on this CPU
    /// and no dispatcher serves it (with one, the wait is dispatched).
    Siblings,
    /// Interrupt mode: other threads want this CPU.
    Contended,
    /// Interrupt mode: the CPU cap's allowance is spent.
    Cap,
    /// Handed to the core's dispatcher.
    Dispatch,
    /// Slept on the source until shortly before the earliest typical
    /// completion, then spun ([`Plan::Prewake`]).
    Prewake,
    /// Interrupt mode: the waiter fell behind lately ([`Env::behind`]).
    Behind,
}

/// Counters of an adaptive waiter: what it decided and why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveStats {
    /// Waits planned (waits that found nothing ready at first look).
    pub decisions: u64,
    /// Waits that spun first.
    pub spins: u64,
    /// Spinning waits caught while spinning.
    pub spin_hits: u64,
    /// Spinning waits that slept after the budget.
    pub spin_misses: u64,
    /// Interrupt-mode waits while learning.
    pub learning: u64,
    /// Interrupt-mode waits because waits were long (idle, slow peer).
    pub long_waits: u64,
    /// Interrupt-mode waits because the waiter averaged fewer waits per
    /// second than [`Config::idle_rate`].
    pub idle_rate: u64,
    /// Spinning waits on a contended CPU (see [`Reason::LeanSpin`]).
    pub lean_spins: u64,
    /// Interrupt-mode waits because the producer shared the CPU.
    pub same_cpu: u64,
    /// Interrupt-mode waits because another thread of this process waited
    /// on the CPU (see [`Reason::Siblings`]).
    pub siblings: u64,
    /// Interrupt-mode waits because the CPU was contended.
    pub contended: u64,
    /// Interrupt-mode waits because the CPU cap's allowance was spent.
    pub capped: u64,
    /// Waits handed to the dispatcher.
    pub dispatched: u64,
    /// Total ns spent spinning.
    pub spin_ns: u64,
    /// Times the model re-ran.
    pub recomputes: u64,
    /// Times the model changed its plan (steady load: stays small).
    pub plan_changes: u64,
    /// The current spin budget, ns.
    pub budget_ns: u64,
    /// Waits planned as pre-wakes (sleep, then spin).
    pub prewakes: u64,
    /// Pre-wakes whose completion came before the timer (woken by the
    /// source, as in interrupt mode).
    pub prewake_early: u64,
    /// Pre-wakes caught while spinning after the timer.
    pub prewake_caught: u64,
    /// Pre-wakes whose completion came after the spin (slept again).
    pub prewake_late: u64,
    /// Times pre-wakes were paused because most recent ones came early
    /// ([`learner::PREWAKE_PAUSE_NS`]).
    pub prewake_pauses: u64,
    /// Backlogs seen: runs of completions taken without waiting long
    /// enough to mean the waiter was off its CPU while they queued.
    pub backlogs: u64,
    /// Interrupt-mode waits because the waiter fell behind lately.
    pub behind: u64,
    /// The pre-wake margin in force, ns: how far before the shortest
    /// recent wait the current plan's timer is set (0: no pre-wake plan).
    pub margin_ns: u64,
    /// Sleeps taken under [`Config::sleep_slice_us`] (the CPU contended).
    pub short_slice_sleeps: u64,
    /// Of those, the sleeps whose slice took over
    /// [`learner::SLOW_GIVE_BACK_NS`] (50 µs) to give back: the
    /// thread, re-placed under its own slice, lost the CPU on the way out
    /// of the wait.
    pub slow_give_backs: u64,
    /// The time those give-backs took, ns.
    pub slow_give_back_ns: u64,
}

impl AdaptiveStats {
    /// All zero (for const contexts).
    pub const ZERO: AdaptiveStats = AdaptiveStats {
        decisions: 0,
        spins: 0,
        spin_hits: 0,
        spin_misses: 0,
        learning: 0,
        long_waits: 0,
        idle_rate: 0,
        lean_spins: 0,
        same_cpu: 0,
        siblings: 0,
        contended: 0,
        capped: 0,
        dispatched: 0,
        spin_ns: 0,
        recomputes: 0,
        plan_changes: 0,
        budget_ns: 0,
        prewakes: 0,
        prewake_early: 0,
        prewake_caught: 0,
        prewake_late: 0,
        prewake_pauses: 0,
        backlogs: 0,
        behind: 0,
        margin_ns: 0,
        short_slice_sleeps: 0,
        slow_give_backs: 0,
        slow_give_back_ns: 0,
    };

    fn count(&mut self, r: Reason) {
        match r {
            Reason::Spin => self.spins += 1,
            Reason::Learning => self.learning += 1,
            Reason::LongWaits => self.long_waits += 1,
            Reason::IdleRate => self.idle_rate += 1,
            Reason::LeanSpin => {
                self.spins += 1;
                self.lean_spins += 1;
            }
            Reason::SameCpu => self.same_cpu += 1,
            Reason::Siblings => self.siblings += 1,
            Reason::Contended => self.contended += 1,
            Reason::Cap => self.capped += 1,
            Reason::Dispatch => self.dispatched += 1,
            Reason::Prewake => self.prewakes += 1,
            Reason::Behind => self.behind += 1,
        }
    }
}

/// One line: what a learner decided and why, with the pressure sampler's
/// view of its CPU when there is one.
pub fn explain(learner: &Learner, shared: Option<&pressure::Shared>) -> String {
    let s = learner.stats();
    let h = learner.hist();
    let pct = |n: u64| {
        if s.decisions == 0 {
            0.0
        } else {
            100.0 * n as f64 / s.decisions as f64
        }
    };
    let mut out = format!(
        "{}: {} waits: spin {:.0}% (hit {}, miss {}; lean {:.0}%), interrupt: long-waits {:.0}% idle-rate {:.0}% contended {:.0}% same-cpu {:.0}% siblings {:.0}% cap {:.0}% learning {:.0}%, dispatch {:.0}%; budget {:.1}us (lean {:.1}us); rate {:.0}/s, busy {:.0}% of the time; wait p50 {:.1}us p90 {:.1}us; spun {:.3}s; plan changes {}",
        learner.config(),
        s.decisions,
        pct(s.spins),
        s.spin_hits,
        s.spin_misses,
        pct(s.lean_spins),
        pct(s.long_waits),
        pct(s.idle_rate),
        pct(s.contended),
        pct(s.same_cpu),
        pct(s.siblings),
        pct(s.capped),
        pct(s.learning),
        pct(s.dispatched),
        s.budget_ns as f64 / 1000.0,
        learner.lean_budget() as f64 / 1000.0,
        learner.rate(),
        100.0 * learner.busy_share(),
        h.quantile(0.5) as f64 / 1000.0,
        h.quantile(0.9) as f64 / 1000.0,
        s.spin_ns as f64 / 1e9,
        s.plan_changes,
    );
    if learner.catch_budget() != u64::MAX {
        out += &format!(
            "; catch {}% ≤ {:.1}us",
            learner.config().catch_pct,
            learner.catch_budget() as f64 / 1000.0
        );
    }
    let source = |n: u32| match n {
        0 => "model default".to_string(),
        n => format!("{n} measured"),
    };
    out += &format!(
        "; sleep cpu {:.1}us ({}); wake {:.1}us ({}",
        learner.model().sleep_cpu_ns / 1000.0,
        source(learner.sleep_samples()),
        learner.model().wake_ns / 1000.0,
        if learner.config().learn_wake {
            source(learner.wake_samples())
        } else {
            "model".to_string()
        },
    );
    if !learner.config().learn_wake && learner.wake_samples() > 0 {
        out += &format!(
            ", measured {:.1}us over {}",
            learner.measured_wake_ns() / 1000.0,
            learner.wake_samples()
        );
    }
    out += ")";
    if s.backlogs > 0 {
        out += &format!(
            "; backlogs {} (interrupt while behind {:.0}%)",
            s.backlogs,
            pct(s.behind)
        );
    }
    if s.short_slice_sleeps > 0 {
        out += &format!(
            "; short slice for {} sleeps (CPU contended; {} lost the CPU giving it back, {:.1} ms)",
            s.short_slice_sleeps,
            s.slow_give_backs,
            s.slow_give_back_ns as f64 / 1e6
        );
    }
    if s.prewakes > 0 || learner.prewake().lateness_samples() > 0 {
        let plan = match learner.current_plan() {
            Plan::Prewake {
                sleep_ns,
                spin_end_ns,
            } => format!(
                "sleep {:.1}us spin to {:.1}us",
                sleep_ns as f64 / 1000.0,
                spin_end_ns as f64 / 1000.0
            ),
            _ => "not now".into(),
        };
        let mut lateness = match learner.prewake().margin_ns() {
            Some(m) => format!(
                "p90 {:.1}us over {} samples",
                (m - prewake::MARGIN_GUARD_NS) as f64 / 1000.0,
                learner.prewake().lateness_samples()
            ),
            None => "not measured yet".into(),
        };
        if let n @ 1.. = learner.prewake().lateness_forgotten() {
            lateness += &format!(", forgotten as stale {n}x");
        }
        out += &format!(
            "; prewake {:.0}% ({plan}; caught {}, early {}, late {}; paused {}; margin {:.1}us; timer lateness {lateness})",
            pct(s.prewakes),
            s.prewake_caught,
            s.prewake_early,
            s.prewake_late,
            s.prewake_pauses,
            s.margin_ns as f64 / 1000.0,
        );
    }
    if let Some(c) = learner.choice() {
        out += &format!("; model: p_hit {:.2} spin-frac {:.2}", c.p_hit, c.spin_frac);
    }
    if let Some(sh) = shared {
        out += &format!("; {}", sh.describe());
        let c = learner.config();
        if let Some(t) = sh
            .trials()
            .describe(c.slice_trial && c.sleep_slice_us > 0, c.lean_trial)
        {
            out += &format!("; {t}");
        }
    }
    out
}
