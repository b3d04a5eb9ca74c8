//! The shim's configuration: `FASTWAKE_*` environment variables, read once
//! when the library is loaded (see docs/reference/environment.md for the list).
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
    /// Threads that busy-poll sleep when idle (`FASTWAKE_POLLERS=sleep`;
    /// `crate::pollers`). Off by default: it changes a program's timing
    /// beyond its waits.
    pub pollers: bool,
    /// The scheduler slice each thread the shim serves asks for, at its
    /// first wait (`FASTWAKE_SLICE`; `fastwake::slice`). Off by default:
    /// it changes how the thread is scheduled while it computes too.
    pub slice: Option<Duration>,
}

impl Config {
    /// Everything off: what a bad configuration falls back to.
    pub const OFF: Config = Config {
        mode: None,
        budget: fastwake::wait::DEFAULT_BUDGET,
        cpu_cap: DEFAULT_CPU_CAP,
        verbose: false,
        pollers: false,
        slice: None,
    };
}

/// A named set of settings (`FASTWAKE_PROFILE`, `fastwake run --profile`),
/// as OpenOnload's `--profile=latency` and libvma's `VMA_SPEC=latency`
/// give their users. A profile only sets defaults: `FASTWAKE_MODE`,
/// `FASTWAKE_BUDGET_US` and `FASTWAKE_CPU_CAP` given beside it win.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `hybrid:1ms`, cap 100 %: every wait spins up to 1 ms before it
    /// sleeps, whatever it costs (a waiting thread may hold its CPU
    /// busy); for a latency-critical program on CPUs of its own.
    Latency,
    /// `adaptive`, ceiling 50 µs, cap 75 %: spins only where the
    /// adaptive controller finds it pays.
    Balanced,
    /// `adaptive`, ceiling 50 µs, cap 10 %: spins where it pays, never
    /// more than a tenth of a CPU per thread.
    Power,
}

impl Profile {
    /// Every profile, by name (the CLI's `--profile` values are checked
    /// against these names by a test).
    pub const ALL: [(&'static str, Profile); 3] = [
        ("latency", Profile::Latency),
        ("balanced", Profile::Balanced),
        ("power", Profile::Power),
    ];

    /// The settings the profile stands for.
    pub fn config(self) -> Config {
        let adaptive = WaitMode::Adaptive(Default::default());
        let (mode, budget, cpu_cap) = match self {
            Profile::Latency => (
                WaitMode::Hybrid {
                    budget: Duration::from_millis(1),
                },
                Duration::from_millis(1),
                1.0,
            ),
            Profile::Balanced => (adaptive, fastwake::wait::DEFAULT_BUDGET, DEFAULT_CPU_CAP),
            Profile::Power => (adaptive, fastwake::wait::DEFAULT_BUDGET, 0.10),
        };
        Config {
            mode: Some(mode),
            budget,
            cpu_cap,
            verbose: false,
            pollers: false,
            slice: None,
        }
    }
}

/// Every variable the shim (or `fastwake run`, or the project's scripts)
/// reads; [`unknown_variables`] warns about any other `FASTWAKE_*` name.
pub const KNOWN: [&str; 11] = [
    "FASTWAKE_MODE",
    "FASTWAKE_PROFILE",
    "FASTWAKE_BUDGET_US",
    "FASTWAKE_CPU_CAP",
    "FASTWAKE_VERBOSE",
    "FASTWAKE_VERBS_VECTOR",
    "FASTWAKE_PRELOAD",
    "FASTWAKE_STALL_MS",
    "FASTWAKE_ODP",
    "FASTWAKE_POLLERS",
    "FASTWAKE_SLICE",
];

/// Families of variables that belong to the project's own scripts
/// (scripts/rxe-test, the test suites), which a shimmed program inherits.
const KNOWN_PREFIXES: [&str; 2] = ["FASTWAKE_RXE_", "FASTWAKE_TEST_"];

/// One line for each `FASTWAKE_*` variable in `names` the shim does not
/// know, naming the nearest known one: a misspelt variable (say
/// `FASTWAKE_BUDGET=-5` for `FASTWAKE_BUDGET_US`) would otherwise be
/// ignored without a word.
pub fn unknown_variables<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    names
        .filter(|n| n.starts_with("FASTWAKE_"))
        .filter(|n| !KNOWN.contains(n) && !KNOWN_PREFIXES.iter().any(|p| n.starts_with(p)))
        .map(|n| {
            let near = KNOWN
                .iter()
                .min_by_key(|k| distance(n, k))
                .filter(|k| distance(n, k) <= 4 || k.starts_with(n) || n.starts_with(*k));
            match near {
                Some(k) => format!("unknown variable {n} ignored (did you mean {k}?)"),
                None => format!("unknown variable {n} ignored (known: {})", KNOWN.join(", ")),
            }
        })
        .collect()
}

