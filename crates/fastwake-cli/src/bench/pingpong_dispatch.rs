//! `bench pingpong --mode dispatch`: a dispatcher on each end's CPU for the
//! run, its CPU counted in the dispatch row, and the hand-off counters of
//! each end.
//!
//! Without a dispatcher a dispatch-mode wait falls back to interrupt mode,
//! which is all the row used to measure. The dispatchers run for the whole
//! run, under the default idle policy: during the other modes' turns they
//! go to sleep after 2 ms without a hand-off (and adaptive waits in the
//! same run may use them, as they would in a program that runs one).

use super::stats::Row;
use fastwake::dispatch::{self, DispatchStats, Dispatcher};
use fastwake::{Result, WaitMode};
use std::time::Duration;

/// The run's dispatchers, one per CPU the ends run on.
pub struct Dispatchers {
    running: Vec<Dispatcher>,
    ping_cpu: u32,
}

/// What the dispatchers did over the run.
pub struct Done {
    /// Per dispatcher: its CPU, counters and CPU time.
    cpus: Vec<(u32, DispatchStats, Duration)>,
    cpu_time: Duration,
    /// The ping end's CPU.
    ping_cpu: u32,
}

impl Dispatchers {
    /// Start them when `modes` has dispatch; none otherwise.
    pub fn start(modes: &[WaitMode], cpus: (u32, u32)) -> Result<Dispatchers> {
        let mut running = Vec::new();
        if modes.contains(&WaitMode::Dispatch) {
            running.push(Dispatcher::start(dispatch::Config::new(cpus.0))?);
            if cpus.1 != cpus.0 {
                running.push(Dispatcher::start(dispatch::Config::new(cpus.1))?);
            }
        }
        Ok(Dispatchers {
            running,
            ping_cpu: cpus.0,
        })
    }

    /// Stop them; their counters and CPU time.
    pub fn stop(self) -> Done {
        let cpus: Vec<_> = self
            .running
            .into_iter()
            .map(|d| {
                let t = d.cpu_time().unwrap_or_default();
                (d.config().cpu, d.stop(), t)
            })
            .collect();
        Done {
            cpu_time: cpus.iter().map(|c| c.2).sum(),
            cpus,
            ping_cpu: self.ping_cpu,
        }
    }
}

impl Done {
    /// Count the dispatchers' CPU in the dispatch row (where they were
    /// needed; a slight over-count, for the 2 ms they poll into each other
    /// turn) and add their counters to it.
    pub fn charge(&self, rows: &mut [Row]) {
        if self.cpus.is_empty() {
            return;
        }
        let Some(row) = rows.iter_mut().find(|r| r.mode == "dispatch") else {
            return;
        };
        let per_op = |t: Duration| t.as_secs_f64() * 1e6 / row.iters.max(1) as f64;
        for (cpu, _, t) in &self.cpus {
            // Each dispatcher's CPU goes to the end on its CPU.
            if *cpu == self.ping_cpu {
                row.cpu_us_per_op_ping += per_op(*t);
            } else {
                row.cpu_us_per_op_pong += per_op(*t);
            }
        }
        row.cpu_us_per_op += per_op(self.cpu_time);
        row.extra.insert(
            "dispatcher_cpu_us_per_op".into(),
            round3(per_op(self.cpu_time)).into(),
        );
        for (cpu, s, _) in &self.cpus {
            let key = |k: &str| format!("dispatcher{cpu}_{k}");
            row.extra.insert(key("handoffs"), s.handoffs.into());
            row.extra.insert(key("relayed"), s.relayed.into());
            row.extra.insert(key("rescued"), s.rescued.into());
            row.extra.insert(key("idle_sleeps"), s.idle_sleeps.into());
        }
    }

    /// The lines printed under the table.
    pub fn print(&self, rows: &[Row]) {
        let Some(row) = rows.iter().find(|r| r.mode == "dispatch") else {
            return;
        };
        let get = |k: &str| row.extra.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        println!(
            " dispatch: dispatchers on CPU(s) {} (SCHED_IDLE), {:.3} CPU µs per round trip, counted in its cpu/op (each in its CPU's end)",
            self.cpus
                .iter()
                .map(|(c, _, _)| c.to_string())
                .collect::<Vec<_>>()
                .join(" and "),
            self.cpu_time.as_secs_f64() * 1e6 / row.iters.max(1) as f64
        );
        for end in ["ping", "pong"] {
            println!(
                " dispatch: {end} end: {} waits ended without a sleep (most in its relay's spin), {} handed off, {} relayed, {} in interrupt mode (no dispatcher trusted), {} paused by an idle dispatcher",
                get(&format!("{end}_without_sleep")),
                get(&format!("{end}_handoffs")),
                get(&format!("{end}_relays")),
                get(&format!("{end}_fallbacks")),
                get(&format!("{end}_paused")),
            );
        }
        for (cpu, s, _) in &self.cpus {
            println!(
                " dispatch: dispatcher on CPU {cpu}: {} hand-offs, {} idle sleeps, {} rescued by its watchdog",
                s.handoffs, s.idle_sleeps, s.rescued
            );
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
