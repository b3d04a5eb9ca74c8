//! CPU pressure, sampled off the fast path.
//!
//! Spinning on a CPU that other threads want only steals their time and
//! gets the spinner preempted (a wait then lasts a time slice). Whether
//! others want *our* CPU is visible only in /proc, which costs syscalls, so
//! a lazily started thread ("fw-pressure") reads it every [`PERIOD`] and
//! publishes one flag per adaptive waiter into an atomic the waiter reads
//! for free. Signals, over the last [`WINDOW_PERIODS`] periods (200 ms:
//! /proc/stat counts CPU time in 10 ms ticks, and over the 100 ms window
//! first used here the tick rounding alone showed an idle CPU as 20–30 %
//! busy with "others" now and then, enough to flip the flag):
//!
//! - **others' share of the waiter's CPU**: the CPU's busy time from
//!   /proc/stat minus the CPU time of the adaptive waiters on it (from
//!   /proc/self/task/TID/schedstat). A co-located hog shows as ~50-95 %
//!   whether the waiter spins or sleeps.
//! - **the waiter's run-queue delay** (schedstat field 2): while it spins
//!   against others it waits for the CPU a time slice at a time; per
//!   scheduling it stays a few µs when the CPU is free.
//!
//! Contended = others > 35 % or (others ≥ 10 %, delay > 5 % of the time
//! and > 20 µs per scheduling); cleared only below 20 % and either 2.5 %
//! delay or 10 % others (hysteresis, so a waiter does not flip every
//! period). The delay needs others because in a VM the waiter's own delay
//! includes the vCPU's wake-up from halt after each sleep. System-wide figures (PSI cpu "some",
//! procs_running) are read for reports only: on a shared machine they say
//! little about one CPU. Where /proc cannot be read the sampler reports
//! "unavailable" and nothing counts as contended.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Sampling period.
pub const PERIOD: Duration = Duration::from_millis(50);
/// Periods per measurement window.
pub const WINDOW_PERIODS: usize = 4;
/// Period while no adaptive waiter exists.
const IDLE_PERIOD: Duration = Duration::from_millis(500);

const ENTER_OTHERS: f64 = 0.35;
const EXIT_OTHERS: f64 = 0.20;
const ENTER_DELAY: f64 = 0.05;
const EXIT_DELAY: f64 = 0.025;
const DELAY_PER_SLICE_NS: f64 = 20_000.0;
/// Run-queue delay counts only when others use at least this share of the
/// CPU: in a VM our own thread's delay includes the vCPU waking from halt
/// after each of its sleeps (measured: 2.7–4.1 % delay on an otherwise idle
/// CPU at 10k–100k waits/s, windows above 5 % at > 20 µs per scheduling,
/// with 10–15 % "others" from tick rounding), which is no contention.
const DELAY_NEEDS_OTHERS: f64 = 0.25;

const NO_CPU: u32 = u32::MAX;
const UNKNOWN: u32 = u32::MAX;

/// What the sampler publishes for one waiter.
#[derive(Debug)]
pub struct Shared {
    tid: AtomicI32,
    cpu: AtomicU32,
    contended: AtomicBool,
    /// Others' share of the waiter's CPU, ‰ (UNKNOWN until sampled).
    others: AtomicU32,
    /// The waiter's run-queue delay, ‰ of the time.
    delay: AtomicU32,
    /// The thread's trials ([`super::trials`]).
    trials: super::trials::Published,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            tid: AtomicI32::new(0),
            cpu: AtomicU32::new(NO_CPU),
            contended: AtomicBool::new(false),
            others: AtomicU32::new(UNKNOWN),
            delay: AtomicU32::new(UNKNOWN),
            trials: Default::default(),
        }
    }
}

impl Shared {
    /// Does the sampler consider this waiter's CPU contended?
    #[inline]
    pub fn contended(&self) -> bool {
        self.contended.load(Ordering::Relaxed)
    }

    /// The thread's trials: what the waiter counts and reads for them.
    #[inline]
    pub fn trials(&self) -> &super::trials::Published {
        &self.trials
    }

    pub(crate) fn set_cpu(&self, cpu: u32) {
        self.cpu.store(cpu, Ordering::Relaxed);
    }

    /// Others' share of the waiter's CPU (0..1), once sampled.
    pub fn others_share(&self) -> Option<f64> {
        let v = self.others.load(Ordering::Relaxed);
        (v != UNKNOWN).then(|| v as f64 / 1000.0)
    }

    /// A short description for reports.
    pub fn describe(&self) -> String {
        let cpu = self.cpu.load(Ordering::Relaxed);
        match (self.others_share(), self.delay.load(Ordering::Relaxed)) {
            (Some(o), d) if d != UNKNOWN => format!(
                "cpu{cpu}: others {:.0}%, run-queue delay {:.1}%{}",
                o * 100.0,
                d as f64 / 10.0,
                if self.contended() { " (contended)" } else { "" }
            ),
            _ => format!("cpu{cpu}: pressure {}", status()),
        }
    }
}

