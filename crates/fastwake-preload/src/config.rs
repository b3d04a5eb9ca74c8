//! The shim's configuration: `FASTWAKE_*` environment variables, read once
//! when the library is loaded (see docs/preload.md for the list).
//!
//! Parsing is pure (a function of a lookup closure) so it is testable; the
//! result is published once, in a `OnceLock`, so hooks read it without locks, from any
//! thread, in a signal handler or in a forked child. Until the loader has
//! run our constructor, every field reads as "off": a hook called that early
//! (from another library's constructor) passes straight through.

use fastwake::WaitMode;
use fastwake::wait::Governor;
use std::sync::OnceLock;
use std::time::Duration;

/// Default CPU cap: spinning may use at most this fraction of one CPU per
/// thread (the governor's allowance: averaged over up to 100 ms).
pub const DEFAULT_CPU_CAP: f64 = 0.75;

/// The parsed configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The library's wait mode the hooks apply; `None`: off, every call
    /// passes through unchanged.
    pub mode: Option<WaitMode>,
    /// `hybrid`'s budget, `adaptive`'s ceiling, and the budget of the waits
    /// `dispatch` cannot dispatch (`FASTWAKE_BUDGET_US`).
    pub budget: Duration,
    /// Fraction of one CPU (0 < cap ≤ 1) spinning may use, per thread.
    pub cpu_cap: f64,
    pub verbose: bool,
}

impl Config {
    /// Everything off: what a bad configuration falls back to.
    pub const OFF: Config = Config {
        mode: None,
        budget: fastwake::wait::DEFAULT_BUDGET,
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
            "" | "off" => None,
            m => Some(m.parse::<WaitMode>().map_err(|e| {
                format!(
                    "FASTWAKE_MODE='{v}': {} (or off); passing through",
                    e.to_string().replace('\n', " ")
                )
            })?),
        };
        // hybrid:Nus names the budget the shim reports and spins;
        // FASTWAKE_BUDGET_US, when given, still overrides it (below).
        if let Some(WaitMode::Hybrid { budget }) = c.mode {
            c.budget = budget;
        }
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
        if let Some(WaitMode::Hybrid { budget }) = &mut c.mode {
            *budget = c.budget;
        }
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

/// The configuration in force, set once by the library's constructor.
/// Read by every hook: after it is set, one acquire load; until then
/// (a hook called from another library's constructor) everything reads
/// as off. Memory, so a forked child and a signal handler see it too.
static CONFIG: OnceLock<Published> = OnceLock::new();

struct Published {
    cfg: Config,
    /// What each thread's governor starts from.
    governor: Governor,
}

/// Publish `c` for the hooks (once; later calls are ignored).
pub fn publish(c: &Config) {
    let governor = c.mode.map_or(Governor::new(WaitMode::Interrupt), |m| {
        let g = Governor::new(m)
            .with_ceiling(c.budget.as_nanos() as u64)
            .with_cap((c.cpu_cap * 1e6) as u32);
        match m {
            // Adaptive's own cap, when given (adaptive:cap=N%), is the
            // tighter of the two.
            WaitMode::Adaptive(a) => {
                g.with_cap(((c.cpu_cap * 1e6) as u32).min(a.cap_pct as u32 * 10_000))
            }
            _ => g,
        }
    });
    let _ = CONFIG.set(Published { cfg: *c, governor });
}

/// The mode in force (`None`: off).
#[inline]
pub fn mode() -> Option<WaitMode> {
    CONFIG.get().and_then(|p| p.cfg.mode)
}

/// Is the mode `dispatch`?
#[inline]
pub fn dispatch() -> bool {
    mode() == Some(WaitMode::Dispatch)
}

/// A new thread's governor (the mode with the configured ceiling and cap).
pub fn governor() -> Governor {
    CONFIG
        .get()
        .map_or(Governor::new(WaitMode::Interrupt), |p| p.governor.clone())
}

/// Print diagnostics?
#[inline]
pub fn verbose() -> bool {
    CONFIG.get().is_some_and(|p| p.cfg.verbose)
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
        assert_eq!(c.mode, Some(WaitMode::Adaptive(Default::default())));
        assert_eq!(c.budget, Duration::from_micros(30));
        assert_eq!(c.cpu_cap, 0.5);
        assert!(c.verbose);
    }

    #[test]
    fn bad_values_give_one_line() {
        for (k, v) in [
            ("FASTWAKE_MODE", "fast"),
            ("FASTWAKE_MODE", "tasks"),
            ("FASTWAKE_MODE", "hybrid:x"),
            ("FASTWAKE_MODE", "adaptive:cap=200%"),
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