/// Edit distance (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + (ca != *cb) as usize).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Parse the configuration from `get` (the environment). `Err` carries one
/// line for stderr; the caller then passes everything through. Values use
/// the library's one grammar ([`fastwake::grammar`]): the same strings
/// `fastwake run`, `fastwake bench` and the C ABI take.
pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let mut c = Config::OFF;
    if let Some(v) = get("FASTWAKE_PROFILE") {
        let name = v.trim();
        if !name.is_empty() {
            let p = Profile::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| *p)
                .ok_or_else(|| {
                    format!(
                        "FASTWAKE_PROFILE='{v}': expected latency, balanced or power; passing through"
                    )
                })?;
            c = p.config();
        }
    }
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
            "" => None,
            m => WaitMode::parse_or_off(m).map_err(|e| {
                format!(
                    "FASTWAKE_MODE='{v}': {}; passing through",
                    e.to_string().replace('\n', " ")
                )
            })?,
        };
        // hybrid:<duration> names the budget the shim reports and spins;
        // FASTWAKE_BUDGET_US, when given, still overrides it (below).
        if let Some(WaitMode::Hybrid { budget }) = c.mode {
            c.budget = budget;
        }
    }
    if let Some(v) = get("FASTWAKE_BUDGET_US") {
        c.budget = fastwake::grammar::duration(&v)
            .map_err(|e| format!("FASTWAKE_BUDGET_US: {e}; passing through"))?;
        if let Some(WaitMode::Hybrid { budget }) = &mut c.mode {
            *budget = c.budget;
        }
    }
    if let Some(v) = get("FASTWAKE_CPU_CAP") {
        c.cpu_cap = fastwake::grammar::share(&v)
            .map_err(|e| format!("FASTWAKE_CPU_CAP: {e}; passing through"))?;
    }
    if let Some(v) = get("FASTWAKE_POLLERS") {
        c.pollers = match v.trim() {
            "" | "off" => false,
            "sleep" => true,
            _ => {
                return Err(format!(
                    "FASTWAKE_POLLERS='{v}': expected sleep or off; passing through"
                ));
            }
        };
    }
    if let Some(v) = get("FASTWAKE_SLICE") {
        c.slice = match v.trim() {
            "" | "off" => None,
            t => Some(
                fastwake::slice::parse(t)
                    .map_err(|e| format!("FASTWAKE_SLICE: {e}; passing through"))?,
            ),
        };
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

/// Do busy-polling threads sleep when idle (`FASTWAKE_POLLERS=sleep`,
/// with a mode in force)?
#[inline]
pub fn pollers() -> bool {
    CONFIG
        .get()
        .is_some_and(|p| p.cfg.pollers && p.cfg.mode.is_some())
}

/// The slice a thread asks for at its first wait (`FASTWAKE_SLICE`, with
/// a mode in force).
#[inline]
pub fn slice() -> Option<Duration> {
    CONFIG.get().and_then(|p| p.cfg.mode.and(p.cfg.slice))
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
            ("FASTWAKE_POLLERS", "sleep"),
        ]))
        .unwrap();
        assert!(c.pollers);
        assert_eq!(c.mode, Some(WaitMode::Adaptive(Default::default())));
        assert_eq!(c.budget, Duration::from_micros(30));
        assert_eq!(c.cpu_cap, 0.5);
        assert!(c.verbose);
    }

    #[test]
    fn profiles_set_defaults_that_explicit_variables_override() {
        let c = parse(env(&[("FASTWAKE_PROFILE", "power")])).unwrap();
        assert_eq!(c.mode, Some(WaitMode::Adaptive(Default::default())));
        assert_eq!(c.cpu_cap, 0.10);
        let c = parse(env(&[
            ("FASTWAKE_PROFILE", "latency"),
            ("FASTWAKE_CPU_CAP", "50%"),
        ]))
        .unwrap();
        assert_eq!(
            c.mode,
            Some(WaitMode::Hybrid {
                budget: Duration::from_millis(1)
            })
        );
        assert_eq!(c.cpu_cap, 0.5);
        let c = parse(env(&[
            ("FASTWAKE_PROFILE", "balanced"),
            ("FASTWAKE_MODE", "off"),
        ]))
        .unwrap();
        assert_eq!(c.mode, None);
    }

    #[test]
    fn the_one_grammar_reads_budgets_and_caps() {
        for (b, us) in [("30", 30), ("30us", 30), ("0.5ms", 500)] {
            let c = parse(env(&[("FASTWAKE_BUDGET_US", b)])).unwrap();
            assert_eq!(c.budget, Duration::from_micros(us), "{b}");
        }
        for (cap, f) in [("0.2", 0.2), ("20%", 0.2), ("20", 0.2)] {
            let c = parse(env(&[("FASTWAKE_CPU_CAP", cap)])).unwrap();
            assert!((c.cpu_cap - f).abs() < 1e-12, "{cap}");
        }
    }

    #[test]
    fn unknown_variables_get_one_line_naming_the_nearest() {
        let lines = unknown_variables(
            [
                "FASTWAKE_BUDGET",
                "FASTWAKE_MODE",
                "FASTWAKE_RXE_ONLY",
                "FASTWAKE_MOOD",
                "FASTWAKE_XYZZY_PLUGH_QUUX",
                "PATH",
            ]
            .into_iter(),
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].contains("FASTWAKE_BUDGET ")
                && lines[0].contains("did you mean FASTWAKE_BUDGET_US?")
        );
        assert!(
            lines[1].contains("did you mean FASTWAKE_MODE?"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("known: FASTWAKE_MODE"), "{}", lines[2]);
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
            ("FASTWAKE_CPU_CAP", "200"),
            ("FASTWAKE_VERBOSE", "maybe"),
            ("FASTWAKE_PROFILE", "fast"),
            ("FASTWAKE_BUDGET_US", "2s"),
            ("FASTWAKE_POLLERS", "on"),
            ("FASTWAKE_SLICE", "50us"),
            ("FASTWAKE_SLICE", "1s"),
            ("FASTWAKE_SLICE", "soon"),
        ] {
            let e = parse(env(&[(k, v)])).unwrap_err();
            assert!(e.contains(k), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_slice_is_opt_in_and_in_the_grammar() {
        assert_eq!(parse(env(&[])).unwrap().slice, None);
        for v in ["", "off"] {
            assert_eq!(parse(env(&[("FASTWAKE_SLICE", v)])).unwrap().slice, None);
        }
        for (v, us) in [("100us", 100), ("0.5ms", 500), ("100ms", 100_000)] {
            assert_eq!(
                parse(env(&[("FASTWAKE_SLICE", v)])).unwrap().slice,
                Some(Duration::from_micros(us)),
                "{v}"
            );
        }
    }

    #[test]
    fn off_is_named_only_where_a_mode_name_is_expected() {
        assert_eq!(parse(env(&[("FASTWAKE_MODE", "off")])).unwrap().mode, None);
        let e = parse(env(&[("FASTWAKE_MODE", "fast")])).unwrap_err();
        assert!(e.contains("adaptive[:OPTIONS] or off"), "{e}");
        // A bad option of a known mode says what that option takes, and
        // nothing about turning the shim off.
        let e = parse(env(&[("FASTWAKE_MODE", "adaptive:prewake=maybe")])).unwrap_err();
        assert!(e.contains("expected on or off; passing through"), "{e}");
    }
}
