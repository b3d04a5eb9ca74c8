//! `bench load --background N[:DUTY]`: co-located load, as in the RoCE
//! configuration study's CPU-contention scenario and as a busy Soft-RoCE
//! guest (two TCG vCPU threads, bursty) was on this machine.
//!
//! N processes of normal priority, not pinned, each busy for random
//! stretches of 0.1-10 ms (log-uniform) and idle in between so that it is
//! busy DUTY % of the time (100 = always). Processes, not threads: the
//! scheduler's fairness then sees other tasks, not siblings of the
//! benchmark, and the adaptive controller's pressure sampler counts them
//! as others. They are the benchmark binary itself, re-run with the
//! hidden `bench busy` subcommand, and die with it (PR_SET_PDEATHSIG).

use fastwake::{Fail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `--background` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Background {
    pub procs: u32,
    /// Percent of the time each process is busy (1..=100).
    pub duty: u8,
}

impl Background {
    /// `N` or `N:DUTY` (DUTY in percent, `%` optional; default 100).
    pub fn parse(s: &str) -> std::result::Result<Background, String> {
        let bad = || {
            format!(
                "bad --background '{s}': expected N[:DUTY], e.g. 2:50 (N from 1 to 64 processes, DUTY from 1 to 100 %)"
            )
        };
        let (n, d) = match s.split_once(':') {
            Some((n, d)) => (n, d.trim().trim_end_matches('%')),
            None => (s, "100"),
        };
        let procs = n
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(bad)?;
        let duty = d
            .parse::<u8>()
            .ok()
            .filter(|d| (1..=100).contains(d))
            .ok_or_else(bad)?;
        Ok(Background { procs, duty })
    }

    /// As in scenario names: `bg2:50`.
    pub fn name(&self) -> String {
        format!("bg{}:{}", self.procs, self.duty)
    }
}

/// The running processes; killed on drop.
pub struct Running(Vec<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start `bg`'s processes (seeded by `seed`, each its own stream).
pub fn start(bg: Background, seed: u64) -> Result<Running> {
    let exe = std::env::current_exe()
        .map_err(|e| Fail::new(libc::ENOENT, format!("background: own binary: {e}")))?;
    let mut v = Running(Vec::new());
    for i in 0..bg.procs {
        let c = Command::new(&exe)
            .args(["bench", "busy", "--duty"])
            .arg(bg.duty.to_string())
            .arg("--seed")
            .arg((seed ^ (0x9e37_79b9 * (i as u64 + 1))).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| Fail::new(libc::EAGAIN, format!("background: spawn: {e}")))?;
        v.0.push(c);
    }
    Ok(v)
}

/// Arguments of the hidden `bench busy` worker.
#[derive(clap::Args, Debug)]
pub struct BusyArgs {
    /// Percent of the time to be busy.
    #[arg(long, default_value_t = 100)]
    pub duty: u8,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The worker: busy stretches of 0.1-10 ms (log-uniform), idle between
/// them for `busy × (100 − duty) / duty`, until killed or orphaned.
pub fn busy(a: BusyArgs) -> Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number; it only arranges for
    // this process to be killed when its parent thread exits.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let duty = a.duty.clamp(1, 100) as f64 / 100.0;
    let mut rng = StdRng::seed_from_u64(a.seed);
    loop {
        let ms = 10f64.powf(rng.random_range(-1.0..=1.0));
        let stretch = Duration::from_secs_f64(ms / 1000.0);
        let t = Instant::now();
        while t.elapsed() < stretch {
            std::hint::spin_loop();
        }
        if duty < 1.0 {
            std::thread::sleep(stretch.mul_f64((1.0 - duty) / duty));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_n_and_duty() {
        assert_eq!(
            Background::parse("2"),
            Ok(Background {
                procs: 2,
                duty: 100
            })
        );
        assert_eq!(
            Background::parse("2:50"),
            Ok(Background { procs: 2, duty: 50 })
        );
        assert_eq!(
            Background::parse("3:25%"),
            Ok(Background { procs: 3, duty: 25 })
        );
        for bad in ["", "0", "2:0", "2:101", "x:5", "65", "2:"] {
            assert!(Background::parse(bad).is_err(), "{bad}");
        }
    }
}
