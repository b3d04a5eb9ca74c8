//! `fastwake stats [-p PID] [--watch SECS] [--json]`: the live counters of
//! running shimmed processes, read from the shared-memory segment each one
//! keeps (`<dir>/fastwake-<pid>`, layout `fastwake::preload_stats`,
//! docs/design/shim.md "Live counters").
//!
//! Read-only: segments are mapped `PROT_READ` and the process is never
//! stopped or signalled. The one write is the removal of stale segments
//! (of processes that are gone, or whose pid now belongs to another
//! program), which a process killed by SIGKILL could not remove itself.

use fastwake::preload_stats::{self as ps, Call, MAGIC, PREFIX, Pass, Segment, VERSION};
use fastwake::{Fail, Result};
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The process whose counters to print
    ///
    /// The process whose counters to print (without it: list the shimmed
    /// processes).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
    /// Reprint every SECS seconds, with rates
    ///
    /// Reprints every SECS seconds, with per-second rates over the interval,
    /// until the process exits (Ctrl-C ends it).
    #[arg(long, value_name = "SECS", value_parser = parse_watch)]
    pub watch: Option<f64>,
    /// One JSON document (with --watch: one per interval, one per line).
    #[arg(long)]
    pub json: bool,
}

fn parse_watch(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.01..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not a number of seconds from 0.01 to 86400"
        )),
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.pid {
        None => list(&a),
        Some(pid) => show(pid, &a),
    }
}

// ------------------------------------------------------------ segments

/// A segment mapped read-only.
struct Mapped {
    ptr: *mut std::ffi::c_void,
    len: usize,
    path: PathBuf,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, not referenced after.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

impl Mapped {
    fn seg(&self) -> &Segment {
        // SAFETY: `open` checked the magic, the version and that the
        // mapping holds a whole Segment of this layout.
        unsafe { &*(self.ptr as *const Segment) }
    }
}

/// Why a segment cannot be read: one line each.
enum Bad {
    Missing,
    Io(String),
    Foreign(String),
}

/// Map `path` read-only and check magic, layout version and size.
fn open(path: &Path) -> std::result::Result<Mapped, Bad> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Bad::Missing),
        Err(e) => {
            return Err(Bad::Io(format!(
                "cannot read {}: {e} (a segment is readable by its process's user only)",
                path.display()
            )));
        }
    };
    let len = f
        .metadata()
        .map_err(|e| Bad::Io(format!("{}: {e}", path.display())))?
        .len() as usize;
    // The first 16 bytes (magic, version, size) stay where they are in
    // every layout version.
    if len < 16 {
        return Err(Bad::Foreign(format!(
            "{} is not a fastwake stats segment ({len} bytes)",
            path.display()
        )));
    }
    // SAFETY: a fresh read-only shared mapping of the file's length.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::SHARED,
            &f,
            0,
        )
    }
    .map_err(|e| Bad::Io(format!("cannot map {}: {e}", path.display())))?;
    let m = Mapped {
        ptr,
        len,
        path: path.to_path_buf(),
    };
    // SAFETY: at least 16 readable bytes; the magic is an atomic the
    // writer stores last; version and size are plain u32s after it.
    let (magic, version, size) = unsafe {
        let p = ptr as *const u8;
        (
            (*(p as *const std::sync::atomic::AtomicU64)).load(Ordering::Acquire),
            (p.add(8) as *const u32).read(),
            (p.add(12) as *const u32).read(),
        )
    };
    if magic != MAGIC {
        return Err(Bad::Foreign(format!(
            "{} is not a fastwake stats segment (or is still being created)",
            path.display()
        )));
    }
    if version != VERSION {
        return Err(Bad::Foreign(format!(
            "{} has layout version {version}; this fastwake ({}) reads version {VERSION}: use the fastwake that came with the shim",
            path.display(),
            env!("CARGO_PKG_VERSION")
        )));
    }
    let want = std::mem::size_of::<Segment>();
    if size as usize != want || len < want {
        return Err(Bad::Foreign(format!(
            "{}: size {size} (file {len} bytes), expected {want} for layout version {VERSION}",
            path.display()
        )));
    }
    Ok(m)
}

