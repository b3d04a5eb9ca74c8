//! The value grammar every front end shares: the library's [`WaitMode`]
//! parser, the C ABI (`fw_waiter_create`), `fastwake bench`, `fastwake run`
//! and the shim's `FASTWAKE_*` variables all read durations and shares of a
//! CPU through these two functions, so `hybrid:20us`, `--budget 20us` and
//! `FASTWAKE_BUDGET_US=20us` cannot drift apart (docs/reference/grammar.md lists the
//! forms, and a test runs its examples through every front end).
//!
//! Both parsers return one-line [`Fail::invalid`] errors that name the
//! accepted forms, because they end up as the single line a bad flag or a
//! bad environment variable gets.
//!
//! [`WaitMode`]: crate::WaitMode

use crate::error::{Fail, Result};
use std::time::Duration;

/// Longest duration any option takes: one second. Spin budgets and
/// ceilings beyond it are a typo (a spin that long is a busy loop, not a
/// wait), so they are refused rather than obeyed.
pub const MAX_DURATION: Duration = Duration::from_secs(1);

/// A duration: `N` (µs, the unit every budget has always been given in),
/// or `N` followed by `ns`, `us`, `µs`, `ms` or `s`; `N` may have a
/// fraction (`0.5ms`). At most [`MAX_DURATION`].
pub fn duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || {
        Fail::invalid(format!(
            "bad duration '{s}': expected N (µs) or N with ns, us, ms or s, at most 1s, e.g. 20us"
        ))
    };
    let (num, ns_per_unit) = [
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
    ]
    .iter()
    .find_map(|(suffix, scale)| t.strip_suffix(suffix).map(|n| (n, *scale)))
    .unwrap_or((t, 1e3));
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    let ns = (v * ns_per_unit).round();
    if ns > MAX_DURATION.as_nanos() as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// A share of one CPU (or of waits): `N%`, or a bare number, read as a
/// fraction when at most 1 (`0.2`) and as percent above 1 (`20`, the form
/// `adaptive:cap=20` always had). Returns the fraction, in (0, 1].
///
/// The one ambiguous spelling is a bare `1`: it is the whole CPU (as
/// `--cpu-cap 1` always was), not 1 %; write `1%` for that.
pub fn share(s: &str) -> Result<f64> {
    let t = s.trim();
    let bad = || {
        Fail::invalid(format!(
            "bad share '{s}': expected N% (0 < N <= 100) or a fraction in (0, 1], e.g. 20% or 0.2"
        ))
    };
    let f = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => {
            let v = t.parse::<f64>().map_err(|_| bad())?;
            if v > 1.0 { v / 100.0 } else { v }
        }
    };
    if f.is_finite() && f > 0.0 && f <= 1.0 {
        Ok(f)
    } else {
        Err(bad())
    }
}

/// Split a comma-separated list of wait modes (`--mode` of the benches),
/// keeping the comma-separated options of `adaptive:` with their mode:
/// `poll,adaptive:cap=20%,worth=9,hybrid` is `poll`,
/// `adaptive:cap=20%,worth=9`, `hybrid`. A piece that is `key=value`
/// (an `=`, no `:`) continues the item before it; every mode name is a
/// bare word, so no mode is ever taken for an option.
pub fn split_modes(s: &str) -> Vec<&str> {
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    for piece in s.split(',') {
        let end = at + piece.len();
        let option = piece.contains('=') && !piece.contains(':');
        match items.last_mut() {
            Some(last) if option => last.1 = end,
            _ => items.push((at, end)),
        }
        at = end + 1;
    }
    items
        .into_iter()
        .map(|(a, b)| s[a..b].trim())
        .filter(|p| !p.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn mode_lists_keep_adaptive_options_together() {
        assert_eq!(
            split_modes("poll,adaptive:cap=20%,worth=9,hybrid:20us"),
            ["poll", "adaptive:cap=20%,worth=9", "hybrid:20us"]
        );
        assert_eq!(
            split_modes("adaptive:catch=90%,wake=learn"),
            ["adaptive:catch=90%,wake=learn"]
        );
        assert_eq!(split_modes(" poll , interrupt "), ["poll", "interrupt"]);
        // A stray option with nothing before it stays an item, so the
        // mode parser names it.
        assert_eq!(split_modes("cap=20%,poll"), ["cap=20%", "poll"]);
        assert!(split_modes("").is_empty());
    }

    use super::*;

    #[test]
    fn durations() {
        let us = Duration::from_micros;
        assert_eq!(duration("20").unwrap(), us(20));
        assert_eq!(duration("20us").unwrap(), us(20));
        assert_eq!(duration(" 20 µs ").unwrap(), us(20));
        assert_eq!(duration("0.5ms").unwrap(), us(500));
        assert_eq!(duration("1500ns").unwrap(), Duration::from_nanos(1500));
        assert_eq!(duration("1s").unwrap(), MAX_DURATION);
        assert_eq!(duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "-5", "abc", "20 parsecs", "2s", "nan", "inf", "us"] {
            let e = duration(bad).unwrap_err().to_string();
            assert!(e.contains("e.g. 20us") && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn shares() {
        for (s, f) in [
            ("20%", 0.2),
            ("0.2", 0.2),
            ("20", 0.2),
            ("100%", 1.0),
            ("1", 1.0),
            ("1%", 0.01),
            ("0.75", 0.75),
            ("12.5%", 0.125),
        ] {
            assert!((share(s).unwrap() - f).abs() < 1e-12, "{s}");
        }
        for bad in ["0", "0%", "-1", "101", "150%", "x", "", "nan"] {
            let e = share(bad).unwrap_err().to_string();
            assert!(
                e.contains("e.g. 20% or 0.2") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }
}
