//! `fastwake doctor`: what this host offers for microsecond waiting, and
//! what to change. Read-only: it never modifies the host (it measures one
//! thing, the wake-up latency, with two threads of its own for ~0.3 s).

use std::path::Path;

struct Report {
    warnings: u32,
}

impl Report {
    fn ok(&mut self, what: &str, detail: impl AsRef<str>) {
        println!("  ok    {what:<26} {}", detail.as_ref());
    }
    fn info(&mut self, what: &str, detail: impl AsRef<str>) {
        println!("  info  {what:<26} {}", detail.as_ref());
    }
    fn warn(&mut self, what: &str, detail: impl AsRef<str>, advice: &str) {
        self.warnings += 1;
        println!("  warn  {what:<26} {}", detail.as_ref());
        println!("        {:<26} -> {advice}", "");
    }
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

pub fn run() -> fastwake::Result<()> {
    let mut r = Report { warnings: 0 };
    println!("fastwake doctor — host inspection (read-only)");
    println!("cpu and scheduler:");
    let uname = rustix::system::uname();
    r.info(
        "kernel",
        format!(
            "{} {}",
            uname.sysname().to_string_lossy(),
            uname.release().to_string_lossy()
        ),
    );
    let n = fastwake::cpu::online();
    if n < 2 {
        r.warn(
            "cpus",
            format!("{n} usable CPU"),
            "cross-core rows of the benchmarks need 2 CPUs; poll/hybrid modes will only hurt here",
        );
    } else {
        r.ok("cpus", format!("{n} usable CPUs"));
    }
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    match driver.as_deref() {
        Some(d) if d != "none" => r.info(
            "cpuidle driver",
            format!(
                "{d} (deep C-states add wake-up latency; consider limiting them for latency runs)"
            ),
        ),
        _ => r.info("cpuidle driver", "none (idle CPUs halt; typical in VMs)"),
    }
    if driver.as_deref() == Some("haltpoll") {
        halt_polling(&mut r);
    }
    wake_up(&mut r);
    let virt = Path::new("/sys/hypervisor/type").exists() || cpu_flags().contains(" hypervisor");
    if virt {
        r.info(
            "virtualised",
            "yes: cross-core wake-ups are virtual IPIs; compare modes by ratios within one run",
        );
    }
    match read("/proc/pressure/cpu") {
        Some(p) => {
            let some = p.lines().next().unwrap_or("");
            r.ok("cpu pressure (PSI)", some)
        }
        None => r.warn(
            "cpu pressure (PSI)",
            "unavailable",
            "boot with psi=1 so the adaptive mode can see CPU contention",
        ),
    }
    if let Some(c) = read("/proc/cmdline") {
        if c.contains("isolcpus") || c.contains("nohz_full") {
            r.ok("isolated cpus", "isolcpus/nohz_full set");
        } else {
            r.info(
                "isolated cpus",
                "none (pollers share CPUs with everything else; fine for dispatch/hybrid)",
            );
        }
    }

    println!("rdma:");
    let ib = Path::new("/sys/class/infiniband");
    let devs: Vec<String> = std::fs::read_dir(ib)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if devs.is_empty() {
        r.info(
            "rdma devices",
            "none (use scripts/rxe-test for real verbs on Soft-RoCE inside a qemu guest)",
        );
    } else {
        r.ok("rdma devices", devs.join(", "));
    }
    // SAFETY: dlopen with a constant, NUL-terminated name; the handle is
    // closed right away and nothing from the library is called.
    let verbs = unsafe {
        let h = libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_LOCAL,
        );
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    };
    if verbs {
        r.ok("libibverbs", "libibverbs.so.1 loads");
    } else {
        r.info(
            "libibverbs",
            "not installed (apt-get install libibverbs1 ibverbs-providers)",
        );
    }
    let vmx = cpu_flags().contains(" vmx") || cpu_flags().contains(" svm");
    r.info(
        "qemu acceleration",
        if vmx && Path::new("/dev/kvm").exists() {
            "KVM usable for the Soft-RoCE guest"
        } else {
            "no vmx/svm: the Soft-RoCE guest runs under TCG (correctness only, timings meaningless)"
        },
    );

    println!("network and io_uring:");
    match read("/proc/sys/net/core/busy_poll") {
        Some(v) if v != "0" => r.ok("net.core.busy_poll", format!("{v} µs")),
        Some(_) => r.info(
            "net.core.busy_poll",
            "0 (kernel socket busy polling off; only helps NIC traffic, never loopback)",
        ),
        None => r.info("net.core.busy_poll", "not readable"),
    }
    match read("/proc/sys/kernel/io_uring_disabled") {
        Some(v) if v != "0" => r.warn(
            "io_uring",
            format!("io_uring_disabled = {v}"),
            "set kernel.io_uring_disabled=0 to use the io_uring source",
        ),
        _ => r.ok("io_uring", "enabled"),
    }
    println!(
        "{} warning(s). Next: `fastwake bench ipc` measures this host's wake-up costs.",
        r.warnings
    );
    Ok(())
}

/// The guest's halt polling. Why it matters: with `guest_halt_poll_ns` at
/// 0 an idle vCPU halts at once, so every interrupt-mode wake-up of a
/// thread on it goes through the host (an IPI, the host scheduler, a VM
/// entry). Measured on this project's VM type, same minutes, 0 against
/// 200000: `fastwake bench pingpong --mode interrupt,hybrid,poll --cpus
/// 0,1` interrupt p50 22.7 against 2.6 µs (poll and hybrid unchanged at
/// 0.09 µs); this command's wake-up after 20 µs idle 16.1-16.6 against
/// 2.6 µs (after 2 ms idle ~30 µs either way: the poll window is over).
fn halt_polling(r: &mut Report) {
    match guest_halt_poll_ns() {
        Some(0) => r.warn(
            "guest halt polling",
            "off (guest_halt_poll_ns = 0): an idle vCPU halts at once and each wake-up goes through the host",
            "as root, `echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns` lets an idle vCPU poll up to 200 µs before halting (measured on this VM type: interrupt-mode pingpong p50 22.7 -> 2.6 µs, wake-up after 20 µs idle 16 -> 2.6 µs), paid in idle vCPU time; or wait in hybrid/adaptive mode",
        ),
        Some(ns) => r.ok("guest halt polling", format!("up to {ns} ns before halting")),
        None => r.info("guest halt polling", "haltpoll parameters not readable"),
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

fn wake_up(r: &mut Report) {
    let p50 = |w: &[u64]| w[(w.len() - 1) / 2] as f64 / 1000.0;
    let short = wake_ups(std::time::Duration::from_micros(20), 200);
    let long = wake_ups(std::time::Duration::from_millis(2), 100);
    match (short, long) {
        (Ok(s), Ok(l)) => r.info(
            "wake-up latency",
            format!(
                "p50 {:.1} µs after 20 µs idle, {:.1} µs after 2 ms idle: ring to running of a thread asleep on a channel{} ({} + {} sleeps); hybrid/adaptive avoid it for waits shorter than their spin",
                p50(&s),
                p50(&l),
                if fastwake::cpu::online() >= 2 {
                    ", producer on CPU 0, consumer on CPU 1"
                } else {
                    ""
                },
                s.len(),
                l.len()
            ),
        ),
        (Err(e), _) | (_, Err(e)) => r.info("wake-up latency", format!("not measured: {e}")),
    }
}
