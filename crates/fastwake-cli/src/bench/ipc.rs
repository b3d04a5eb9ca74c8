//! `fastwake bench ipc`: the paper's IPC comparison on this host.
//!
//! Every classic way for one thread to wake another, measured with the same
//! harness as the channel, cross-core and same-core, plus a user-level stack
//! switch (what the FastWake dispatcher does instead of a kernel wake-up).

use super::harness::{Case, End, Placement};
use super::sources::channel as chan;
use super::stats::{Row, Sample};
use fastwake::source::channel::Doorbell;
use fastwake::{Fail, Result, WaitMode};
use rustix::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Mechanisms `bench ipc` knows, in report order.
pub const ALL: &[&str] = &[
    "spin",
    "spin-yield",
    "futex",
    "eventfd",
    "pipe",
    "socketpair",
    "condvar",
    "semaphore",
    "channel-poll",
    "channel-hybrid",
    "channel-interrupt",
    "stack-switch",
];

/// Whether a mechanism makes sense with both ends on one CPU. Pure spinning
/// there waits for the scheduler tick (4 ms at HZ=250) on every message.
pub fn same_core_ok(m: &str) -> bool {
    !matches!(m, "spin" | "channel-poll")
}

// --- shared-flag spinning -------------------------------------------------

struct Flag {
    mine: Arc<AtomicU64>,
    theirs: Arc<AtomicU64>,
    seq: u64,
    yield_: bool,
}

