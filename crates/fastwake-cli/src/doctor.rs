//! `fastwake doctor`: what this host offers for microsecond waiting, and
//! what to change. Read-only: it never modifies the host. It reads /proc
//! and /sys, dlopens libibverbs (and closes it), creates and drops one
//! io_uring instance to see whether io_uring works, and measures one thing,
//! the wake-up latency, with two threads of its own for ~0.3 s.
//!
//! Every check produces a [`Finding`] (a value: level, measured detail,
//! advice, the section of docs/tuning.md that explains it); [`render_text`]
//! prints them for people, `--json` prints the whole [`Report`] as one JSON
//! document. Each judgement's threshold is a named constant below and is
//! stated in docs/tuning.md: an `ok` means the thing checked is what
//! fastwake wants, `info` is a fact that needs no action by itself, `warn`
//! costs latency or CPU, `bad` stops part of fastwake from working here.

use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Where the findings are explained (relative to the repository).
pub const GUIDE: &str = "docs/tuning.md";

/// `fastwake doctor [--json]`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON document (version, host, date, kernel, findings,
    /// warnings, the wake-up measurement) instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// The anchors of docs/tuning.md's sections, one per topic. A test checks
/// that each is a heading of the guide.
pub mod anchor {
    pub const CPUS: &str = "cpus-and-virtualisation";
    pub const PRESSURE: &str = "cpu-pressure";
    pub const IRQ: &str = "irq-affinity-and-irqbalance";
    pub const ISOLATED: &str = "isolated-cpus";
    pub const IDLE: &str = "idle-states-and-guest-halt-polling";
    pub const GOVERNOR: &str = "frequency-governor";
    pub const WAKE_UP: &str = "wake-up-latency";
    pub const RDMA: &str = "rdma-devices-and-libibverbs";
    pub const MEMLOCK: &str = "memlock-limits-for-rdma";
    pub const VECTORS: &str = "completion-vectors";
    pub const BUSY_POLL: &str = "busy-polling-sysctls";
    pub const RFS_XPS: &str = "rfs-and-xps-for-sockets";
    pub const IO_URING: &str = "io_uring";
    /// All of them.
    #[cfg(test)]
    pub const ALL: [&str; 13] = [
        CPUS, PRESSURE, IRQ, ISOLATED, IDLE, GOVERNOR, WAKE_UP, RDMA, MEMLOCK, VECTORS, BUSY_POLL,
        RFS_XPS, IO_URING,
    ];
}

/// PSI cpu `some avg10` (%) above which CPU pressure is a warning: more
/// than a tenth of the last 10 s some runnable thread waited for a CPU.
/// Spinning then takes time those threads wait for, and a woken waiter
/// queues behind them.
pub const PSI_WARN_SOME_AVG10: f64 = 10.0;
/// Idle states whose exit latency is above this (µs) are a warning when
/// enabled: a few µs is what fastwake's wake-ups are about.
pub const IDLE_WARN_EXIT_US: u64 = 10;
/// guest_halt_poll_ns at or above this (ns) is ok: an idle vCPU still polls
/// after the gaps of a request/response exchange (tens of µs). Below it
/// (but not 0) is info; 0 is a warning.
pub const HALT_POLL_OK_NS: u64 = 100_000;
/// RLIMIT_MEMLOCK below this (bytes) is a warning on a host with RDMA
/// devices: memory regions and provider queues are pinned against it.
pub const MEMLOCK_WARN_BYTES: u64 = 64 << 20;

/// How a finding is judged.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// What fastwake wants.
    Ok,
    /// A fact; no action needed by itself.
    Info,
    /// Costs latency or CPU: see the advice.
    Warn,
    /// Part of fastwake cannot work here as configured.
    Bad,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Bad => "bad",
        }
    }
}

/// The report's sections, in the order they are printed.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Area {
    Cpu,
    Rdma,
    Network,
}

impl Area {
    const ALL: [Area; 3] = [Area::Cpu, Area::Rdma, Area::Network];
    fn heading(self) -> &'static str {
        match self {
            Area::Cpu => "cpu and scheduler:",
            Area::Rdma => "rdma:",
            Area::Network => "network and io_uring:",
        }
    }
}

/// One check's result.
#[derive(Serialize, Debug, Clone)]
pub struct Finding {
    /// Stable identifier (`cpu_pressure`).
    pub id: &'static str,
    pub area: Area,
    /// What the text report calls it.
    pub name: &'static str,
    pub level: Level,
    /// What was measured or read.
    pub detail: String,
    /// What to do (always present for warn and bad).
    pub advice: Option<String>,
    /// The section of docs/tuning.md.
    pub anchor: &'static str,
    /// `docs/tuning.md#<anchor>`.
    pub doc: String,
}

/// What a check is, before it has found anything.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub id: &'static str,
    pub area: Area,
    pub name: &'static str,
    pub anchor: &'static str,
}

impl Check {
    const fn new(id: &'static str, area: Area, name: &'static str, anchor: &'static str) -> Self {
        Check {
            id,
            area,
            name,
            anchor,
        }
    }
    fn found(self, level: Level, detail: impl Into<String>) -> Finding {
        Finding {
            id: self.id,
            area: self.area,
            name: self.name,
            level,
            detail: detail.into(),
            advice: None,
            anchor: self.anchor,
            doc: format!("{GUIDE}#{}", self.anchor),
        }
    }
}

