//! Listing numbered entries of /proc and /sys (CPUs, idle states, NIC
//! queues, processes, threads), for `fastwake doctor` and the benchmarks.

/// Numbered directories `<dir>/<prefix><N>` as (N, path).
pub fn numbered(dir: &str, prefix: &str) -> Vec<(u32, std::path::PathBuf)> {
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
