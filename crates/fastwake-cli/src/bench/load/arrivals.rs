//! The request streams: which pattern (Poisson, ON/OFF bursts, closed
//! loop with a service time), the scenario that names it, and the
//! seeded arrival schedule an open-loop producer follows.

use super::background;
use fastwake::{Fail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pattern {
    Poisson,
    OnOff,
    Service,
    ServiceTail,
}

impl Pattern {
    pub(super) fn parse(s: &str) -> Result<Pattern> {
        match s.trim() {
            "poisson" => Ok(Pattern::Poisson),
            "onoff" | "on-off" | "bursts" => Ok(Pattern::OnOff),
            "service" => Ok(Pattern::Service),
            "service-tail" => Ok(Pattern::ServiceTail),
            o => Err(Fail::invalid(format!(
                "unknown pattern '{o}': expected poisson, onoff, service or service-tail"
            ))),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Pattern::Poisson => "poisson",
            Pattern::OnOff => "onoff",
            Pattern::Service => "service",
            Pattern::ServiceTail => "service-tail",
        }
    }

    /// Closed loop with a service time (`rate` is then the service time
    /// in µs).
    pub(super) fn closed(self) -> bool {
        matches!(self, Pattern::Service | Pattern::ServiceTail)
    }
}

/// ON/OFF: bursts at this multiple of the nominal rate...
const BURST_FACTOR: f64 = 10.0;
/// ...lasting this long on average...
const MEAN_ON_NS: f64 = 2_000_000.0;
/// ...separated by idle periods this long on average (duty 10 %).
const MEAN_OFF_NS: f64 = 18_000_000.0;

#[derive(Debug, Clone, Copy)]
pub(super) struct Scenario {
    pub(super) pattern: Pattern,
    /// Requests per second; for a closed pattern, the service time in µs.
    pub(super) rate: u64,
    pub(super) hog: bool,
    pub(super) bg: Option<background::Background>,
}

impl Scenario {
    pub(super) fn name(&self) -> String {
        let r = if self.pattern.closed() {
            format!("{}us", self.rate)
        } else if self.rate >= 1000 && self.rate.is_multiple_of(1000) {
            format!("{}k", self.rate / 1000)
        } else {
            self.rate.to_string()
        };
        format!(
            "{}-{}{}{}",
            self.pattern.name(),
            r,
            if self.hog { "+hog" } else { "" },
            self.bg.map_or(String::new(), |b| format!("+{}", b.name()))
        )
    }
}

/// The arrival schedule, ns on the shared clock.
pub(super) struct Arrivals {
    rng: StdRng,
    pattern: Pattern,
    mean_gap: f64,
    next: f64,
    on_end: f64,
}

impl Arrivals {
    pub(super) fn new(pattern: Pattern, rate: u64, start: u64, seed: u64) -> Arrivals {
        let mut a = Arrivals {
            rng: StdRng::seed_from_u64(seed),
            pattern,
            mean_gap: 1e9 / rate as f64,
            next: start as f64,
            on_end: 0.0,
        };
        if pattern == Pattern::OnOff {
            a.mean_gap /= BURST_FACTOR;
            a.on_end = a.next + a.exp(MEAN_ON_NS);
        }
        a
    }

    pub(super) fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.rng.random::<f64>()).ln()
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut t = self.next + self.exp(self.mean_gap);
        if self.pattern == Pattern::OnOff && t > self.on_end {
            t = self.on_end + self.exp(MEAN_OFF_NS);
            self.on_end = t + self.exp(MEAN_ON_NS);
        }
        self.next = t;
        t as u64
    }
}
