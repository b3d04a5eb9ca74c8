//! Small read-only helpers over /proc and /sys the checks share.

use std::path::Path;

pub(super) fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

pub(super) fn cpu_flags() -> String {
    read("/proc/cpuinfo")
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.to_string())
        })
        .unwrap_or_default()
}

pub(super) fn virtualised() -> bool {
    Path::new("/sys/hypervisor/type").exists() || cpu_flags().contains(" hypervisor")
}

/// `0-3,8` for a sorted or unsorted list of CPUs.
pub(super) fn cpu_list(cpus: &[u32]) -> String {
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

pub(super) fn online_cpus() -> Vec<u32> {
    read("/sys/devices/system/cpu/online")
        .map(|s| fastwake::affinity::irq::parse_cpu_list(&s))
        .unwrap_or_default()
}

pub(super) use crate::listing::numbered;

pub(super) fn read_path(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

pub(super) const CAP_NET_ADMIN: u32 = 12;
pub(super) const CAP_IPC_LOCK: u32 = 14;

/// Whether this process has capability `cap` in effect (/proc/self/status).
pub(super) fn has_cap(cap: u32) -> bool {
    read("/proc/self/status")
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(l.trim_start_matches("CapEff:").trim(), 16).ok()
        })
        .is_some_and(|m| m & (1 << cap) != 0)
}
