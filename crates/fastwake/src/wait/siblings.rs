//! Which CPUs have threads of this process waiting on them.
//!
//! Why: a thread spinning for its own next completion holds its CPU; when
//! another thread of the process that waits on the same CPU gets its
//! completion, it cannot run until the spin ends. With 16 connections'
//! threads on one core, hybrid waits measured 1.9× interrupt mode's p50
//! and adaptive waits a p99 of 265 µs against 12 (`fastwake bench share
//! --mode interrupt,hybrid,adaptive`, docs/dispatch.md). So `hybrid` and
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

use std::sync::atomic::{AtomicU32, Ordering};

const SLOTS: usize = 256;

#[repr(align(64))]
struct Count(AtomicU32);

static WAITING: [Count; SLOTS] = [const { Count(AtomicU32::new(0)) }; SLOTS];

/// Is some thread of this process blocked in a wait on `cpu`?
#[inline]
pub(crate) fn others_asleep(cpu: Option<u32>) -> bool {
    cpu.is_some_and(|c| WAITING[c as usize % SLOTS].0.load(Ordering::Relaxed) > 0)
}

/// The calling thread counted as blocked on a CPU until dropped (made by
/// [`Governor::blocking`](super::Governor::blocking)).
pub struct Asleep(Option<usize>);

impl Asleep {
    pub(crate) fn enter(cpu: Option<u32>) -> Asleep {
        Asleep(cpu.map(|c| {
            let i = c as usize % SLOTS;
            WAITING[i].0.fetch_add(1, Ordering::Relaxed);
            i
        }))
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            WAITING[i].0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