struct Registry {
    waiters: Vec<Weak<Shared>>,
    /// Threads of this process that only use idle CPU (the `SCHED_IDLE`
    /// dispatchers), with their CPU: their time is not "others wanting the
    /// CPU". Counting it made a waiter next to a dispatcher see its CPU as
    /// ~90 % contended and sleep, which left the dispatcher more idle CPU
    /// to fill: a feedback loop.
    idle_threads: Vec<(i32, u32)>,
    started: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    waiters: Vec::new(),
    idle_threads: Vec::new(),
    started: false,
});

// A forked child has neither the sampler thread nor the parent's idle
// threads: it starts its own sampler on its first waiter.
crate::fork::hold_across_fork!(hold_across_fork, REGISTRY, Registry, |r| {
    r.idle_threads.clear();
    r.started = false;
});

/// Declare the calling thread, pinned to `cpu`, as one that only runs on
/// idle CPU (`SCHED_IDLE`): the sampler does not count it as contention.
/// Undo with [`forget_idle_thread`] before the thread exits.
pub(crate) fn declare_idle_thread(cpu: u32) -> i32 {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    hold_across_fork();
    let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    r.idle_threads.push((tid, cpu));
    tid
}

/// See [`declare_idle_thread`].
pub(crate) fn forget_idle_thread(tid: i32) {
    let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    r.idle_threads.retain(|&(t, _)| t != tid);
}
static AVAILABLE: AtomicI32 = AtomicI32::new(-1);

fn status() -> &'static str {
    match AVAILABLE.load(Ordering::Relaxed) {
        -1 => "not sampled yet",
        0 => "unavailable (/proc/stat or schedstat unreadable)",
        _ => "sampled",
    }
}

/// Register the calling thread as the one waiting for `sh` (cold path:
/// one gettid syscall) and start the sampler if it is not running.
pub(crate) fn register(sh: &Arc<Shared>) {
    sh.tid.store(
        rustix::thread::gettid().as_raw_nonzero().get(),
        Ordering::Relaxed,
    );
    // Before the sampler starts, no thread can hold the lock at a fork.
    hold_across_fork();
    let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    if !r.waiters.iter().any(|w| w.as_ptr() == Arc::as_ptr(sh)) {
        r.waiters.push(Arc::downgrade(sh));
    }
    if !r.started {
        // A failed spawn leaves the waiters uncontended forever: the
        // controller then decides on its cost model alone.
        r.started = std::thread::Builder::new()
            .name("fw-pressure".into())
            .spawn(sampler)
            .is_ok();
    }
}

struct Snapshot {
    t: Instant,
    busy: Vec<CpuTime>,
    tasks: HashMap<i32, (u64, u64, u64)>,
}

fn sampler() {
    let mut hist: VecDeque<Snapshot> = VecDeque::new();
    let mut trials = super::trials::Driver::default();
    loop {
        let (live, idle): (Vec<Arc<Shared>>, Vec<(i32, u32)>) = {
            let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
            r.waiters.retain(|w| w.strong_count() > 0);
            (
                r.waiters.iter().filter_map(Weak::upgrade).collect(),
                r.idle_threads.clone(),
            )
        };
        if live.is_empty() {
            hist.clear();
            std::thread::sleep(IDLE_PERIOD);
            continue;
        }
        let Some(busy) = cpu_times() else {
            AVAILABLE.store(0, Ordering::Relaxed);
            std::thread::sleep(PERIOD);
            continue;
        };
        let mut tasks = HashMap::new();
        for w in &live {
            let tid = w.tid.load(Ordering::Relaxed);
            if tid > 0
                && let Some(v) = read_task(tid)
            {
                tasks.insert(tid, v);
            }
        }
        for &(tid, _) in &idle {
            if let Some(v) = read_task(tid) {
                tasks.insert(tid, v);
            }
        }
        let now = Snapshot {
            t: Instant::now(),
            busy,
            tasks,
        };
        if let Some(old) = hist.front() {
            AVAILABLE.store(1, Ordering::Relaxed);
            publish(old, &now, &live, &idle);
        }
        step_trials(&mut trials, hist.back(), &now, &live);
        hist.push_back(now);
        while hist.len() > WINDOW_PERIODS {
            hist.pop_front();
        }
        std::thread::sleep(PERIOD);
    }
}

