//! RDMA checks: devices, libibverbs, memlock, completion vectors, qemu
//! acceleration for the Soft-RoCE guest.

use super::finding::*;
use super::host::*;
use std::fmt::Write as _;
use std::path::Path;

pub(super) fn rdma_devices() -> Vec<String> {
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

pub(super) fn judge_rdma_devices(devs: &[String]) -> Finding {
    if devs.is_empty() {
        check::RDMA_DEVICES.found(
            Level::Info,
            "none (use scripts/rxe-test for real verbs on Soft-RoCE inside a qemu guest)",
        )
    } else {
        check::RDMA_DEVICES.found(Level::Ok, devs.join(", "))
    }
}

pub(super) fn libibverbs(have_devices: bool) -> Finding {
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

pub(super) fn bytes(b: Option<u64>) -> String {
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
pub(super) fn judge_memlock(
    soft: Option<u64>,
    hard: Option<u64>,
    rdma: bool,
    ipc_lock: bool,
) -> Finding {
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
pub(super) fn comp_irqs(dev: &str) -> Vec<(u32, u32, Vec<u32>)> {
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

pub(super) type Vectors = Vec<(u32, u32, Vec<u32>)>;

/// Completion vectors: ok when every online CPU has a vector whose IRQ
/// lands on it alone (fastwake then picks it for a waiter there); info
/// otherwise, and for devices without completion IRQs (rxe, siw) or none.
pub(super) fn judge_vectors(devs: &[(String, Vectors)], online: &[u32]) -> Finding {
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

pub(super) fn qemu_acceleration() -> Finding {
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
