//! Which CPUs have threads of this process waiting on them.
//!
//! Why: a thread spinning for its own next completion holds its CPU; when
//! another thread of the process that waits on the same CPU gets its
//! completion, it cannot run until the spin ends. With 16 connections'
//! threads on one core, hybrid waits measured 1.9× interrupt mode's p50
//! and adaptive waits a p99 of 265 µs against 12 (`fastwake bench share
//! --mode interrupt,hybrid,adaptive`, docs/design/dispatcher.md). So `hybrid` and
//! `adaptive` waits do not spin while a sibling waits on their CPU
//! (`adaptive` hands the wait to the CPU's dispatcher if there is one:
//! that is the case dispatchers are for). `poll` spins by request.
//!
//! A wait counts itself while it blocks (interrupt mode, or a dispatch
//! wait), not while it spins or finds its completion at once: the count
//! is what a spinner must not stand in the way of, and keeping the two
//! atomic updates on the blocking path keeps them off the µs-scale fast
//! path (counting every wait cost hybrid and poll 10-15 ns per one-way
//! trip in `fastwake bench pingpong`). The check before a spin is one
//! load. Counts are per CPU, each on its own cache line, so only threads
//! sharing a CPU share a line.

//!
//! Only a sibling whose wait is *due* counts: one whose own recent blocked
//! waits were short (at most [`SOON_NS`]) and that has not yet slept twice
//! that long. A thread that sleeps for long stretches (a listener in
//! `epoll_wait` between connections, an idle pool thread) would otherwise
//! switch spinning off for every thread on its CPU, for nothing: its
//! completion is not coming during a µs-scale spin. (Measured before this
//! rule: a listener plus workers pinned to one CPU had 114,070 of 115,131
//! waits skip their spin for such a sibling.) A thread with no blocked
//! wait behind it yet does not count either.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 256;

/// Longest typical blocked wait of a sibling that counts: its completion
/// lands during a spin of the default 50 µs budget at least one time in
/// twenty; beyond this, too rarely to give up the spin for.
pub const SOON_NS: u64 = 1_000_000;

/// Blocked siblings on one CPU whose wait is due, and until when the
/// latest of them is due (`monotonic_ns`), on a line of their own.
#[repr(align(64))]
struct Due {
    count: AtomicU32,
    until_ns: AtomicU64,
}

static DUE: [Due; SLOTS] = [const {
    Due {
        count: AtomicU32::new(0),
        until_ns: AtomicU64::new(0),
    }
}; SLOTS];

/// Is some thread of this process blocked on `cpu` in a wait that is due
/// (see the module doc) at `now_ns`?
#[inline]
pub(crate) fn others_asleep(cpu: Option<u32>, now_ns: u64) -> bool {
    cpu.is_some_and(|c| {
        let d = &DUE[c as usize % SLOTS];
        d.count.load(Ordering::Relaxed) > 0 && now_ns < d.until_ns.load(Ordering::Relaxed)
    })
}

/// The calling thread counted as blocked on a CPU until dropped (made by
/// [`Governor::blocking`](super::Governor::blocking)); counted only when
/// its wait is due soon.
pub struct Asleep(Option<usize>);

impl Asleep {
    /// Block on `cpu` from `now_ns` on, expecting to wait about
    /// `typical_ns` (0: unknown).
    pub(crate) fn enter(cpu: Option<u32>, now_ns: u64, typical_ns: u64) -> Asleep {
        if typical_ns == 0 || typical_ns > SOON_NS {
            return Asleep(None);
        }
        Asleep(cpu.map(|c| {
            let i = c as usize % SLOTS;
            let d = &DUE[i];
            let due = now_ns.saturating_add(2 * typical_ns);
            d.until_ns.fetch_max(due, Ordering::Relaxed);
            d.count.fetch_add(1, Ordering::Relaxed);
            i
        }))
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            DUE[i].count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