fn publish(old: &Snapshot, now: &Snapshot, live: &[Arc<Shared>], idle: &[(i32, u32)]) {
    let dt = now.t.duration_since(old.t).as_nanos() as f64;
    if dt <= 0.0 {
        return;
    }
    // CPU time of the adaptive waiters, per CPU they last reported.
    let mut own: HashMap<u32, f64> = HashMap::new();
    for w in live {
        let tid = w.tid.load(Ordering::Relaxed);
        if let (Some(a), Some(b)) = (old.tasks.get(&tid), now.tasks.get(&tid)) {
            *own.entry(w.cpu.load(Ordering::Relaxed)).or_default() +=
                b.0.saturating_sub(a.0) as f64;
        }
    }
    for &(tid, cpu) in idle {
        if let (Some(a), Some(b)) = (old.tasks.get(&tid), now.tasks.get(&tid)) {
            *own.entry(cpu).or_default() += b.0.saturating_sub(a.0) as f64;
        }
    }
    for w in live {
        let cpu = w.cpu.load(Ordering::Relaxed);
        let tid = w.tid.load(Ordering::Relaxed);
        let (Some(b0), Some(b1)) = (old.busy.get(cpu as usize), now.busy.get(cpu as usize)) else {
            continue;
        };
        let busy = b1.busy_ns.saturating_sub(b0.busy_ns) as f64;
        let others = ((busy - own.get(&cpu).copied().unwrap_or(0.0)) / dt).clamp(0.0, 1.0);
        let (delay, per_slice) = match (old.tasks.get(&tid), now.tasks.get(&tid)) {
            (Some(a), Some(b)) => {
                let d = b.1.saturating_sub(a.1) as f64;
                let n = b.2.saturating_sub(a.2).max(1) as f64;
                (d / dt, d / n)
            }
            _ => (0.0, 0.0),
        };
        let was = w.contended();
        let is = if was {
            !(others < EXIT_OTHERS && (delay < EXIT_DELAY || others < DELAY_NEEDS_OTHERS))
        } else {
            others > ENTER_OTHERS
                || (others >= DELAY_NEEDS_OTHERS
                    && delay > ENTER_DELAY
                    && per_slice > DELAY_PER_SLICE_NS)
        };
        w.others.store((others * 1000.0) as u32, Ordering::Relaxed);
        w.delay
            .store((delay.min(1.0) * 1000.0) as u32, Ordering::Relaxed);
        w.contended.store(is, Ordering::Relaxed);
    }
}

/// One period from `prev` to `now` has passed: the waiting threads'
/// trials observe it ([`super::trials::Driver::step`]).
fn step_trials(
    trials: &mut super::trials::Driver,
    prev: Option<&Snapshot>,
    now: &Snapshot,
    live: &[Arc<Shared>],
) {
    let mut ran = HashMap::new();
    let mut dt = 0.0;
    if let Some(p) = prev {
        dt = now.t.duration_since(p.t).as_nanos() as f64;
        for (tid, b) in &now.tasks {
            if let Some(a) = p.tasks.get(tid) {
                ran.insert(*tid, (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)));
            }
        }
    }
    let live: Vec<(i32, &super::trials::Published)> = live
        .iter()
        .map(|w| (w.tid.load(Ordering::Relaxed), &w.trials))
        .filter(|(tid, _)| *tid > 0)
        .collect();
    trials.step(dt, &ran, &live);
}

/// The length of one /proc/stat tick, ns.
fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / if hz > 0 { hz as u64 } else { 100 }
}

/// One CPU's time since boot, ns, from /proc/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Busy, as the contention sampler counts it: user+nice+system+irq+
    /// softirq (steal and idle excluded).
    pub busy_ns: u64,
    /// Steal: time the hypervisor ran something else while this vCPU
    /// wanted to run (0 on bare metal, and in guests that do not report
    /// it).
    pub steal_ns: u64,
}

/// Every CPU's time since boot, indexed by CPU number, in /proc/stat's
/// ticks (10 ms on most kernels, so a difference over less than a second
/// is coarse). `None` where /proc/stat is unreadable. Benchmarks subtract
/// their own threads' CPU time from a CPU's busy difference to tell what
/// others took; `fastwake doctor` reads the steal.
pub fn cpu_times() -> Option<Vec<CpuTime>> {
    parse_times(&std::fs::read_to_string("/proc/stat").ok()?, tick_ns())
}

