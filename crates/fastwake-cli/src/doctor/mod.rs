//! `fastwake doctor`: what this host offers for microsecond waiting, and
//! what to change. Read-only: it never modifies the host. It reads /proc
//! and /sys, dlopens libibverbs (and closes it), creates and drops one
//! io_uring instance to see whether io_uring works, and measures two
//! things with threads of its own: the wake-up latency (~0.3 s) and what a
//! timed sleep costs, the pre-wake's sleep (~15 ms).
//!
//! Every check produces a [`Finding`] (a value: level, measured detail,
//! advice, the section of docs/guide/tuning.md that explains it); [`render_text`]
//! prints them for people, `--json` prints the whole [`Report`] as one JSON
//! document. Each judgement's threshold is a named constant below and is
//! stated in docs/guide/tuning.md: an `ok` means the thing checked is what
//! fastwake wants, `info` is a fact that needs no action by itself, `warn`
//! costs latency or CPU, `bad` stops part of fastwake from working here.

use serde::Serialize;
use std::fmt::Write as _;

/// Where the findings are explained (relative to the repository).
pub const GUIDE: &str = "docs/guide/tuning.md";

/// `fastwake doctor [--json]`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON document instead of the report
    ///
    /// Prints one JSON document (version, host, date, kernel, findings,
    /// warnings, the wake-up, timed-sleep and CPU-gap measurements)
    /// instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// How long the CPU-gap measurement watches each CPU (and all at once)
    ///
    /// A thread that never blocks watches each CPU alone for this long,
    /// then all of them at once for as long (the first four CPUs); when
    /// that is every CPU, the report names the other threads that ran
    /// meanwhile and the steal the hypervisor reported. Longer watches
    /// count rarer gaps; 500ms keeps the whole report near 2 s.
    #[arg(long, default_value = "500ms", value_parser = gap_watch, value_name = "DURATION")]
    pub gap_watch: std::time::Duration,
}

/// `500ms`, `5s`, `2.5s`: the grammar's durations stop at 1 s, so whole
/// seconds are read here.
fn gap_watch(s: &str) -> Result<std::time::Duration, String> {
    let secs = s
        .strip_suffix('s')
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '.'));
    let d = match secs {
        Some(n) => n
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(std::time::Duration::from_secs_f64)
            .ok_or_else(|| format!("bad duration '{s}'"))?,
        None => crate::values::duration(s)?,
    };
    if d < std::time::Duration::from_millis(10) || d > std::time::Duration::from_secs(60) {
        return Err(format!("{s}: between 10ms and 60s"));
    }
    Ok(d)
}

#[cfg(test)]
mod anchors;
mod cpu;
mod finding;
mod gaps;
mod host;
mod net;
mod odp;
mod rdma;
#[cfg(test)]
mod tests;
mod timer;
mod wake;

pub use cpu::guest_halt_poll_ns;
use cpu::*;
pub use finding::*;
use gaps::*;
use host::*;
use net::*;
use odp::*;
use rdma::*;
pub(crate) use timer::sleep_on_idle;
use timer::*;
pub(crate) use wake::WakeStats;
use wake::*;

/// Everything `doctor` found; `--json` prints exactly this.
#[derive(Serialize, Debug)]
pub struct Report {
    /// version, host, date (UTC, RFC 3339) and command line, as every
    /// JSON report of the CLI carries them.
    #[serde(flatten)]
    pub run: crate::meta::RunMeta,
    /// uname release.
    pub kernel: String,
    pub findings: Vec<Finding>,
    /// Findings at level warn.
    pub warnings: usize,
    /// Findings at level bad.
    pub bad: usize,
    pub wake_up: WakeUp,
    pub timed_sleep: TimedSleep,
    pub cpu_gaps: Gaps,
}

impl Report {
    fn new(kernel: String) -> Self {
        Report {
            run: crate::meta::RunMeta::now(),
            kernel,
            findings: Vec::new(),
            warnings: 0,
            bad: 0,
            wake_up: WakeUp::default(),
            timed_sleep: TimedSleep::default(),
            cpu_gaps: Gaps::default(),
        }
    }
    fn push(&mut self, f: Finding) {
        debug_assert!(
            f.level < Level::Warn || f.advice.is_some(),
            "{}: warn/bad without advice",
            f.id
        );
        match f.level {
            Level::Warn => self.warnings += 1,
            Level::Bad => self.bad += 1,
            _ => {}
        }
        self.findings.push(f);
    }
}

