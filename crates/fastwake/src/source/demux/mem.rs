//! An in-memory shared queue: what a NIC's shared CQ is to the
//! demultiplexer, on hosts without RDMA (tests, `fastwake bench`). Any
//! thread pushes `(key, completion)` pairs; the event path behaves as a
//! CQ's: arming is one-shot, and the next push after it makes an eventfd
//! readable.

use super::SharedQueue;
use crate::sync::{AtomicU32, Mutex, Ordering};
use crate::{Fail, Result};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Completions one poll moves at most (a CQ poll's batch).
const BATCH: usize = 16;

/// See the module docs of `source::demux`.
pub struct MemQueue<T> {
    items: Mutex<VecDeque<(u64, T)>>,
    armed: AtomicU32,
    events: OwnedFd,
}

impl<T> MemQueue<T> {
    /// An empty queue.
    pub fn new() -> Result<MemQueue<T>> {
        let events = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| Fail::os("eventfd (memory queue)", e))?;
        Ok(MemQueue {
            items: Mutex::new(VecDeque::new()),
            armed: AtomicU32::new(0),
            events,
        })
    }

    /// Add a completion for `key`, and raise an event if the queue was
    /// armed (which disarms it).
    pub fn push(&self, key: u64, item: T) {
        super::lock(&self.items).push_back((key, item));
        if self.armed.load(Ordering::SeqCst) != 0 && self.armed.swap(0, Ordering::SeqCst) != 0 {
            let _ = rustix::io::write(&self.events, &1u64.to_ne_bytes());
        }
    }

    /// Completions in the queue, not yet polled.
    pub fn len(&self) -> usize {
        super::lock(&self.items).len()
    }

    /// Nothing waits to be polled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Send + 'static> SharedQueue for MemQueue<T> {
    type Item = (u64, T);

    fn poll(&self, out: &mut Vec<(u64, T)>) -> Result<()> {
        let mut q = super::lock(&self.items);
        let n = q.len().min(BATCH);
        out.extend(q.drain(..n));
        Ok(())
    }

    fn key(&self, item: &(u64, T)) -> u64 {
        item.0
    }

    fn arm(&self) -> Result<()> {
        // SeqCst, as the push's check: an arm and a push that miss each
        // other's store would lose the event. (The caller polls after
        // arming, so a push before the arm is seen by that poll.)
        self.armed.store(1, Ordering::SeqCst);
        Ok(())
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.events.as_fd())
    }

    fn take_event(&self) -> Result<()> {
        // Non-blocking: EAGAIN when another sleeper took it.
        let _ = rustix::io::read(&self.events, &mut [0u8; 8]);
        Ok(())
    }
}
