//! Network and io_uring checks: busy polling, RFS, XPS, io_uring.

use super::finding::*;
use super::host::*;

/// Busy polling sysctls (µs; 0 = off): info either way, since what they
/// cost or give depends on the traffic (only NIC queues with a NAPI id).
pub(super) fn judge_busy_poll(
    read_us: Option<u64>,
    poll_us: Option<u64>,
    net_admin: bool,
) -> Finding {
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
pub(super) struct Nic {
    pub(super) name: String,
    pub(super) rx: Vec<(Option<u64>, Option<String>)>, // (rps_flow_cnt, rps_cpus) per rx queue
    pub(super) tx: Vec<Option<String>>,                // xps_cpus per tx queue (None: no file)
}

pub(super) fn nics() -> Vec<Nic> {
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
pub(super) fn mask_empty(m: &str) -> bool {
    m.chars().all(|c| c == '0' || c == ',')
}

/// RFS: info (loopback and veth traffic does not use it; for NIC traffic
/// it moves receive processing to the reader's CPU).
pub(super) fn judge_rfs(entries: Option<u64>, nics: &[Nic]) -> Finding {
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
pub(super) fn judge_xps(nics: &[Nic]) -> Finding {
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
pub(super) fn io_uring() -> Finding {
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