/// The text report (today's look: one line per finding; warn and bad
/// lines are followed by the advice and the guide's section).
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let col = |s: &mut String, level: &str, name: &str, text: &str| {
        let _ = writeln!(s, "  {level:<5} {name:<26} {text}");
    };
    let _ = writeln!(
        s,
        "fastwake {} doctor — host inspection (read-only); each finding is explained in {GUIDE}",
        r.run.version
    );
    for area in Area::ALL {
        let _ = writeln!(s, "{}", area.heading());
        if area == Area::Cpu {
            col(&mut s, "info", "kernel", &r.kernel);
        }
        for f in r.findings.iter().filter(|f| f.area == area) {
            col(&mut s, f.level.word(), f.name, &f.detail);
            if f.level >= Level::Warn {
                if let Some(a) = &f.advice {
                    col(&mut s, "", "", &format!("-> {a}"));
                }
                col(&mut s, "", "", &format!("   see {}", f.doc));
            }
        }
    }
    let _ = writeln!(
        s,
        "{} warning(s), {} bad. Next: `fastwake bench ipc` measures this host's wake-up costs.",
        r.warnings, r.bad
    );
    s
}

pub fn run(a: Args) -> fastwake::Result<()> {
    let r = inspect(a.gap_watch);
    if a.json {
        let j = serde_json::to_string_pretty(&r)
            .map_err(|e| fastwake::Fail::invalid(format!("doctor report as JSON: {e}")))?;
        println!("{j}");
    } else {
        print!("{}", render_text(&r));
    }
    Ok(())
}

/// Run every check. The cheap reads come first, so the wake-up
/// measurement's two threads do not show in what they read (PSI).
pub fn inspect(gap_watch: std::time::Duration) -> Report {
    let uname = rustix::system::uname();
    let mut r = Report::new(format!(
        "{} {}",
        uname.sysname().to_string_lossy(),
        uname.release().to_string_lossy()
    ));
    let virt = virtualised();
    let rdma_devs = rdma_devices();
    let vectors = rdma_devs
        .iter()
        .map(|d| (d.clone(), comp_irqs(d)))
        .collect::<Vec<_>>();
    let any_irq_vectors = vectors.iter().any(|(_, v)| !v.is_empty());

    // cpu and scheduler
    r.push(cpus());
    r.push(judge_virtualised(virt));
    r.push(judge_psi(read("/proc/pressure/cpu").as_deref()));
    r.push(contention_sampler());
    r.push(waiter_slice());
    r.push(judge_isolated(
        read("/sys/devices/system/cpu/isolated").as_deref(),
        read("/sys/devices/system/cpu/nohz_full").as_deref(),
        read("/proc/cmdline").as_deref(),
    ));
    r.push(judge_irqbalance(irqbalance_running(), any_irq_vectors));
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    r.push(judge_idle(driver.as_deref(), &idle_states()));
    r.push(judge_halt_poll(
        driver.as_deref(),
        virt,
        read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").and_then(|v| v.parse().ok()),
    ));
    r.push(judge_governors(&governors()));
    r.push(user_wait());

    // rdma
    r.push(judge_rdma_devices(&rdma_devs));
    r.push(libibverbs(!rdma_devs.is_empty()));
    let lim = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    r.push(judge_memlock(
        lim.current,
        lim.maximum,
        !rdma_devs.is_empty(),
        has_cap(CAP_IPC_LOCK),
    ));
    r.push(judge_vectors(&vectors, &online_cpus()));
    // Stalls: ODP, retry counters, the QP timeout.
    r.push(judge_odp(&odp_caps(&rdma_devs)));
    r.push(judge_port_counters(&port_counters(&rdma_devs)));
    r.push(qp_timeout_advice(!rdma_devs.is_empty()));
    r.push(qemu_acceleration());

    // network and io_uring
    r.push(judge_busy_poll(
        read("/proc/sys/net/core/busy_read").and_then(|v| v.parse().ok()),
        read("/proc/sys/net/core/busy_poll").and_then(|v| v.parse().ok()),
        has_cap(CAP_NET_ADMIN),
    ));
    let nics = nics();
    r.push(judge_rfs(
        read("/proc/sys/net/core/rps_sock_flow_entries").and_then(|v| v.parse().ok()),
        &nics,
    ));
    r.push(judge_xps(&nics));
    r.push(io_uring());

    // Last: the measurements; their findings join the cpu section.
    let (w, f) = wake_up();
    r.wake_up = w;
    r.push(f);
    let (t, f) = timed_sleep();
    r.timed_sleep = t;
    r.push(f);
    let (g, f) = cpu_gaps(gap_watch);
    r.cpu_gaps = g;
    r.push(f);
    r.findings.sort_by_key(|f| f.area);
    r
}
