//! Port counters (`/sys/class/infiniband/DEV/ports/N/hw_counters/*`):
//! a baseline per context and port, read when monitoring starts on the
//! context and again after each report, so a report says what moved since
//! the last. Read with raw syscalls (rustix): the preload shim's own `read`
//! hook must not see these reads. Used by the shim's monitor and by the
//! library's verbs source (`source::verbs::monitor`).

use std::sync::Mutex;

struct Base {
    ctx: usize,
    dev: String,
    port: u8,
    vals: Vec<(String, u64)>,
}
static BASES: Mutex<Vec<Base>> = Mutex::new(Vec::new());

fn read_file(path: &str) -> Option<String> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&fd, &mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// Every counter of one port, by name (empty if the port has none).
pub fn read(dev: &str, port: u8) -> Vec<(String, u64)> {
    let dir = format!("/sys/class/infiniband/{dev}/ports/{port}/hw_counters");
    let Ok(fd) = rustix::fs::open(
        dir.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(d) = rustix::fs::Dir::read_from(&fd) else {
        return Vec::new();
    };
    let mut v: Vec<(String, u64)> = d
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                return None;
            }
            let val = read_file(&format!("{dir}/{name}"))?.parse().ok()?;
            Some((name, val))
        })
        .collect();
    v.sort();
    v
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Base>> {
    BASES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Baselines of every port of `dev` for context `ctx`.
pub fn baseline(ctx: usize, dev: &str) {
    let mut b = lock();
    // Once per context: a later call would move the baseline past what a
    // report should see.
    if b.iter().any(|b| b.ctx == ctx) {
        return;
    }
    for port in 1..=4u8 {
        let vals = read(dev, port);
        if vals.is_empty() && port > 1 {
            break;
        }
        b.push(Base {
            ctx,
            dev: dev.to_string(),
            port,
            vals,
        });
    }
}

/// Forget context `ctx`'s baselines (closed).
pub fn forget(ctx: usize) {
    lock().retain(|b| b.ctx != ctx);
}

/// (device name, counters that moved since the baseline); the baseline
/// moves to now.
pub fn moved(ctx: usize, port: u8) -> (String, Vec<(String, u64)>) {
    let mut b = lock();
    let Some(base) = b.iter_mut().find(|b| b.ctx == ctx && b.port == port) else {
        return ("?".into(), Vec::new());
    };
    let now = read(&base.dev, port);
    let m = super::cause::moved(&base.vals, &now);
    base.vals = now;
    (base.dev.clone(), m)
}