/// The checks: each one's stable id, section of the report, name in the
/// text report and section of the guide.
mod check {
    use super::{Area, Check, anchor};
    pub const CPUS: Check = Check::new("cpus", Area::Cpu, "cpus", anchor::CPUS);
    pub const VIRTUALISED: Check =
        Check::new("virtualised", Area::Cpu, "virtualised", anchor::CPUS);
    pub const CPU_PRESSURE: Check = Check::new(
        "cpu_pressure",
        Area::Cpu,
        "cpu pressure (PSI)",
        anchor::PRESSURE,
    );
    pub const CONTENTION_SAMPLER: Check = Check::new(
        "contention_sampler",
        Area::Cpu,
        "contention sampler",
        anchor::PRESSURE,
    );
    pub const ISOLATED_CPUS: Check = Check::new(
        "isolated_cpus",
        Area::Cpu,
        "isolated cpus",
        anchor::ISOLATED,
    );
    pub const IRQBALANCE: Check = Check::new("irqbalance", Area::Cpu, "irqbalance", anchor::IRQ);
    pub const IDLE_STATES: Check =
        Check::new("idle_states", Area::Cpu, "idle states", anchor::IDLE);
    pub const GUEST_HALT_POLLING: Check = Check::new(
        "guest_halt_polling",
        Area::Cpu,
        "guest halt polling",
        anchor::IDLE,
    );
    pub const FREQUENCY_GOVERNOR: Check = Check::new(
        "frequency_governor",
        Area::Cpu,
        "frequency governor",
        anchor::GOVERNOR,
    );
    pub const RDMA_DEVICES: Check =
        Check::new("rdma_devices", Area::Rdma, "rdma devices", anchor::RDMA);
    pub const LIBIBVERBS: Check = Check::new("libibverbs", Area::Rdma, "libibverbs", anchor::RDMA);
    pub const MEMLOCK: Check = Check::new("memlock", Area::Rdma, "memlock limit", anchor::MEMLOCK);
    pub const COMPLETION_VECTORS: Check = Check::new(
        "completion_vectors",
        Area::Rdma,
        "completion vectors",
        anchor::VECTORS,
    );
    pub const QEMU_ACCELERATION: Check = Check::new(
        "qemu_acceleration",
        Area::Rdma,
        "qemu acceleration",
        anchor::RDMA,
    );
    pub const BUSY_POLLING: Check = Check::new(
        "busy_polling",
        Area::Network,
        "busy polling sysctls",
        anchor::BUSY_POLL,
    );
    pub const RFS: Check = Check::new("rfs", Area::Network, "rfs", anchor::RFS_XPS);
    pub const XPS: Check = Check::new("xps", Area::Network, "xps", anchor::RFS_XPS);
    pub const IO_URING: Check = Check::new("io_uring", Area::Network, "io_uring", anchor::IO_URING);
    pub const WAKE_UP_LATENCY: Check = Check::new(
        "wake_up_latency",
        Area::Cpu,
        "wake-up latency",
        anchor::WAKE_UP,
    );
}

impl Finding {
    fn advice(mut self, a: impl Into<String>) -> Self {
        self.advice = Some(a.into());
        self
    }
}