impl End for Flag {
    fn send(&mut self) -> Result<()> {
        self.seq += 1;
        self.mine.store(self.seq, Ordering::Release);
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        while self.theirs.load(Ordering::Acquire) < self.seq {
            if self.yield_ {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

fn flags(yield_: bool) -> (Box<dyn End>, Box<dyn End>) {
    let a = Arc::new(AtomicU64::new(0));
    let b = Arc::new(AtomicU64::new(0));
    // The pong end waits for seq 1 before its first send, so its counter
    // starts one ahead on the receive side.
    (
        Box::new(Flag {
            mine: a.clone(),
            theirs: b.clone(),
            seq: 0,
            yield_,
        }),
        Box::new(PongFlag(Flag {
            mine: b,
            theirs: a,
            seq: 0,
            yield_,
        })),
    )
}

/// The pong side receives before it sends; shift its sequence accordingly.
struct PongFlag(Flag);
impl End for PongFlag {
    fn send(&mut self) -> Result<()> {
        self.0.mine.store(self.0.seq, Ordering::Release);
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        self.0.seq += 1;
        self.0.recv()
    }
}

// --- futex ------------------------------------------------------------------

struct Futex {
    mine: Arc<AtomicU32>,
    theirs: Arc<AtomicU32>,
    seen: u32,
}

impl End for Futex {
    fn send(&mut self) -> Result<()> {
        self.mine.fetch_add(1, Ordering::Release);
        rustix::thread::futex::wake(&self.mine, rustix::thread::futex::Flags::PRIVATE, 1)?;
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        loop {
            let v = self.theirs.load(Ordering::Acquire);
            if v != self.seen {
                self.seen = v;
                return Ok(());
            }
            let _ = rustix::thread::futex::wait(
                &self.theirs,
                rustix::thread::futex::Flags::PRIVATE,
                v,
                None,
            );
        }
    }
}

fn futexes() -> (Box<dyn End>, Box<dyn End>) {
    let a = Arc::new(AtomicU32::new(0));
    let b = Arc::new(AtomicU32::new(0));
    (
        Box::new(Futex {
            mine: a.clone(),
            theirs: b.clone(),
            seen: 0,
        }),
        Box::new(Futex {
            mine: b,
            theirs: a,
            seen: 0,
        }),
    )
}

// --- fd-based: eventfd, pipe, socketpair ----------------------------------

struct FdEnd {
    tx: OwnedFd,
    rx: OwnedFd,
    buf: Vec<u8>,
}

impl End for FdEnd {
    fn send(&mut self) -> Result<()> {
        let n = rustix::io::write(&self.tx, &self.buf)?;
        if n != self.buf.len() {
            return Err(Fail::new(libc::EIO, "short write"));
        }
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        let mut got = 0;
        while got < self.buf.len() {
            got += rustix::io::read(&self.rx, &mut self.buf[got..])?;
        }
        Ok(())
    }
}

fn fd_pair(kind: &str, size: usize) -> Result<(Box<dyn End>, Box<dyn End>)> {
    let (size, ab, ba) = match kind {
        "eventfd" => {
            let e1 = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
            let e2 = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
            // An eventfd carries exactly one u64.
            (8, (e1.try_clone()?, e1), (e2.try_clone()?, e2))
        }
        "pipe" => (
            size.max(1),
            swap(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?),
            swap(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?),
        ),
        _ => {
            let (s1, s2) = rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )?;
            (size.max(1), (s1.try_clone()?, s2.try_clone()?), (s2, s1))
        }
    };
    // ab = (write end used by ping, read end used by pong), ba likewise.
    let mut buf = vec![0u8; size];
    if kind == "eventfd" {
        buf.copy_from_slice(&1u64.to_ne_bytes());
    }
    Ok((
        Box::new(FdEnd {
            tx: ab.0,
            rx: ba.1,
            buf: buf.clone(),
        }),
        Box::new(FdEnd {
            tx: ba.0,
            rx: ab.1,
            buf,
        }),
    ))
}

/// pipe() returns (read, write); we want (write, read).
fn swap((r, w): (OwnedFd, OwnedFd)) -> (OwnedFd, OwnedFd) {
    (w, r)
}

// --- condvar ------------------------------------------------------------------

type Slot = Arc<(Mutex<u64>, Condvar)>;

struct Cv {
    mine: Slot,
    theirs: Slot,
    sent: u64,
    seen: u64,
}

impl End for Cv {
    fn send(&mut self) -> Result<()> {
        self.sent += 1;
        *self.mine.0.lock().unwrap() = self.sent;
        // Signal after unlocking: the woken thread does not block again on
        // the mutex we still hold (measured ~2x faster on this machine).
        self.mine.1.notify_one();
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        let mut g = self.theirs.0.lock().unwrap();
        while *g == self.seen {
            g = self.theirs.1.wait(g).unwrap();
        }
        self.seen = *g;
        Ok(())
    }
}

fn condvars() -> (Box<dyn End>, Box<dyn End>) {
    let a: Slot = Arc::new((Mutex::new(0), Condvar::new()));
    let b: Slot = Arc::new((Mutex::new(0), Condvar::new()));
    (
        Box::new(Cv {
            mine: a.clone(),
            theirs: b.clone(),
            sent: 0,
            seen: 0,
        }),
        Box::new(Cv {
            mine: b,
            theirs: a,
            sent: 0,
            seen: 0,
        }),
    )
}

// --- POSIX semaphore ------------------------------------------------------------

struct Sem(Box<std::cell::UnsafeCell<libc::sem_t>>);
// SAFETY: sem_t is designed to be shared between threads; it is only used
// through sem_post/sem_wait, which synchronise internally.
unsafe impl Send for Sem {}
// SAFETY: as above.
unsafe impl Sync for Sem {}

impl Sem {
    fn new() -> Result<Arc<Sem>> {
        // SAFETY: sem_t is plain data; sem_init initialises it below before
        // any other use.
        let s = Sem(Box::new(std::cell::UnsafeCell::new(unsafe {
            std::mem::zeroed()
        })));
        // SAFETY: a valid, heap-pinned sem_t; pshared = 0 (threads only).
        if unsafe { libc::sem_init(s.0.get(), 0, 0) } != 0 {
            return Err(Fail::new(libc::EINVAL, "sem_init failed"));
        }
        Ok(Arc::new(s))
    }
}

impl Drop for Sem {
    fn drop(&mut self) {
        // SAFETY: initialised in new(); no waiters remain once dropped.
        unsafe { libc::sem_destroy(self.0.get()) };
    }
}

struct SemEnd {
    mine: Arc<Sem>,
    theirs: Arc<Sem>,
}

impl End for SemEnd {
    fn send(&mut self) -> Result<()> {
        // SAFETY: an initialised semaphore kept alive by the Arc.
        unsafe { libc::sem_post(self.mine.0.get()) };
        Ok(())
    }
    fn recv(&mut self) -> Result<()> {
        // SAFETY: as above; EINTR is retried.
        while unsafe { libc::sem_wait(self.theirs.0.get()) } != 0 {}
        Ok(())
    }
}

fn semaphores() -> Result<(Box<dyn End>, Box<dyn End>)> {
    let a = Sem::new()?;
    let b = Sem::new()?;
    Ok((
        Box::new(SemEnd {
            mine: a.clone(),
            theirs: b.clone(),
        }),
        Box::new(SemEnd { mine: b, theirs: a }),
    ))
}

/// Build the ends of a two-thread mechanism.
pub fn pair(mech: &str, size: usize) -> Result<(Box<dyn End>, Box<dyn End>)> {
    Ok(match mech {
        "spin" => flags(false),
        "spin-yield" => flags(true),
        "futex" => futexes(),
        "eventfd" | "pipe" | "socketpair" => fd_pair(mech, size)?,
        "condvar" => condvars(),
        "semaphore" => semaphores()?,
        m if m.starts_with("channel-") => {
            let mode: WaitMode = m["channel-".len()..].parse()?;
            let (a, b) = chan::pair(mode, size, Doorbell::Futex)?;
            (Box::new(a), Box::new(b))
        }
        other => return Err(Fail::invalid(format!("unknown ipc mechanism '{other}'"))),
    })
}

/// Build cases for the mechanisms × placements.
pub fn cases(mechs: &[String], cpus: (u32, u32), size: usize) -> Result<Vec<Case>> {
    let mut out = Vec::new();
    for m in mechs {
        if m == "stack-switch" {
            continue; // single-threaded, measured by `stack_switch`
        }
        let mut places = vec![Placement {
            ping_cpu: cpus.0,
            pong_cpu: cpus.1,
        }];
        if cpus.0 != cpus.1 && same_core_ok(m) {
            places.push(Placement {
                ping_cpu: cpus.0,
                pong_cpu: cpus.0,
            });
        }
        for p in places {
            if p.ping_cpu == p.pong_cpu && !same_core_ok(m) {
                continue;
            }
            let (ping, pong) = pair(m, size)?;
            out.push(Case {
                source: "ipc".into(),
                mode: m.clone(),
                placement: p,
                size,
                ping,
                pong,
            });
        }
    }
    Ok(out)
}

/// A user-level context switch: resume a coroutine and let it suspend back,
/// which is the dispatcher-to-task hand-off with no kernel involved. One-way
/// latency = half a round trip.
pub fn stack_switch(iters: u64, cpu: u32) -> Result<Row> {
    use corosensei::{Coroutine, CoroutineResult};
    fastwake::cpu::pin(cpu)?;
    let mut co = Coroutine::new(|y: &corosensei::Yielder<u64, u64>, mut v: u64| {
        loop {
            v = y.suspend(v + 1);
        }
    });
    let mut s = Sample::new();
    let mut v = 0u64;
    let c0 = fastwake::cpu::thread_cpu_time();
    // Timing every round trip would measure the clock (~20 ns) more than the
    // switch (~5 ns): time batches and record the per-switch mean.
    const BATCH: u64 = 100;
    let batches = iters.div_ceil(BATCH).max(1);
    for _ in 0..batches {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            v = match co.resume(v) {
                CoroutineResult::Yield(x) => x,
                CoroutineResult::Return(()) => unreachable!("the coroutine never returns"),
            };
        }
        s.record_one_way(t0.elapsed() / (2 * BATCH as u32));
    }
    let cpu_t = fastwake::cpu::thread_cpu_time() - c0;
    std::hint::black_box(v);
    let mut row = Row::from_sample(
        "ipc",
        "stack-switch",
        "one-thread",
        0,
        &s,
        cpu_t / BATCH as u32,
        Duration::ZERO,
    );
    row.iters = batches * BATCH;
    row.extra
        .insert("note".into(), "batch means of 100 round trips".into());
    Ok(row)
}