/// [`cpu_times`] on the text of /proc/stat.
fn parse_times(stat: &str, tick_ns: u64) -> Option<Vec<CpuTime>> {
    let mut v = Vec::new();
    for line in stat.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            break;
        };
        // "cpu " is the total line, "cpuN" one CPU. (Parsing the total
        // line's first figure as N made every sample allocate and zero a
        // vector as long as the machine's user ticks: tens of MB every
        // 50 ms, 7.5 % of a CPU, on the waiters' CPU, where it starved a
        // SCHED_IDLE dispatcher for ms at a time.)
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let mut f = rest.split_ascii_whitespace();
        let Some(Ok(n)) = f.next().map(str::parse::<usize>) else {
            continue;
        };
        let x: Vec<u64> = f.filter_map(|t| t.parse().ok()).collect();
        if x.len() < 7 {
            return None;
        }
        if v.len() <= n {
            v.resize(n + 1, CpuTime::default());
        }
        v[n] = CpuTime {
            busy_ns: (x[0] + x[1] + x[2] + x[5] + x[6]) * tick_ns,
            // Kernels before 2.6.11 have no steal column.
            steal_ns: x.get(7).copied().unwrap_or(0) * tick_ns,
        };
    }
    (!v.is_empty()).then_some(v)
}

/// (run ns, run-queue delay ns, times scheduled) of one of our threads.
fn read_task(tid: i32) -> Option<(u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let t = crate::cpu::SchedStat::parse(&s)?;
    Some((t.run_ns, t.delay_ns, t.scheduled))
}

/// System-wide CPU pressure for reports: PSI cpu "some" avg10 (%) and
/// procs_running, where readable.
pub fn system() -> (Option<f64>, Option<u64>) {
    let psi = std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("some"))?;
            let v = line
                .split_ascii_whitespace()
                .find_map(|t| t.strip_prefix("avg10="))?;
            v.parse().ok()
        });
    let running = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        let l = s.lines().find(|l| l.starts_with("procs_running"))?;
        l.split_ascii_whitespace().nth(1)?.parse().ok()
    });
    (psi, running)
}

#[cfg(test)]
mod tests {
    use super::parse_times;
    use super::{Arc, HashMap, Instant, Ordering, Shared, Snapshot};
    use std::time::Duration;

    /// The sampler's step hands each thread's trials its CPU and
    /// run-queue delay over the period, from the schedstat snapshots at
    /// both ends: a thread whose periods with the short slice waited twice
    /// as long for its CPU ends up without it.
    #[test]
    fn the_sampler_runs_a_threads_trials_on_its_schedstat() {
        let w = Arc::new(Shared::default());
        w.tid.store(42, Ordering::Relaxed);
        let live = [w.clone()];
        let mut trials = super::super::trials::Driver::default();
        let t0 = Instant::now();
        let snap = |i: u32, run: u64, delay: u64| Snapshot {
            t: t0 + Duration::from_millis(50 * i as u64),
            busy: Vec::new(),
            tasks: HashMap::from([(42, (run, delay, 0))]),
        };
        let (mut run, mut delay) = (0u64, 0u64);
        let mut prev = snap(0, 0, 0);
        super::step_trials(&mut trials, None, &prev, &live);
        for i in 1..=20 {
            let on = w.trials().slice_on();
            for _ in 0..10 {
                w.trials().note_slice_sleep(1);
            }
            run += 2_000_000;
            delay += if on { 10_000_000 } else { 5_000_000 };
            let now = snap(i, run, delay);
            super::step_trials(&mut trials, Some(&prev), &now, &live);
            prev = now;
        }
        assert!(!w.trials().slice_on(), "dropped");
        let d = w.trials().describe(true, false).expect("a trial ended");
        assert!(d.contains("does not pay") && d.contains("1.71x"), "{d}");
    }

    /// Busy ns per CPU, as the sampler reads it.
    fn parse_busy(stat: &str, tick_ns: u64) -> Option<Vec<u64>> {
        Some(
            parse_times(stat, tick_ns)?
                .into_iter()
                .map(|t| t.busy_ns)
                .collect(),
        )
    }

    #[test]
    fn busy_time_is_read_per_cpu_and_the_total_line_is_skipped() {
        let stat = "cpu  5123456 10 20000 900000 300 40 50 0 0 0\n\
                    cpu0 100 1 200 400000 3 4 5 0 0 0\n\
                    cpu1 1000 0 2000 500000 30 40 50 0 0 0\n\
                    intr 123 4 5\n";
        let v = parse_busy(stat, 10).expect("parsed");
        // Two CPUs, not 5,123,457 slots for the total line's user ticks.
        assert_eq!(
            v,
            vec![(100 + 1 + 200 + 4 + 5) * 10, (1000 + 2000 + 40 + 50) * 10]
        );
        assert_eq!(parse_busy("cpu0 1 2 3\n", 10), None, "too few fields");
        let t = parse_times(stat, 10).expect("parsed");
        assert_eq!(t[1].steal_ns, 0);
        let t = parse_times("cpu0 1 0 2 400 3 4 5 17 0 0\n", 10).expect("parsed");
        assert_eq!(t[0].steal_ns, 170, "steal is the eighth figure");
        assert_eq!(t[0].busy_ns, (1 + 2 + 4 + 5) * 10);
    }
}
