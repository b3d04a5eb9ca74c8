//! CPU and scheduler checks: CPUs, virtualisation, pressure, the
//! contention sampler, isolation, irqbalance, idle states, guest halt
//! polling, frequency governors.

use super::finding::*;
use super::host::*;
use std::fmt::Write as _;
use std::path::Path;

pub(super) fn cpus() -> Finding {
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

pub(super) fn judge_virtualised(virt: bool) -> Finding {
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
pub(super) fn psi_some_avg10(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with("some"))?
        .split_ascii_whitespace()
        .find_map(|t| t.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// CPU pressure: warn above [`PSI_WARN_SOME_AVG10`].
pub(super) fn judge_psi(text: Option<&str>) -> Finding {
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
pub(super) fn contention_sampler() -> Finding {
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

/// Whether a thread may ask for its own scheduler slice
/// (`fastwake::slice`), tried on a thread of its own. Ok when the kernel
/// keeps it, info when it does not (before Linux 6.12): nothing is wrong,
/// a waiter there simply has no such lever.
pub(super) fn waiter_slice() -> Finding {
    let tried = std::thread::spawn(|| {
        fastwake::slice::set_slice(Some(fastwake::slice::MIN))
            .and_then(|()| fastwake::slice::get_slice())
    })
    .join();
    judge_waiter_slice(match tried {
        Ok(r) => r.map_err(|e| (e.errno(), e.to_string())),
        Err(_) => Err((libc::EIO, "the probing thread panicked".into())),
    })
}

pub(super) fn judge_waiter_slice(
    tried: std::result::Result<Option<std::time::Duration>, (i32, String)>,
) -> Finding {
    let f = |level, d: String| check::WAITER_SLICE.found(level, d);
    match tried {
        Ok(Some(s)) => f(
            Level::Ok,
            format!(
                "a thread may ask for its own slice (asked {:?}, got {s:?}): adaptive waits sleep under a short one while others keep their CPU busy, and fastwake::slice::set_slice (fastwake run --slice) gives one to a whole waiting thread, so that it preempts a busy neighbour when it wakes",
                fastwake::slice::MIN
            ),
        ),
        Ok(None) => f(
            Level::Info,
            "the kernel took a slice but reports none back".to_string(),
        ),
        Err((errno, e)) if errno == libc::EOPNOTSUPP => f(
            Level::Info,
            format!(
                "{e}: a waiting thread beside a busy neighbour waits for the neighbour's turn to end"
            ),
        ),
        Err((_, e)) => f(Level::Info, format!("could not ask for a slice: {e}")),
    }
}

/// Isolated CPUs: `isolated` and `nohz_full` from /sys, isolcpus from the
/// command line. Isolation is ok; none is info (fine for everything but
/// dedicated pollers).
pub(super) fn judge_isolated(
    isolated: Option<&str>,
    nohz: Option<&str>,
    cmdline: Option<&str>,
) -> Finding {
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
pub(super) fn irqbalance_running() -> bool {
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
pub(super) fn judge_irqbalance(running: bool, irq_vectors: bool) -> Finding {
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
pub(super) struct IdleState {
    pub(super) cpu: u32,
    pub(super) name: String,
    pub(super) exit_us: u64,
    pub(super) disabled: bool,
}

pub(super) fn idle_states() -> Vec<IdleState> {
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
pub(super) fn judge_idle(driver: Option<&str>, states: &[IdleState]) -> Finding {
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
pub(super) fn judge_halt_poll(driver: Option<&str>, virt: bool, ns: Option<u64>) -> Finding {
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
pub(super) fn governors() -> Vec<(u32, String)> {
    numbered("/sys/devices/system/cpu", "cpu")
        .into_iter()
        .filter_map(|(c, d)| Some((c, read_path(&d.join("cpufreq/scaling_governor"))?)))
        .collect()
}

/// Frequency governor: ok when every CPU with cpufreq runs `performance`,
/// warn otherwise; info when no CPU has cpufreq (VMs: the host decides).
pub(super) fn judge_governors(govs: &[(u32, String)]) -> Finding {
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

/// The user-space wait instructions a busy poller could park on instead of
/// spinning (`umonitor`/`umwait`, Intel's WAITPKG; `monitorx`/`mwaitx`,
/// AMD's): read from CPUID, which a guest sees as its hypervisor exposes
/// it. fastwake does not use them: its pollers sleep in the kernel
/// (`FASTWAKE_POLLERS=sleep`), and a monitor/wait on a CQE's owner word has
/// not been measured to pay on a host this project ran on.
pub(super) fn user_wait() -> Finding {
    let (waitpkg, monitorx) = user_wait_cpuid();
    let yes = |b: bool| if b { "yes" } else { "no" };
    check::USER_WAIT.found(
        Level::Info,
        format!(
            "umonitor/umwait (WAITPKG): {}; monitorx/mwaitx: {}; not used (busy pollers sleep in the kernel)",
            yes(waitpkg),
            yes(monitorx)
        ),
    )
}

#[cfg(target_arch = "x86_64")]
fn user_wait_cpuid() -> (bool, bool) {
    use std::arch::x86_64::__cpuid_count;
    let max = __cpuid_count(0, 0).eax;
    let waitpkg = max >= 7 && __cpuid_count(7, 0).ecx & (1 << 5) != 0;
    let ext = __cpuid_count(0x8000_0000, 0).eax;
    let monitorx = ext >= 0x8000_0001 && __cpuid_count(0x8000_0001, 0).ecx & (1 << 29) != 0;
    (waitpkg, monitorx)
}

#[cfg(not(target_arch = "x86_64"))]
fn user_wait_cpuid() -> (bool, bool) {
    (false, false)
}
