//! The shim's configuration: `FASTWAKE_*` environment variables, read once
//! when the library is loaded (see docs/preload.md for the list).
//!
//! Parsing is pure (a function of a lookup closure) so it is testable; the
//! result is published in atomics so hooks read it without locks, from any
//! thread, in a signal handler or in a forked child. Until the loader has
//! run our constructor, every field reads as "off": a hook called that early
//! (from another library's constructor) passes straight through.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// What the shim does with the waits it intercepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Pass every call through unchanged.
    Off = 0,
    /// Spin until the wait's own timeout (still under the CPU cap).
    Poll = 1,
    /// The kernel's blocking wait: the same as off, named for symmetry with
    /// the library's wait modes.
    Interrupt = 2,
    /// Spin for a fixed budget, then block.
    Hybrid = 3,
    /// Spin for a budget the library's adaptive controller learns, then block.
    Adaptive = 4,
    /// `epoll_wait`, `poll`, `select`, `ibv_get_cq_event`: sleep on a futex the per-CPU dispatcher
    /// rings when the fds become ready (see `crate::dispatch`); the other
    /// hooks behave as in `Hybrid`.
    Dispatch = 5,
}

impl Mode {
    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Poll,
            2 => Mode::Interrupt,
            3 => Mode::Hybrid,
            4 => Mode::Adaptive,
            5 => Mode::Dispatch,
            _ => Mode::Off,
        }
    }

    /// The name as `FASTWAKE_MODE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Poll => "poll",
            Mode::Interrupt => "interrupt",
            Mode::Hybrid => "hybrid",
            Mode::Adaptive => "adaptive",
            Mode::Dispatch => "dispatch",
        }
    }

    /// Does this mode ever spin?
    pub fn spins(self) -> bool {
        matches!(
            self,
            Mode::Poll | Mode::Hybrid | Mode::Adaptive | Mode::Dispatch
        )
    }
}

/// Default spin budget (hybrid) and ceiling (adaptive). A loopback TCP
/// request/response on the reference machine leaves the server idle for
/// ~10–20 µs between requests of one client (two ~6 µs wake-ups plus the
/// client's work); 50 µs covers that with margin while capping the waste on
/// a slow peer at ~10 wake-ups' worth of CPU.
pub const DEFAULT_BUDGET_US: u32 = 50;
/// Default CPU cap: spinning may use at most this fraction of one CPU per
/// thread, averaged over a few milliseconds.
pub const DEFAULT_CPU_CAP: f64 = 0.75;

/// The parsed configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    pub mode: Mode,
    pub budget: Duration,
    /// Fraction of one CPU (0 < cap ≤ 1) spinning may use, per thread.
    pub cpu_cap: f64,
    pub verbose: bool,
}

impl Config {
    /// Everything off: what a bad configuration falls back to.
    pub const OFF: Config = Config {
        mode: Mode::Off,
        budget: Duration::from_micros(DEFAULT_BUDGET_US as u64),
        cpu_cap: DEFAULT_CPU_CAP,
        verbose: false,
    };
}

/// Parse the configuration from `get` (the environment). `Err` carries one
/// line for stderr; the caller then passes everything through.
pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let mut c = Config::OFF;
    if let Some(v) = get("FASTWAKE_VERBOSE") {
        c.verbose = match v.trim() {
            "" | "0" | "no" | "false" => false,
            "1" | "yes" | "true" => true,
            _ => {
                return Err(format!(
                    "FASTWAKE_VERBOSE='{v}' is not 0 or 1; passing through"
                ));
            }
        };
    }
    if let Some(v) = get("FASTWAKE_MODE") {
        c.mode = match v.trim() {
            "" | "off" => Mode::Off,
            "poll" => Mode::Poll,
            "interrupt" => Mode::Interrupt,
            "hybrid" => Mode::Hybrid,
            "adaptive" => Mode::Adaptive,
            "dispatch" => Mode::Dispatch,
            _ => {
                return Err(format!(
                    "FASTWAKE_MODE='{v}' is not one of off, poll, interrupt, hybrid, adaptive, dispatch; passing through"
                ));
            }
        };
    }
    if let Some(v) = get("FASTWAKE_BUDGET_US") {
        let t = v.trim();
        let us: u32 = t
            .strip_suffix("us")
            .unwrap_or(t)
            .parse()
            .ok()
            .filter(|&n: &u32| n <= 1_000_000)
            .ok_or_else(|| {
                format!(
                    "FASTWAKE_BUDGET_US='{v}' is not a number of µs in 0..=1000000; passing through"
                )
            })?;
        c.budget = Duration::from_micros(us as u64);
    }
    if let Some(v) = get("FASTWAKE_CPU_CAP") {
        let cap: f64 = v
            .trim()
            .parse()
            .ok()
            .filter(|&x: &f64| x > 0.0 && x <= 1.0)
            .ok_or_else(|| {
                format!("FASTWAKE_CPU_CAP='{v}' is not a fraction in (0, 1]; passing through")
            })?;
        c.cpu_cap = cap;
    }
    Ok(c)
}

static MODE: AtomicU8 = AtomicU8::new(Mode::Off as u8);
static BUDGET_NS: AtomicU64 = AtomicU64::new(0);
/// CPU cap in parts per million.
static CAP_PPM: AtomicU32 = AtomicU32::new(0);
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Publish `c` for the hooks.
pub fn publish(c: &Config) {
    BUDGET_NS.store(c.budget.as_nanos() as u64, Ordering::Relaxed);
    CAP_PPM.store((c.cpu_cap * 1e6) as u32, Ordering::Relaxed);
    VERBOSE.store(c.verbose, Ordering::Relaxed);
    // Mode last: a hook that sees a spinning mode also sees its parameters.
    MODE.store(c.mode as u8, Ordering::Release);
}

/// The mode in force.
#[inline]
pub fn mode() -> Mode {
    Mode::from_u8(MODE.load(Ordering::Acquire))
}

/// The budget in ns (hybrid: fixed; adaptive: ceiling).
#[inline]
pub fn budget_ns() -> u64 {
    BUDGET_NS.load(Ordering::Relaxed)
}

/// The CPU cap in parts per million of one CPU.
#[inline]
pub fn cap_ppm() -> u32 {
    CAP_PPM.load(Ordering::Relaxed)
}

/// Print diagnostics?
#[inline]
pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn empty_environment_is_off() {
        assert_eq!(parse(env(&[])).unwrap(), Config::OFF);
    }

    #[test]
    fn parses_every_variable() {
        let c = parse(env(&[
            ("FASTWAKE_MODE", "adaptive"),
            ("FASTWAKE_BUDGET_US", "30us"),
            ("FASTWAKE_CPU_CAP", "0.5"),
            ("FASTWAKE_VERBOSE", "1"),
        ]))
        .unwrap();
        assert_eq!(c.mode, Mode::Adaptive);
        assert_eq!(c.budget, Duration::from_micros(30));
        assert_eq!(c.cpu_cap, 0.5);
        assert!(c.verbose);
    }

    #[test]
    fn bad_values_give_one_line() {
        for (k, v) in [
            ("FASTWAKE_MODE", "fast"),
            ("FASTWAKE_MODE", "tasks"),
            ("FASTWAKE_BUDGET_US", "-3"),
            ("FASTWAKE_BUDGET_US", "abc"),
            ("FASTWAKE_CPU_CAP", "0"),
            ("FASTWAKE_CPU_CAP", "2"),
            ("FASTWAKE_VERBOSE", "maybe"),
        ] {
            let e = parse(env(&[(k, v)])).unwrap_err();
            assert!(e.contains(k), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