/// The segment files that may exist for `pid` (or for every pid), in
/// every directory a shim may have used.
fn candidates(pid: Option<u32>) -> Vec<(u32, PathBuf)> {
    let mut dirs = ps::dirs();
    dirs.dedup();
    let mut out = Vec::new();
    for d in dirs {
        match pid {
            Some(p) => {
                let f = d.join(format!("{PREFIX}{p}"));
                if f.exists() {
                    out.push((p, f));
                }
            }
            None => {
                let Ok(rd) = std::fs::read_dir(&d) else {
                    continue;
                };
                for e in rd.flatten() {
                    let name = e.file_name();
                    let Some(n) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                        continue;
                    };
                    if let Ok(p) = n.parse::<u32>() {
                        out.push((p, e.path()));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Is the segment's process alive and still the one that made it?
#[derive(PartialEq, Debug)]
enum Life {
    Live,
    /// No such process.
    Gone,
    /// The pid is another process now, or the program exec'd one that
    /// does not map the segment.
    Replaced,
}

fn life(m: &Mapped) -> Life {
    let h = &m.seg().header;
    let Ok(stat) = std::fs::read(format!("/proc/{}/stat", h.pid)) else {
        return Life::Gone;
    };
    if h.start_ticks != 0 && ps::start_ticks(&stat) != Some(h.start_ticks) {
        return Life::Replaced;
    }
    // The process must still map this file (an exec into an unshimmed
    // program keeps the pid and start time but drops the mapping).
    match std::fs::read_to_string(format!("/proc/{}/maps", h.pid)) {
        Ok(maps) => {
            let want = std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone());
            let want = want.to_string_lossy();
            if maps.lines().any(|l| l.ends_with(&*want)) {
                Life::Live
            } else {
                Life::Replaced
            }
        }
        // Not ours to read: the start time matched, trust it.
        Err(_) => Life::Live,
    }
}

// ------------------------------------------------------------ snapshot

/// A copy of a segment's values at one instant.
struct Snap {
    pid: u32,
    mode: String,
    fastwake: String,
    command: String,
    budget_ns: u64,
    cpu_cap_ppm: u32,
    uptime: Duration,
    at: Instant,
    totals: Value,
}

fn snap(m: &Mapped) -> Snap {
    let s = m.seg();
    let h = &s.header;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Snap {
        pid: h.pid,
        mode: ps::field_str(&h.mode),
        fastwake: ps::field_str(&h.fastwake),
        command: ps::field_str(&h.command),
        budget_ns: h.budget_ns,
        cpu_cap_ppm: h.cpu_cap_ppm,
        uptime: Duration::from_nanos(now.saturating_sub(h.start_unix_ns)),
        at: Instant::now(),
        totals: totals(s),
    }
}

/// Every counter, by name (the JSON document's counter part, and what the
/// text tables print).
fn totals(s: &Segment) -> Value {
    let l = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let mut calls = Map::new();
    for c in Call::ALL {
        let k = s.call(c);
        let mut passed = Map::new();
        let mut sum = 0;
        for why in Pass::ALL {
            let n = l(&k.passed[why as usize]);
            sum += n;
            passed.insert(why.name().into(), n.into());
        }
        let served = l(&k.served);
        calls.insert(
            c.name().into(),
            json!({"seen": served + sum, "served": served, "passed": sum, "passed_because": passed}),
        );
    }
    let e = &s.engine;
    let d = &s.dispatch;
    let v = &s.verbs;
    let st = &s.stalls;
    let p = &s.pollers;
    json!({
        "calls": calls,
        "engine": {
            "waits": l(&e.waits), "spins": l(&e.spins), "spin_hits": l(&e.spin_hits),
            "spin_ns": l(&e.spin_ns), "blocked": l(&e.blocked),
            "prewakes": l(&e.prewakes), "prewake_caught": l(&e.prewake_caught),
            "no_spin": {"same_cpu": l(&e.same_cpu), "siblings": l(&e.siblings),
                        "capped": l(&e.capped), "contended": l(&e.contended)},
        },
        "dispatch": {"waits": l(&d.waits), "handoffs": l(&d.handoffs), "fallbacks": l(&d.fallbacks)},
        "verbs": {
            "contexts_wrapped": l(&v.ctx_wrapped), "contexts_passed": l(&v.ctx_passed),
            "cqs": l(&v.cqs), "waits": l(&v.waits), "events_synthetic": l(&v.synthetic),
            "events_real": l(&v.real), "events_swallowed": l(&v.swallowed),
            "blocked": l(&v.blocked), "arms_skipped": l(&v.arms_skipped),
            "stashed_cqes_delivered": l(&v.stash_delivered), "acks_absorbed": l(&v.acks_absorbed),
            "channels": l(&v.channels), "fdset_ready": l(&v.fdset_ready),
            "fdset_absorbed": l(&v.fdset_absorbed), "cqs_ex_served": l(&v.cqs_ex_served),
            "cqs_ex_passed": l(&v.cqs_ex),
        },
        "stalls": {
            "completions": l(&st.completions), "stalls": l(&st.stalls), "episodes": l(&st.episodes),
            "unreported_episodes": l(&st.unreported), "unobserved": l(&st.unobserved),
            "max_ns": l(&st.max_ns), "untracked_posts": l(&st.untracked),
            "odp_kept": l(&st.odp_kept), "odp_prefetched": l(&st.odp_prefetched),
            "odp_pinned": l(&st.odp_pinned),
        },
        "pollers": {
            "empty_polls": l(&p.empty_polls), "sleeps": l(&p.sleeps),
            "woke_by_completion": l(&p.woke_by_completion), "woke_by_bound": l(&p.woke_by_bound),
            "polling_ns": l(&p.polling_ns), "sleep_ns": l(&p.sleep_ns),
            "threads_off_hazard": l(&p.off_hazard), "unsleepable": l(&p.unsleepable),
        },
    })
}

/// Per-second rates between two `totals` documents of the same shape.
fn rates(now: &Value, before: &Value, secs: f64) -> Value {
    match (now, before) {
        (Value::Object(a), Value::Object(b)) => Value::Object(
            a.iter()
                .map(|(k, v)| (k.clone(), rates(v, b.get(k).unwrap_or(&Value::Null), secs)))
                .collect(),
        ),
        (Value::Number(a), b) => {
            let a = a.as_u64().unwrap_or(0);
            let b = b.as_u64().unwrap_or(0);
            json!((a.saturating_sub(b)) as f64 / secs)
        }
        _ => Value::Null,
    }
}

fn program(command: &str) -> String {
    let first = command.split(' ').next().unwrap_or("?");
    Path::new(first)
        .file_name()
        .map_or(first.to_string(), |f| f.to_string_lossy().into_owned())
}

fn uptime_text(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    }
}

fn header_json(s: &Snap) -> Value {
    json!({
        "meta": crate::meta::RunMeta::now(),
        "pid": s.pid,
        "program": program(&s.command),
        "command": s.command,
        "mode": s.mode,
        "budget_ns": s.budget_ns,
        "cpu_cap": s.cpu_cap_ppm as f64 / 1e6,
        "shim_version": s.fastwake,
        "uptime_s": s.uptime.as_secs_f64(),
    })
}

// ---------------------------------------------------------------- list

/// Remove a stale segment; one line on stderr unless JSON.
fn remove_stale(pid: u32, path: &Path, why: &str, quiet: bool) -> bool {
    let ok = std::fs::remove_file(path).is_ok();
    if !quiet {
        eprintln!(
            "fastwake: {} stale segment {} (pid {pid} {why})",
            if ok { "removed" } else { "could not remove" },
            path.display()
        );
    }
    ok
}

fn list(a: &Args) -> Result<()> {
    if a.watch.is_some() {
        return Err(Fail::invalid("--watch needs -p PID"));
    }
    let mut rows = Vec::new();
    let mut removed = Vec::new();
    for (pid, path) in candidates(None) {
        let m = match open(&path) {
            Ok(m) => m,
            // Only process `pid` writes `fastwake-<pid>`: with it gone, a
            // segment it never finished (killed while creating it) or of
            // another layout is stale all the same.
            Err(Bad::Foreign(_)) if !pid_exists(pid) => {
                if remove_stale(pid, &path, "is gone", a.json) {
                    removed.push(pid);
                }
                continue;
            }
            // Not ours to judge (another user's, a live foreign file): skip.
            Err(_) => continue,
        };
        match life(&m) {
            Life::Live => rows.push(snap(&m)),
            Life::Gone => {
                if remove_stale(pid, &path, "is gone", a.json) {
                    removed.push(pid);
                }
            }
            Life::Replaced => {
                if remove_stale(pid, &path, "is another program now", a.json) {
                    removed.push(pid);
                }
            }
        }
    }
    if a.json {
        let procs: Vec<Value> = rows
            .iter()
            .map(|s| {
                json!({"pid": s.pid, "program": program(&s.command), "command": s.command,
                       "mode": s.mode, "uptime_s": s.uptime.as_secs_f64()})
            })
            .collect();
        let doc = json!({"meta": crate::meta::RunMeta::now(), "processes": procs, "removed_stale": removed});
        println!("{doc}");
        return Ok(());
    }
    if rows.is_empty() {
        let dirs: Vec<String> = ps::dirs().iter().map(|d| d.display().to_string()).collect();
        println!(
            "no shimmed processes found (segments fastwake-PID in {}; a process run with FASTWAKE_MODE=off has none)",
            dirs.join(", ")
        );
        return Ok(());
    }
    println!(
        "{:>8}  {:<16} {:<14} {:>9}  COMMAND",
        "PID", "PROGRAM", "MODE", "UPTIME"
    );
    for s in &rows {
        println!(
            "{:>8}  {:<16} {:<14} {:>9}  {}",
            s.pid,
            program(&s.command),
            s.mode,
            uptime_text(s.uptime),
            s.command
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- show

/// The mapped segment of `pid`, or one line saying why not.
fn find(pid: u32) -> Result<Mapped> {
    let found = candidates(Some(pid));
    let mut last = None;
    for (_, path) in &found {
        match open(path) {
            Ok(m) => match life(&m) {
                Life::Live => return Ok(m),
                Life::Gone => {
                    remove_stale(pid, path, "is gone", true);
                    last = Some(format!(
                        "pid {pid}: stale segment {} (the process is gone; removed)",
                        path.display()
                    ));
                }
                Life::Replaced => {
                    remove_stale(pid, path, "is another program now", true);
                    last = Some(format!(
                        "pid {pid}: stale segment {} (the pid now belongs to a process that does not map it; removed)",
                        path.display()
                    ));
                }
            },
            Err(Bad::Missing) => {}
            Err(Bad::Foreign(_)) if !pid_exists(pid) => {
                remove_stale(pid, path, "is gone", true);
                last = Some(format!(
                    "pid {pid}: stale segment {} (the process is gone; removed)",
                    path.display()
                ));
            }
            Err(Bad::Io(l) | Bad::Foreign(l)) => last = Some(l),
        }
    }
    if let Some(l) = last {
        return Err(Fail::invalid(l));
    }
    if pid_exists(pid) {
        Err(Fail::invalid(format!(
            "pid {pid} is not shimmed: no segment {PREFIX}{pid} (not run under the shim, FASTWAKE_MODE=off, or the shim could not create it: FASTWAKE_VERBOSE=1 says why)"
        )))
    } else {
        Err(Fail::new(libc::ESRCH, format!("no process {pid}")))
    }
}

fn show(pid: u32, a: &Args) -> Result<()> {
    let m = find(pid)?;
    let mut prev = snap(&m);
    print_snap(&prev, None, a.json);
    let Some(secs) = a.watch else {
        return Ok(());
    };
    loop {
        std::thread::sleep(Duration::from_secs_f64(secs));
        let gone = life(&m) != Life::Live;
        let now = snap(&m);
        let dt = now.at.duration_since(prev.at).as_secs_f64().max(1e-9);
        print_snap(&now, Some((&prev, dt)), a.json);
        if gone {
            if !a.json {
                println!("pid {pid} has exited (last counters above)");
            }
            return Ok(());
        }
        prev = now;
    }
}

fn print_snap(s: &Snap, prev: Option<(&Snap, f64)>, as_json: bool) {
    let r = prev.map(|(p, dt)| (rates(&s.totals, &p.totals, dt), dt));
    if as_json {
        let mut doc = header_json(s);
        doc["counters"] = s.totals.clone();
        if let Some((r, dt)) = &r {
            doc["interval_s"] = json!(dt);
            doc["rates_per_s"] = r.clone();
        }
        println!("{doc}");
        return;
    }
    if let Some((_, dt)) = &r {
        println!("\n--- pid {}: the last {dt:.1}s ---", s.pid);
    }
    print!("{}", table(s, r.as_ref().map(|(r, _)| r)));
}

/// The text report: the header, one row per call kind that was seen, the
/// engine's counters, and dispatch's and verbs' when they moved. With
/// `rates`, a per-second column over the last interval.
fn table(s: &Snap, rates: Option<&Value>) -> String {
    use std::fmt::Write;
    let t = &s.totals;
    let g = |v: &Value, path: &[&str]| -> f64 {
        let mut v = v;
        for p in path {
            v = &v[*p];
        }
        v.as_f64().unwrap_or(0.0)
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "pid {}  {}\nmode {}  budget {}us  cpu cap {}%  up {}  shim {}",
        s.pid,
        s.command,
        s.mode,
        s.budget_ns / 1000,
        s.cpu_cap_ppm / 10_000,
        uptime_text(s.uptime),
        s.fastwake
    );
    let _ = writeln!(o);
    let _ = write!(
        o,
        "{:<18} {:>12} {:>12} {:>12}",
        "call", "seen", "served", "passed"
    );
    if rates.is_some() {
        let _ = write!(o, " {:>10} {:>10}", "seen/s", "served/s");
    }
    let _ = writeln!(o, "  passed because");
    let mut any = false;
    for c in Call::ALL {
        let path = ["calls", c.name()];
        let seen = g(t, &[path[0], path[1], "seen"]);
        if seen == 0.0 {
            continue;
        }
        any = true;
        let _ = write!(
            o,
            "{:<18} {:>12} {:>12} {:>12}",
            c.name(),
            seen,
            g(t, &[path[0], path[1], "served"]),
            g(t, &[path[0], path[1], "passed"])
        );
        if let Some(r) = rates {
            let _ = write!(
                o,
                " {:>10.0} {:>10.0}",
                g(r, &[path[0], path[1], "seen"]),
                g(r, &[path[0], path[1], "served"])
            );
        }
        let why: Vec<String> = Pass::ALL
            .iter()
            .filter_map(|w| {
                let n = g(t, &[path[0], path[1], "passed_because", w.name()]);
                (n > 0.0).then(|| format!("{}={n}", w.name()))
            })
            .collect();
        let _ = writeln!(o, "  {}", why.join(" "));
    }
    if !any {
        let _ = writeln!(o, "(no hooked call made yet)");
    }
    let _ = writeln!(o);
    let row = |o: &mut String, label: &str, path: &[&str]| {
        let _ = write!(o, "  {:<28} {:>14}", label, g(t, path));
        if let Some(r) = rates {
            let _ = write!(o, " {:>12.1}/s", g(r, path));
        }
        let _ = writeln!(o);
    };
    let _ = writeln!(o, "wait engine (spin, then block)");
    row(&mut o, "waits", &["engine", "waits"]);
    row(&mut o, "spins", &["engine", "spins"]);
    row(
        &mut o,
        "spin hits (no block needed)",
        &["engine", "spin_hits"],
    );
    row(&mut o, "blocked", &["engine", "blocked"]);
    row(
        &mut o,
        "pre-wakes (sleep, then spin)",
        &["engine", "prewakes"],
    );
    row(
        &mut o,
        "pre-wakes caught spinning",
        &["engine", "prewake_caught"],
    );
    let spin_ms = g(t, &["engine", "spin_ns"]) / 1e6;
    let _ = write!(o, "  {:<28} {:>14.3}", "spin CPU (ms)", spin_ms);
    if let Some(r) = rates {
        let _ = write!(
            o,
            " {:>11.1}% of one CPU",
            g(r, &["engine", "spin_ns"]) / 1e7
        );
    } else if s.uptime.as_secs_f64() > 0.0 {
        let _ = write!(
            o,
            "  ({:.2}% of one CPU over the uptime)",
            spin_ms / 10.0 / s.uptime.as_secs_f64()
        );
    }
    let _ = writeln!(o);
    let spins = g(t, &["engine", "spins"]);
    if spins > 0.0 {
        let _ = writeln!(
            o,
            "  {:<28} {:>13.1}%",
            "spins that hit",
            100.0 * g(t, &["engine", "spin_hits"]) / spins
        );
    }
    row(
        &mut o,
        "no spin: peer on same CPU",
        &["engine", "no_spin", "same_cpu"],
    );
    row(
        &mut o,
        "no spin: sibling waits",
        &["engine", "no_spin", "siblings"],
    );
    row(&mut o, "no spin: CPU cap", &["engine", "no_spin", "capped"]);
    row(
        &mut o,
        "no spin: contended",
        &["engine", "no_spin", "contended"],
    );
    if g(t, &["pollers", "empty_polls"]) > 0.0 {
        let _ = writeln!(o, "pollers (busy-polling threads put to sleep)");
        row(&mut o, "empty polls", &["pollers", "empty_polls"]);
        row(&mut o, "sleeps", &["pollers", "sleeps"]);
        row(
            &mut o,
            "ended by a completion",
            &["pollers", "woke_by_completion"],
        );
        row(&mut o, "ended by the bound", &["pollers", "woke_by_bound"]);
        let ms = |k: &str| g(t, &["pollers", k]) / 1e6;
        let _ = writeln!(
            o,
            "  {:<28} {:>14.3}",
            "idle polling before (ms)",
            ms("polling_ns")
        );
        let _ = writeln!(o, "  {:<28} {:>14.3}", "asleep (ms)", ms("sleep_ns"));
        row(
            &mut o,
            "threads off: hazard",
            &["pollers", "threads_off_hazard"],
        );
        row(&mut o, "unsleepable sets", &["pollers", "unsleepable"]);
    }
    if g(t, &["dispatch", "waits"]) > 0.0 {
        let _ = writeln!(o, "dispatch");
        row(&mut o, "waits", &["dispatch", "waits"]);
        row(&mut o, "hand-offs and relays", &["dispatch", "handoffs"]);
        row(&mut o, "fallbacks to interrupt", &["dispatch", "fallbacks"]);
    }
    if g(t, &["verbs", "contexts_wrapped"]) + g(t, &["verbs", "contexts_passed"]) > 0.0 {
        let _ = writeln!(o, "verbs");
        for k in [
            "contexts_wrapped",
            "contexts_passed",
            "cqs",
            "waits",
            "events_synthetic",
            "events_real",
            "events_swallowed",
            "blocked",
            "arms_skipped",
            "stashed_cqes_delivered",
            "acks_absorbed",
            "channels",
            "fdset_ready",
            "fdset_absorbed",
            "cqs_ex_served",
            "cqs_ex_passed",
        ] {
            row(&mut o, k, &["verbs", k]);
        }
    }
    let odp = ["odp_kept", "odp_prefetched", "odp_pinned"];
    if g(t, &["stalls", "completions"]) + odp.iter().map(|k| g(t, &["stalls", k])).sum::<f64>()
        > 0.0
    {
        let _ = writeln!(o, "verbs stall monitor");
        for k in [
            "completions",
            "stalls",
            "episodes",
            "unreported_episodes",
            "unobserved",
            "untracked_posts",
        ]
        .iter()
        .chain(odp.iter())
        {
            row(&mut o, k, &["stalls", k]);
        }
        let _ = writeln!(
            o,
            "  {:<28} {:>13.3} ms",
            "longest completion",
            g(t, &["stalls", "max_ns"]) / 1e6
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_divide_deltas() {
        let a = json!({"x": 30, "y": {"z": 10}});
        let b = json!({"x": 10, "y": {"z": 10}});
        assert_eq!(rates(&a, &b, 2.0), json!({"x": 10.0, "y": {"z": 0.0}}));
    }

    #[test]
    fn watch_values() {
        assert!(parse_watch("1").is_ok());
        assert!(parse_watch("0.5").is_ok());
        assert!(parse_watch("0").is_err());
        assert!(parse_watch("-1").is_err());
        assert!(parse_watch("nan").is_err());
    }

    #[test]
    fn program_is_the_basename() {
        assert_eq!(program("/usr/bin/redis-server *:6399"), "redis-server");
    }
}