/// One wake-up series.
#[derive(Serialize, Debug, Clone)]
pub struct WakeStats {
    /// Idle time before each wake-up (µs).
    pub idle_us: f64,
    /// Wake-ups measured (sleeps of the consumer).
    pub sleeps: usize,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl WakeStats {
    /// From sorted wake-ups in ns.
    fn of(idle_us: f64, sorted_ns: &[u64]) -> Option<Self> {
        let n = sorted_ns.len();
        if n == 0 {
            return None;
        }
        let q = |p: f64| sorted_ns[((n - 1) as f64 * p).round() as usize] as f64 / 1000.0;
        Some(WakeStats {
            idle_us,
            sleeps: n,
            min_us: sorted_ns[0] as f64 / 1000.0,
            p50_us: q(0.50),
            p90_us: q(0.90),
            p99_us: q(0.99),
            max_us: sorted_ns[n - 1] as f64 / 1000.0,
            // Whole ns, like the others.
            mean_us: (sorted_ns.iter().sum::<u64>() / n as u64) as f64 / 1000.0,
        })
    }
}

/// The wake-up measurement.
#[derive(Serialize, Debug, Clone, Default)]
pub struct WakeUp {
    pub producer_cpu: Option<u32>,
    pub consumer_cpu: Option<u32>,
    pub after_20us_idle: Option<WakeStats>,
    pub after_2ms_idle: Option<WakeStats>,
    /// Why a series has no figures (`null` when both have).
    pub error: Option<String>,
}

/// Everything `doctor` found; `--json` prints exactly this.
#[derive(Serialize, Debug)]
pub struct Report {
    pub version: &'static str,
    pub host: String,
    /// UTC, RFC 3339.
    pub date: String,
    /// uname release.
    pub kernel: String,
    pub findings: Vec<Finding>,
    /// Findings at level warn.
    pub warnings: usize,
    /// Findings at level bad.
    pub bad: usize,
    pub wake_up: WakeUp,
}

impl Report {
    fn new(host: String, date: String, kernel: String) -> Self {
        Report {
            version: env!("CARGO_PKG_VERSION"),
            host,
            date,
            kernel,
            findings: Vec::new(),
            warnings: 0,
            bad: 0,
            wake_up: WakeUp::default(),
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
        "fastwake doctor — host inspection (read-only); each finding is explained in {GUIDE}"
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
    let r = inspect();
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
pub fn inspect() -> Report {
    let uname = rustix::system::uname();
    let mut r = Report::new(
        uname.nodename().to_string_lossy().into_owned(),
        rfc3339_utc(std::time::SystemTime::now()),
        format!(
            "{} {}",
            uname.sysname().to_string_lossy(),
            uname.release().to_string_lossy()
        ),
    );
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

    // Last: the measurement; its finding joins the cpu section.
    let (w, f) = wake_up();
    r.wake_up = w;
    r.push(f);
    r.findings.sort_by_key(|f| f.area);
    r
}

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn cpu_flags() -> String {
    read("/proc/cpuinfo")
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.to_string())
        })
        .unwrap_or_default()
}

fn virtualised() -> bool {
    Path::new("/sys/hypervisor/type").exists() || cpu_flags().contains(" hypervisor")
}

/// `0-3,8` for a sorted or unsorted list of CPUs.
fn cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

fn online_cpus() -> Vec<u32> {
    read("/sys/devices/system/cpu/online")
        .map(|s| fastwake::affinity::irq::parse_cpu_list(&s))
        .unwrap_or_default()
}

/// Numbered directories `<dir>/<prefix><N>` as (N, path).
fn numbered(dir: &str, prefix: &str) -> Vec<(u32, std::path::PathBuf)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let k = n.strip_prefix(prefix)?.parse().ok()?;
                    Some((k, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn read_path(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process has capability `cap` in effect (/proc/self/status).
fn has_cap(cap: u32) -> bool {
    read("/proc/self/status")
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(l.trim_start_matches("CapEff:").trim(), 16).ok()
        })
        .is_some_and(|m| m & (1 << cap) != 0)
}

// ---------------------------------------------------------------- cpu

fn cpus() -> Finding {
    let n = fastwake::cpu::online();
    let online = online_cpus().len();
    let detail = if online > 0 && online as u32 != n {
        format!("{n} usable CPUs (of {online} online: affinity mask or cgroup limit)")
    } else {
        format!("{n} usable CPUs")
    };
    // At least 2: the benchmarks' cross-core rows and a poller that does
    // not take the only CPU from the thread it waits for.
    if n < 2 {
        check::CPUS.found(Level::Warn, detail).advice(
            "cross-core rows of the benchmarks need 2 CPUs; poll/hybrid modes will only hurt here (use interrupt or adaptive)",
        )
    } else {
        check::CPUS.found(Level::Ok, detail)
    }
}

fn judge_virtualised(virt: bool) -> Finding {
    check::VIRTUALISED.found(
        Level::Info,
        if virt {
            "yes: cross-core wake-ups are virtual IPIs and an idle vCPU halts through the host; compare modes by ratios within one run"
        } else {
            "no (bare metal, or a hypervisor that does not say so)"
        },
    )
}

/// `some avg10` of /proc/pressure/cpu.
fn psi_some_avg10(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with("some"))?
        .split_ascii_whitespace()
        .find_map(|t| t.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// CPU pressure: warn above [`PSI_WARN_SOME_AVG10`].
fn judge_psi(text: Option<&str>) -> Finding {
    let f = |level, detail: String| check::CPU_PRESSURE.found(level, detail);
    let Some(text) = text else {
        return f(
            Level::Info,
            "unavailable (no /proc/pressure/cpu: kernel without PSI or booted with psi=0); doctor cannot judge CPU contention. fastwake's adaptive mode does not need it (it samples /proc/stat and schedstat)".into(),
        );
    };
    let some = text.lines().find(|l| l.starts_with("some")).unwrap_or("");
    match psi_some_avg10(text) {
        None => f(
            Level::Info,
            format!("unreadable ({some:?}); doctor cannot judge CPU contention"),
        ),
        Some(v) if v > PSI_WARN_SOME_AVG10 => f(
            Level::Warn,
            format!(
                "{some}: runnable threads waited for a CPU {v:.1} % of the last 10 s (> {PSI_WARN_SOME_AVG10} %)"
            ),
        )
        .advice(
            "threads are waiting for CPU: a spinning waiter (poll, hybrid) takes time they wait for, and a woken waiter queues behind them. Find the load (top, per-cgroup cpu.pressure), move it off the waiters' CPUs, or wait in adaptive (stops spinning on a contended CPU), dispatch or interrupt mode",
        ),
        Some(v) => f(
            Level::Ok,
            format!("{some} (avg10 {v:.2} % ≤ {PSI_WARN_SOME_AVG10} %)"),
        ),
    }
}

/// The adaptive mode's contention sampler reads /proc/stat and the
/// thread's schedstat; without them it can never see a contended CPU.
fn contention_sampler() -> Finding {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let stat = Path::new("/proc/stat").exists();
    let sched = Path::new(&format!("/proc/self/task/{tid}/schedstat")).exists();
    let f = |level, d: &str| check::CONTENTION_SAMPLER.found(level, d);
    if stat && sched {
        f(
            Level::Ok,
            "/proc/stat and per-thread schedstat readable: adaptive mode's sampler can see other threads on its CPU",
        )
    } else {
        f(
            Level::Warn,
            if stat {
                "no /proc/<pid>/task/<tid>/schedstat (kernel without CONFIG_SCHED_INFO): adaptive mode's sampler reports unavailable and never backs off for contention"
            } else {
                "no /proc/stat: adaptive mode's sampler reports unavailable and never backs off for contention"
            },
        )
        .advice("mount /proc (and use a kernel with CONFIG_SCHED_INFO); until then adaptive spins as if its CPU were free: cap it (adaptive:cap=N%)")
    }
}

/// Isolated CPUs: `isolated` and `nohz_full` from /sys, isolcpus from the
/// command line. Isolation is ok; none is info (fine for everything but
/// dedicated pollers).
fn judge_isolated(isolated: Option<&str>, nohz: Option<&str>, cmdline: Option<&str>) -> Finding {
    let clean = |s: Option<&str>| {
        s.map(str::trim)
            .filter(|s| !s.is_empty() && *s != "(null)")
            .map(str::to_string)
    };
    let iso = clean(isolated);
    let nohz = clean(nohz);
    let isolcpus = cmdline.and_then(|c| {
        c.split_ascii_whitespace()
            .find(|w| w.starts_with("isolcpus="))
            .map(str::to_string)
    });
    let f = |level, d: String| check::ISOLATED_CPUS.found(level, d);
    match (&iso, &nohz) {
        (None, None) => f(
            Level::Info,
            "none (no isolcpus, no nohz_full): pollers share CPUs with everything else; fine for hybrid, adaptive and dispatch".into(),
        ),
        _ => {
            let mut d = String::new();
            if let Some(i) = &iso {
                let _ = write!(d, "isolated {i}");
            }
            if let Some(n) = &nohz {
                if !d.is_empty() {
                    d.push_str(", ");
                }
                let _ = write!(d, "nohz_full {n}");
            }
            if let Some(c) = isolcpus {
                let _ = write!(d, " ({c})");
            }
            d.push_str(": the scheduler puts no thread there by itself; pin pollers there (--cpus, taskset)");
            f(Level::Ok, d)
        }
    }
}

/// Whether an `irqbalance` process is visible in this PID namespace.
fn irqbalance_running() -> bool {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .any(|e| read_path(&e.path().join("comm")).as_deref() == Some("irqbalance"))
        })
        .unwrap_or(false)
}

/// irqbalance against fastwake's IRQ placement: a warning only where there
/// are completion IRQs to place (an RDMA device with vectors in
/// /proc/interrupts); otherwise what it would do is info.
fn judge_irqbalance(running: bool, irq_vectors: bool) -> Finding {
    let f = |level, d: &str| check::IRQBALANCE.found(level, d);
    match (running, irq_vectors) {
        (false, _) => f(
            Level::Ok,
            "not running (in this PID namespace): IRQ affinities stay where they are set",
        ),
        (true, false) => f(
            Level::Info,
            "running: it rewrites IRQ affinities (every 10 s by default); no RDMA completion IRQs here for it to move",
        ),
        (true, true) => f(
            Level::Warn,
            "running, and RDMA completion vectors have IRQs: it may move them after fastwake chose a vector by its IRQ's CPU, or after --replace irq moved one",
        )
        .advice(
            "stop irqbalance (systemctl stop irqbalance) or keep it off the completion IRQs (IRQBALANCE_BANNED_CPULIST for the waiters' CPUs, or --banirq per IRQ); else wake-ups turn cross-CPU when it rebalances",
        ),
    }
}

/// One cpuidle state of one CPU.
#[derive(Debug, Clone)]
struct IdleState {
    cpu: u32,
    name: String,
    exit_us: u64,
    disabled: bool,
}

fn idle_states() -> Vec<IdleState> {
    let mut v = Vec::new();
    for (cpu, dir) in numbered("/sys/devices/system/cpu", "cpu") {
        for (_, s) in numbered(&dir.join("cpuidle").to_string_lossy(), "state") {
            let Some(exit_us) = read_path(&s.join("latency")).and_then(|l| l.parse().ok()) else {
                continue;
            };
            v.push(IdleState {
                cpu,
                name: read_path(&s.join("name")).unwrap_or_else(|| "?".into()),
                exit_us,
                disabled: read_path(&s.join("disable")).as_deref() == Some("1"),
            });
        }
    }
    v
}

/// Idle states: warn when a state with an exit latency above
/// [`IDLE_WARN_EXIT_US`] is enabled on some CPU. Under haltpoll or without
/// a driver the states say nothing about the real cost (the host decides):
/// info, judged by the guest halt polling finding.
fn judge_idle(driver: Option<&str>, states: &[IdleState]) -> Finding {
    let f = |level, d: String| check::IDLE_STATES.found(level, d);
    // name (exit µs) per distinct state, in order of exit latency.
    let mut kinds: Vec<(u64, String)> =
        states.iter().map(|s| (s.exit_us, s.name.clone())).collect();
    kinds.sort();
    kinds.dedup();
    let list = kinds
        .iter()
        .map(|(l, n)| format!("{n} {l} µs"))
        .collect::<Vec<_>>()
        .join(", ");
    match driver {
        None | Some("none") => f(
            Level::Info,
            "no cpuidle driver: idle CPUs use the architecture's default idle (HLT on x86), in a VM a halt through the host".into(),
        ),
        Some(d @ "haltpoll") => f(
            Level::Info,
            format!("{d} ({list}): a halted vCPU's real exit cost is the host's; see guest halt polling"),
        ),
        Some(d) => {
            let deep: Vec<&IdleState> = states
                .iter()
                .filter(|s| !s.disabled && s.exit_us > IDLE_WARN_EXIT_US)
                .collect();
            if deep.is_empty() {
                f(
                    Level::Ok,
                    format!("{d} ({list}): no enabled state exits in more than {IDLE_WARN_EXIT_US} µs"),
                )
            } else {
                let mut names: Vec<(u64, &str)> =
                    deep.iter().map(|s| (s.exit_us, s.name.as_str())).collect();
                names.sort();
                names.dedup();
                let cpus: Vec<u32> = deep.iter().map(|s| s.cpu).collect();
                f(
                    Level::Warn,
                    format!(
                        "{d}: {} enabled on cpu {} (exit latency > {IDLE_WARN_EXIT_US} µs); a wake-up of a thread on an idle CPU can pay it, unless a process holds /dev/cpu_dma_latency lower (doctor does not open it)",
                        names
                            .iter()
                            .map(|(l, n)| format!("{n} {l} µs"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        cpu_list(&cpus)
                    ),
                )
                .advice(format!(
                    "for latency runs, as root: cpupower idle-set -D {} (disables the states exiting in {} µs or more; -E re-enables all), or hold /dev/cpu_dma_latency at a low value (tuned's latency-performance profile); or wait in hybrid/adaptive so short waits never idle",
                    IDLE_WARN_EXIT_US + 1,
                    IDLE_WARN_EXIT_US + 1
                ))
            }
        }
    }
}

/// Guest halt polling: judged only in a guest using the haltpoll idle
/// driver. 0 is a warning; up to [`HALT_POLL_OK_NS`] info; above ok.
///
/// Why it matters: with `guest_halt_poll_ns` at 0 an idle vCPU halts at
/// once, so every interrupt-mode wake-up of a thread on it goes through
/// the host (an IPI, the host scheduler, a VM entry). Measured on this
/// project's VM type, same minutes, 0 against 200000: `fastwake bench
/// pingpong --mode interrupt,hybrid,poll --cpus 0,1` interrupt p50 22.7
/// against 2.6 µs (poll and hybrid unchanged at 0.09 µs); this command's
/// wake-up after 20 µs idle 16.1-16.6 against 2.6 µs (after 2 ms idle ~30
/// µs either way: the poll window is over).
fn judge_halt_poll(driver: Option<&str>, virt: bool, ns: Option<u64>) -> Finding {
    let f = |level, d: String| check::GUEST_HALT_POLLING.found(level, d);
    if driver != Some("haltpoll") {
        return f(
            Level::Info,
            if virt {
                format!(
                    "not in use (cpuidle driver {}): an idle vCPU halts at once unless the host polls for it (KVM halt_poll_ns, host side)",
                    driver.unwrap_or("none")
                )
            } else {
                "not a guest: does not apply".into()
            },
        );
    }
    match ns {
        Some(0) => f(
            Level::Warn,
            "off (guest_halt_poll_ns = 0): an idle vCPU halts at once and each wake-up goes through the host".into(),
        )
        .advice(
            "as root, `echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns` lets an idle vCPU poll up to 200 µs before halting (measured on this VM type: interrupt-mode pingpong p50 22.7 -> 2.6 µs, wake-up after 20 µs idle 16 -> 2.6 µs), paid in idle vCPU time; or wait in hybrid/adaptive mode",
        ),
        Some(ns) if ns < HALT_POLL_OK_NS => f(
            Level::Info,
            format!(
                "up to {ns} ns before halting (< {HALT_POLL_OK_NS} ns: a vCPU idle longer than that halts and its wake-up goes through the host)"
            ),
        ),
        Some(ns) => f(
            Level::Ok,
            format!("up to {ns} ns before halting (≥ {HALT_POLL_OK_NS} ns)"),
        ),
        None => f(
            Level::Info,
            "haltpoll parameters not readable (/sys/module/haltpoll/parameters)".into(),
        ),
    }
}

/// `guest_halt_poll_ns` when this host's idle driver is haltpoll (and the
/// parameter is readable); `None` otherwise. The benchmarks print it too,
/// since it moves interrupt mode's figures.
pub fn guest_halt_poll_ns() -> Option<u64> {
    if read("/sys/devices/system/cpu/cpuidle/current_driver").as_deref() != Some("haltpoll") {
        return None;
    }
    read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").and_then(|v| v.parse().ok())
}

/// (cpu, scaling_governor) for every CPU that has cpufreq.
fn governors() -> Vec<(u32, String)> {
    numbered("/sys/devices/system/cpu", "cpu")
        .into_iter()
        .filter_map(|(c, d)| Some((c, read_path(&d.join("cpufreq/scaling_governor"))?)))
        .collect()
}

/// Frequency governor: ok when every CPU with cpufreq runs `performance`,
/// warn otherwise; info when no CPU has cpufreq (VMs: the host decides).
fn judge_governors(govs: &[(u32, String)]) -> Finding {
    let f = |level, d: String| check::FREQUENCY_GOVERNOR.found(level, d);
    if govs.is_empty() {
        return f(
            Level::Info,
            "no cpufreq (a VM, or firmware sets the clock): nothing to set here; on a VM the host's governor applies".into(),
        );
    }
    let mut by: Vec<(&str, Vec<u32>)> = Vec::new();
    for (c, g) in govs {
        match by.iter_mut().find(|(n, _)| n == g) {
            Some((_, v)) => v.push(*c),
            None => by.push((g, vec![*c])),
        }
    }
    let d = by
        .iter()
        .map(|(g, c)| format!("{g} on cpu {}", cpu_list(c)))
        .collect::<Vec<_>>()
        .join(", ");
    if by.iter().all(|(g, _)| *g == "performance") {
        f(Level::Ok, d)
    } else {
        f(
            Level::Warn,
            format!("{d}: an idle CPU clocks down and runs the first µs after a wake-up slowly"),
        )
        .advice(
            "for latency runs, as root: cpupower frequency-set -g performance (or write performance to /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)",
        )
    }
}

// ---------------------------------------------------------------- rdma

fn rdma_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn judge_rdma_devices(devs: &[String]) -> Finding {
    if devs.is_empty() {
        check::RDMA_DEVICES.found(
            Level::Info,
            "none (use scripts/rxe-test for real verbs on Soft-RoCE inside a qemu guest)",
        )
    } else {
        check::RDMA_DEVICES.found(Level::Ok, devs.join(", "))
    }
}

fn libibverbs(have_devices: bool) -> Finding {
    // SAFETY: dlopen with a constant, NUL-terminated name; the handle is
    // closed right away and nothing from the library is called.
    let loads = unsafe {
        let h = libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_LOCAL,
        );
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    };
    let f = |level, d: &str| check::LIBIBVERBS.found(level, d);
    match (loads, have_devices) {
        (true, _) => f(Level::Ok, "libibverbs.so.1 loads"),
        (false, false) => f(
            Level::Info,
            "not installed (apt-get install libibverbs1 ibverbs-providers)",
        ),
        (false, true) => f(
            Level::Bad,
            "not installed, but there are RDMA devices: the verbs source, the verbs benchmark and the shim's verbs hooks cannot work",
        )
        .advice("install rdma-core's libibverbs1 and a provider (apt-get install libibverbs1 ibverbs-providers)"),
    }
}

fn bytes(b: Option<u64>) -> String {
    match b {
        None => "unlimited".into(),
        Some(b) if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        Some(b) if b >= 1 << 20 => format!("{:.0} MiB", b as f64 / (1 << 20) as f64),
        Some(b) if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / 1024.0),
        Some(b) => format!("{b} B"),
    }
}

/// RLIMIT_MEMLOCK (`None` = unlimited): a warning on a host with RDMA
/// devices when the soft limit is below [`MEMLOCK_WARN_BYTES`] and the
/// process lacks CAP_IPC_LOCK (which lifts the limit for verbs); info
/// without RDMA devices.
fn judge_memlock(soft: Option<u64>, hard: Option<u64>, rdma: bool, ipc_lock: bool) -> Finding {
    let d = format!(
        "RLIMIT_MEMLOCK soft {}, hard {} (doctor's own; a program's may differ)",
        bytes(soft),
        bytes(hard)
    );
    let f = |level, d: String| check::MEMLOCK.found(level, d);
    let small = soft.is_some_and(|s| s < MEMLOCK_WARN_BYTES);
    if !rdma {
        return f(
            Level::Info,
            format!("{d}; no RDMA devices, so nothing pins memory for verbs"),
        );
    }
    if ipc_lock {
        return f(
            Level::Ok,
            format!(
                "{d}; this process has CAP_IPC_LOCK, which lifts the limit for memory registration"
            ),
        );
    }
    if small {
        f(
            Level::Warn,
            format!(
                "{d}: below {}: ibv_reg_mr and queue creation fail with ENOMEM once a process pins more",
                bytes(Some(MEMLOCK_WARN_BYTES))
            ),
        )
        .advice(
            "raise it for RDMA programs: `ulimit -l unlimited` (up to the hard limit), `* - memlock unlimited` in /etc/security/limits.conf, LimitMEMLOCK=infinity in a systemd unit, --ulimit memlock=-1 for docker",
        )
    } else {
        f(
            Level::Ok,
            format!("{d} (≥ {})", bytes(Some(MEMLOCK_WARN_BYTES))),
        )
    }
}

/// (vector, irq, effective CPUs) of a device's completion IRQs, from
/// /proc/interrupts (mlx5 names them `mlx5_comp<N>@pci:<BDF>`).
fn comp_irqs(dev: &str) -> Vec<(u32, u32, Vec<u32>)> {
    let Some(bdf) = std::fs::read_link(format!("/sys/class/infiniband/{dev}/device"))
        .ok()
        .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
    else {
        return Vec::new();
    };
    let text = read("/proc/interrupts").unwrap_or_default();
    fastwake::affinity::irq::comp_irqs(&text, &bdf)
        .into_iter()
        .map(|(v, irq)| (v, irq, fastwake::affinity::irq::effective_cpus(irq)))
        .collect()
}

type Vectors = Vec<(u32, u32, Vec<u32>)>;

/// Completion vectors: ok when every online CPU has a vector whose IRQ
/// lands on it alone (fastwake then picks it for a waiter there); info
/// otherwise, and for devices without completion IRQs (rxe, siw) or none.
fn judge_vectors(devs: &[(String, Vectors)], online: &[u32]) -> Finding {
    let f = |level, d: String| check::COMPLETION_VECTORS.found(level, d);
    if devs.is_empty() {
        return f(
            Level::Info,
            "no RDMA devices (with one: /proc/interrupts names mlx5's vectors mlx5_comp<N>@pci:<BDF>; ibv_devinfo -v shows num_comp_vectors)".into(),
        );
    }
    let mut parts = Vec::new();
    let mut uncovered_any = false;
    for (dev, v) in devs {
        if v.is_empty() {
            parts.push(format!(
                "{dev}: no completion IRQs in /proc/interrupts (rxe/siw raise completions in softirq: fastwake uses vector = CPU)"
            ));
            continue;
        }
        let exact: Vec<u32> = v
            .iter()
            .filter(|(_, _, c)| c.len() == 1)
            .map(|(_, _, c)| c[0])
            .collect();
        let uncovered: Vec<u32> = online
            .iter()
            .copied()
            .filter(|c| !exact.contains(c))
            .collect();
        let mut s = format!(
            "{dev}: {} vectors, IRQs {} on cpu {}",
            v.len(),
            v.iter()
                .map(|(_, i, _)| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
            cpu_list(&v.iter().flat_map(|(_, _, c)| c.clone()).collect::<Vec<_>>())
        );
        if !uncovered.is_empty() {
            uncovered_any = true;
            let _ = write!(
                s,
                "; no vector lands on cpu {} alone (a waiter there gets an irq-elsewhere vector)",
                cpu_list(&uncovered)
            );
        }
        parts.push(s);
    }
    let any_irqs = devs.iter().any(|(_, v)| !v.is_empty());
    f(
        if any_irqs && !uncovered_any {
            Level::Ok
        } else {
            Level::Info
        },
        parts.join("; "),
    )
}

fn qemu_acceleration() -> Finding {
    let flags = cpu_flags();
    let vmx = flags.contains(" vmx") || flags.contains(" svm");
    check::QEMU_ACCELERATION.found(
        Level::Info,
        if vmx && Path::new("/dev/kvm").exists() {
            "KVM usable for the Soft-RoCE guest"
        } else {
            "no vmx/svm: the Soft-RoCE guest runs under TCG (correctness only, timings meaningless)"
        },
    )
}

// ---------------------------------------------------------------- network

/// Busy polling sysctls (µs; 0 = off): info either way, since what they
/// cost or give depends on the traffic (only NIC queues with a NAPI id).
fn judge_busy_poll(read_us: Option<u64>, poll_us: Option<u64>, net_admin: bool) -> Finding {
    let f = |d: String| check::BUSY_POLLING.found(Level::Info, d);
    let show = |v: Option<u64>| v.map_or("unreadable".to_string(), |v| format!("{v} µs"));
    let cap = if net_admin {
        "this process has CAP_NET_ADMIN (SO_PREFER_BUSY_POLL allowed)"
    } else {
        "no CAP_NET_ADMIN: the kernel refuses SO_PREFER_BUSY_POLL (fastwake goes on without it)"
    };
    let d = format!(
        "net.core.busy_read {}, net.core.busy_poll {}",
        show(read_us),
        show(poll_us)
    );
    match (read_us, poll_us) {
        (Some(0), Some(0)) => f(format!(
            "{d}: off for every socket unless it sets SO_BUSY_POLL (the socket source's --busy-poll); only NIC traffic has a queue to poll, never loopback; {cap}"
        )),
        (None, None) => f(format!("{d} (kernel without CONFIG_NET_RX_BUSY_POLL?)")),
        _ => f(format!(
            "{d}: blocking reads/polls on NIC sockets spin this long in the kernel for every program, on top of fastwake's own spin; {cap}"
        )),
    }
}

/// A network device backed by hardware (it has a `device` link), with its
/// queue settings.
#[derive(Debug, Clone, Default)]
struct Nic {
    name: String,
    rx: Vec<(Option<u64>, Option<String>)>, // (rps_flow_cnt, rps_cpus) per rx queue
    tx: Vec<Option<String>>,                // xps_cpus per tx queue (None: no file)
}

fn nics() -> Vec<Nic> {
    let mut out = Vec::new();
    let Ok(d) = std::fs::read_dir("/sys/class/net") else {
        return out;
    };
    for e in d.filter_map(|e| e.ok()) {
        let p = e.path();
        if !p.join("device").exists() {
            continue;
        }
        let mut nic = Nic {
            name: e.file_name().to_string_lossy().into_owned(),
            ..Default::default()
        };
        let q = p.join("queues");
        for (_, rx) in numbered(&q.to_string_lossy(), "rx-") {
            nic.rx.push((
                read_path(&rx.join("rps_flow_cnt")).and_then(|v| v.parse().ok()),
                read_path(&rx.join("rps_cpus")),
            ));
        }
        for (_, tx) in numbered(&q.to_string_lossy(), "tx-") {
            nic.tx.push(read_path(&tx.join("xps_cpus")));
        }
        out.push(nic);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A CPU mask from sysfs (`00000000,0000000f`) with no bit set.
fn mask_empty(m: &str) -> bool {
    m.chars().all(|c| c == '0' || c == ',')
}

/// RFS: info (loopback and veth traffic does not use it; for NIC traffic
/// it moves receive processing to the reader's CPU).
fn judge_rfs(entries: Option<u64>, nics: &[Nic]) -> Finding {
    let f = |d: String| check::RFS.found(Level::Info, d);
    if nics.is_empty() {
        return f(format!(
            "no hardware network device (net.core.rps_sock_flow_entries = {}): loopback and veth receive on the sender's CPU",
            entries.map_or("?".into(), |e| e.to_string())
        ));
    }
    let queues = nics
        .iter()
        .map(|n| {
            let flow = n.rx.iter().filter(|(c, _)| c.unwrap_or(0) > 0).count();
            let rps =
                n.rx.iter()
                    .filter(|(_, m)| m.as_deref().is_some_and(|m| !mask_empty(m)))
                    .count();
            format!(
                "{}: {} rx queue(s), rps_flow_cnt set on {flow}, rps_cpus set on {rps}",
                n.name,
                n.rx.len()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let on = entries.unwrap_or(0) > 0
        && nics
            .iter()
            .any(|n| n.rx.iter().any(|(c, _)| c.unwrap_or(0) > 0));
    f(format!(
        "{} (net.core.rps_sock_flow_entries = {}); {queues}",
        if on {
            "on: receive processing follows the CPU the reading thread last ran on"
        } else {
            "off: receive processing runs where the NIC's IRQ (or RPS) puts it, not where the reader waits"
        },
        entries.map_or("unreadable".into(), |e| e.to_string())
    ))
}

/// XPS: info (which CPU's transmit queue a sender uses).
fn judge_xps(nics: &[Nic]) -> Finding {
    let f = |d: String| check::XPS.found(Level::Info, d);
    if nics.is_empty() {
        return f("no hardware network device".into());
    }
    f(nics
        .iter()
        .map(|n| {
            let files = n.tx.iter().filter(|m| m.is_some()).count();
            let set =
                n.tx.iter()
                    .filter(|m| m.as_deref().is_some_and(|m| !mask_empty(m)))
                    .count();
            if files == 0 {
                format!(
                    "{}: {} tx queue(s), no xps_cpus (single queue or no XPS)",
                    n.name,
                    n.tx.len()
                )
            } else {
                format!(
                    "{}: {} tx queue(s), xps_cpus set on {set}",
                    n.name,
                    n.tx.len()
                )
            }
        })
        .collect::<Vec<_>>()
        .join("; "))
}

/// io_uring: ok when an instance can be created (it is dropped at once);
/// bad when not (the io_uring source and bench --source uring fail).
fn io_uring() -> Finding {
    let sysctl = read("/proc/sys/kernel/io_uring_disabled");
    let f = |level, d: String| check::IO_URING.found(level, d);
    let s = sysctl
        .as_deref()
        .map(|v| format!("kernel.io_uring_disabled = {v}"))
        .unwrap_or_else(|| "no kernel.io_uring_disabled sysctl".into());
    match io_uring::IoUring::new(2) {
        Ok(ring) => {
            drop(ring);
            f(Level::Ok, format!("io_uring_setup works ({s})"))
        }
        Err(e) => f(Level::Bad, format!("io_uring_setup fails: {e} ({s})")).advice(
            match sysctl.as_deref() {
                Some("2") => "io_uring is disabled for everyone: as root, sysctl kernel.io_uring_disabled=0 to use the io_uring source",
                Some("1") => "io_uring is limited to CAP_SYS_ADMIN and the group in kernel.io_uring_group: add the user to that group, or sysctl kernel.io_uring_disabled=0",
                _ => "the kernel refuses io_uring (a seccomp filter, a container runtime, or CONFIG_IO_URING off): the io_uring source cannot work here; use the socket or channel sources",
            },
        ),
    }
}

// ---------------------------------------------------------------- wake-up

/// Measure what a sleeping waiter pays to be woken here: a producer sends
/// messages to a consumer asleep on a channel, `gap` apart, and the
/// consumer times ring to running (the channel dates its rings). Returns
/// the sorted wake-ups, or why there are none. Why two gaps: after a short
/// idle (20 µs, a request/response turn) a halt-polling vCPU is still
/// polling; after a long one (2 ms) it has halted, whatever the setting.
fn wake_ups(gap: std::time::Duration, n: usize) -> Result<Vec<u64>, String> {
    use fastwake::source::channel::{self, Config};
    use fastwake::source::{BlockReport, block_until_ready};
    let (mut tx, mut rx) = channel::channel(Config::default()).map_err(|e| e.to_string())?;
    let two = fastwake::cpu::online() >= 2;
    let prod = std::thread::spawn(move || {
        if two {
            let _ = fastwake::cpu::pin(0);
        }
        for i in 0..n as u64 {
            // Short gaps are spun (a sleep that short would oversleep).
            if gap < std::time::Duration::from_micros(200) {
                let until = std::time::Instant::now() + gap;
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::sleep(gap);
            }
            if tx.send(i, b"").is_err() {
                return;
            }
        }
    });
    let cons = std::thread::spawn(move || {
        if two {
            let _ = fastwake::cpu::pin(1);
        }
        let mut wakes = Vec::with_capacity(n);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for _ in 0..n {
            let mut rep = BlockReport::default();
            match block_until_ready(&mut rx, Some(deadline), &mut rep) {
                Ok(Some(_)) => wakes.extend(rep.wake_ns),
                _ => break,
            }
        }
        wakes
    });
    let _ = prod.join();
    let mut w = cons
        .join()
        .map_err(|_| "consumer thread failed".to_string())?;
    if w.len() < n / 2 {
        return Err(format!("{} of {n} waits slept", w.len()));
    }
    w.sort_unstable();
    Ok(w)
}

fn wake_up() -> (WakeUp, Finding) {
    let two = fastwake::cpu::online() >= 2;
    let short = wake_ups(std::time::Duration::from_micros(20), 200);
    let long = wake_ups(std::time::Duration::from_millis(2), 100);
    let mut w = WakeUp {
        producer_cpu: two.then_some(0),
        consumer_cpu: two.then_some(1),
        ..Default::default()
    };
    // Each series stands on its own: one that did not sleep enough (a
    // loaded host: the consumer found messages waiting) does not hide the
    // other.
    let mut errors = Vec::new();
    let mut said = Vec::new();
    for (idle, label, r, slot) in [
        (20.0, "20 µs", short, &mut w.after_20us_idle),
        (2000.0, "2 ms", long, &mut w.after_2ms_idle),
    ] {
        match r {
            Ok(v) => {
                *slot = WakeStats::of(idle, &v);
                let p50 = slot.as_ref().map_or(0.0, |x| x.p50_us);
                said.push(format!(
                    "{p50:.1} µs after {label} idle ({} sleeps)",
                    v.len()
                ));
            }
            Err(e) => {
                said.push(format!("not measured after {label} idle: {e}"));
                errors.push(format!("after {label} idle: {e}"));
            }
        }
    }
    if !errors.is_empty() {
        w.error = Some(errors.join("; "));
    }
    let d = format!(
        "p50 {}: ring to running of a thread asleep on a channel{}; hybrid/adaptive avoid it for waits shorter than their spin",
        said.join(", "),
        if two {
            ", producer on CPU 0, consumer on CPU 1"
        } else {
            ""
        },
    );
    (w, check::WAKE_UP_LATENCY.found(Level::Info, d))
}

// ---------------------------------------------------------------- date

/// `t` as RFC 3339 in UTC, whole seconds (`2026-11-24T04:05:06Z`).
pub fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let secs = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_above_the_threshold_is_a_warning() {
        let busy = "some avg10=47.10 avg60=30.02 avg300=12.00 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0";
        let f = judge_psi(Some(busy));
        assert_eq!(f.level, Level::Warn, "{f:?}");
        assert!(f.detail.contains("47.1"), "{}", f.detail);
        assert!(f.advice.as_deref().unwrap().contains("spinning"));
        let idle = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0";
        assert_eq!(judge_psi(Some(idle)).level, Level::Ok);
        // The threshold itself is still ok ("above" warns).
        assert_eq!(
            judge_psi(Some("some avg10=10.00 avg60=0 avg300=0 total=0")).level,
            Level::Ok
        );
        assert_eq!(
            judge_psi(Some("some avg10=10.01 avg60=0 avg300=0 total=0")).level,
            Level::Warn
        );
        assert_eq!(judge_psi(None).level, Level::Info);
        assert_eq!(judge_psi(Some("garbage")).level, Level::Info);
    }

    #[test]
    fn dates_are_rfc3339_utc() {
        let at = |s: u64| rfc3339_utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn cpu_lists_are_compressed() {
        assert_eq!(cpu_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }

    fn state(cpu: u32, name: &str, exit_us: u64, disabled: bool) -> IdleState {
        IdleState {
            cpu,
            name: name.into(),
            exit_us,
            disabled,
        }
    }

    #[test]
    fn deep_idle_states_warn_unless_disabled() {
        let mut s = vec![
            state(0, "POLL", 0, false),
            state(0, "C1", 2, false),
            state(0, "C6", 133, false),
            state(1, "POLL", 0, false),
            state(1, "C1", 2, false),
            state(1, "C6", 133, true),
        ];
        let f = judge_idle(Some("intel_idle"), &s);
        assert_eq!(f.level, Level::Warn, "{f:?}");
        assert!(
            f.detail.contains("C6 133 µs enabled on cpu 0"),
            "{}",
            f.detail
        );
        s[2].disabled = true;
        assert_eq!(judge_idle(Some("intel_idle"), &s).level, Level::Ok);
        // In a guest the declared latencies are not the cost: info.
        let hp = [
            state(0, "POLL", 0, false),
            state(0, "haltpoll idle", 1, false),
        ];
        assert_eq!(judge_idle(Some("haltpoll"), &hp).level, Level::Info);
        assert_eq!(judge_idle(None, &[]).level, Level::Info);
    }

    #[test]
    fn halt_polling_judgements() {
        assert_eq!(
            judge_halt_poll(Some("haltpoll"), true, Some(0)).level,
            Level::Warn
        );
        assert_eq!(
            judge_halt_poll(Some("haltpoll"), true, Some(50_000)).level,
            Level::Info
        );
        assert_eq!(
            judge_halt_poll(Some("haltpoll"), true, Some(200_000)).level,
            Level::Ok
        );
        assert_eq!(
            judge_halt_poll(Some("intel_idle"), false, None).level,
            Level::Info
        );
    }

    #[test]
    fn governors_other_than_performance_warn() {
        let p = |c: u32, g: &str| (c, g.to_string());
        assert_eq!(judge_governors(&[]).level, Level::Info);
        assert_eq!(
            judge_governors(&[p(0, "performance"), p(1, "performance")]).level,
            Level::Ok
        );
        let f = judge_governors(&[p(0, "performance"), p(1, "schedutil"), p(2, "schedutil")]);
        assert_eq!(f.level, Level::Warn);
        assert!(f.detail.contains("schedutil on cpu 1-2"), "{}", f.detail);
    }

    #[test]
    fn memlock_matters_only_with_rdma_devices() {
        let small = Some(8 << 20);
        assert_eq!(judge_memlock(small, small, false, false).level, Level::Info);
        let f = judge_memlock(small, small, true, false);
        assert_eq!(f.level, Level::Warn);
        assert!(f.detail.contains("8 MiB"), "{}", f.detail);
        assert_eq!(judge_memlock(small, small, true, true).level, Level::Ok);
        assert_eq!(judge_memlock(None, None, true, false).level, Level::Ok);
        assert_eq!(
            judge_memlock(Some(MEMLOCK_WARN_BYTES), None, true, false).level,
            Level::Ok
        );
    }

    #[test]
    fn irqbalance_warns_only_with_completion_irqs() {
        assert_eq!(judge_irqbalance(false, true).level, Level::Ok);
        assert_eq!(judge_irqbalance(true, false).level, Level::Info);
        assert_eq!(judge_irqbalance(true, true).level, Level::Warn);
    }

    #[test]
    fn isolation_is_read_from_sysfs() {
        assert_eq!(
            judge_isolated(Some(""), Some("(null)"), Some("quiet")).level,
            Level::Info
        );
        let f = judge_isolated(Some("2-3"), Some("2-3"), Some("isolcpus=2-3 nohz_full=2-3"));
        assert_eq!(f.level, Level::Ok);
        assert!(
            f.detail.contains("isolated 2-3, nohz_full 2-3"),
            "{}",
            f.detail
        );
    }

    #[test]
    fn vectors_cover_cpus_or_say_which_do_not() {
        let dev = |v: Vectors| vec![("mlx5_0".to_string(), v)];
        let full = dev(vec![(0, 25, vec![0]), (1, 26, vec![1])]);
        assert_eq!(judge_vectors(&full, &[0, 1]).level, Level::Ok);
        let part = dev(vec![(0, 25, vec![0]), (1, 26, vec![0])]);
        let f = judge_vectors(&part, &[0, 1]);
        assert_eq!(f.level, Level::Info);
        assert!(f.detail.contains("cpu 1 alone"), "{}", f.detail);
        assert_eq!(judge_vectors(&dev(vec![]), &[0, 1]).level, Level::Info);
        assert_eq!(judge_vectors(&[], &[0, 1]).level, Level::Info);
    }

    #[test]
    fn warn_lines_carry_advice_and_a_guide_section() {
        let mut r = Report::new("h".into(), "d".into(), "Linux x".into());
        r.push(judge_psi(Some("some avg10=47.10 avg60=0 avg300=0 total=0")));
        r.push(judge_psi(Some("some avg10=0.00 avg60=0 avg300=0 total=0")));
        assert_eq!(r.warnings, 1);
        let t = render_text(&r);
        let lines: Vec<&str> = t.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.trim_start().starts_with("warn"))
            .unwrap();
        assert!(lines[i + 1].trim_start().starts_with("-> "), "{t}");
        assert_eq!(
            lines[i + 2].trim(),
            format!("see {GUIDE}#{}", anchor::PRESSURE),
            "{t}"
        );
        // ok lines stand alone.
        let j = lines
            .iter()
            .position(|l| l.trim_start().starts_with("ok"))
            .unwrap();
        assert!(!lines[j + 1].contains("see "), "{t}");
        assert!(t.contains("1 warning(s), 0 bad."), "{t}");
    }

    /// Every anchor doctor can print is a heading of docs/tuning.md.
    #[test]
    fn every_anchor_is_a_section_of_the_guide() {
        let guide = include_str!("../../../docs/tuning.md");
        let anchors: Vec<String> = guide
            .lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| {
                l.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect();
        for a in anchor::ALL {
            assert!(
                anchors.iter().any(|h| h == a),
                "no heading for #{a} in docs/tuning.md: {anchors:?}"
            );
        }
    }
}
