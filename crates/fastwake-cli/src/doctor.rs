//! `fastwake doctor`: what this host offers for microsecond waiting, and
//! what to change. Read-only: it never modifies the host.

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
    match read("/sys/devices/system/cpu/cpuidle/current_driver") {
        Some(d) if d != "none" => r.info(
            "cpuidle driver",
            format!(
                "{d} (deep C-states add wake-up latency; consider limiting them for latency runs)"
            ),
        ),
        _ => r.info("cpuidle driver", "none (idle CPUs halt; typical in VMs)"),
    }
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
