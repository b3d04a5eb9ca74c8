//! The run time of other processes' threads, from /proc: what ran
//! besides this process while it measured (`fastwake doctor`'s cpu gaps,
//! `fastwake bench lanes`).

use crate::listing::numbered;

/// A thread: (pid, tid).
pub type Tid = (i32, i32);

/// Run time so far (ns) of every thread of every other process.
pub type RunTimes = std::collections::HashMap<Tid, u64>;

/// [`RunTimes`] now, from /proc (threads that cannot be read are left
/// out: they may have exited).
pub fn run_times() -> RunTimes {
    let me = std::process::id();
    let mut out = RunTimes::new();
    for (pid, dir) in numbered("/proc", "").into_iter().filter(|&(p, _)| p != me) {
        for (tid, task) in numbered(&dir.join("task").to_string_lossy(), "") {
            let ns = std::fs::read_to_string(task.join("schedstat"))
                .ok()
                .and_then(|s| s.split_ascii_whitespace().next()?.parse().ok());
            if let Some(ns) = ns {
                out.insert((pid as i32, tid as i32), ns);
            }
        }
    }
    out
}

/// The threads that ran between `before` and `after` (a thread that
/// started meanwhile counts from 0), longest first, and their total (ns).
pub fn ran(before: &RunTimes, after: &RunTimes) -> (Vec<(Tid, u64)>, u64) {
    let mut v: Vec<(Tid, u64)> = after
        .iter()
        .map(|(k, &ns)| (*k, ns.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|&(_, d)| d > 0)
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let total = v.iter().map(|x| x.1).sum();
    (v, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_times_leave_this_process_out() {
        let me = std::process::id() as i32;
        let r = run_times();
        assert!(r.keys().all(|&(pid, _)| pid != me), "own threads listed");
    }
}
