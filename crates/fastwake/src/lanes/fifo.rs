//! Turns on a lane's sending side, taken first come, first served.
//!
//! A lane is a queue: a message waits behind those sent before it, not
//! behind every one a faster thread sends after it. A plain mutex lets the
//! thread that just unlocked take it again before the woken waiter runs,
//! so a writer streaming 1 MiB messages kept a shared connection to itself
//! for hundreds of milliseconds while readers waited. Here the leaving
//! thread hands the turn to the oldest waiter.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::thread::{Thread, ThreadId};

#[derive(Default)]
struct State {
    /// The thread whose turn it is.
    owner: Option<ThreadId>,
    /// Threads waiting for a turn, oldest first.
    queue: VecDeque<Thread>,
}

/// First come, first served turns (see the module docs).
#[derive(Default)]
pub(super) struct Fifo {
    state: Mutex<State>,
}

/// A turn; the next waiter's when dropped.
pub(super) struct Turn<'a> {
    fifo: &'a Fifo,
}

impl Fifo {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the state is one step: a panic leaves it whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for this thread's turn.
    pub(super) fn enter(&self) -> Turn<'_> {
        let me = std::thread::current();
        let mut s = self.lock();
        if s.owner.is_none() {
            s.owner = Some(me.id());
            return Turn { fifo: self };
        }
        s.queue.push_back(me.clone());
        drop(s);
        loop {
            std::thread::park();
            if self.lock().owner == Some(me.id()) {
                return Turn { fifo: self };
            }
        }
    }

    /// A turn now, if no one has it or waits for it.
    pub(super) fn try_enter(&self) -> Option<Turn<'_>> {
        let mut s = self.lock();
        if s.owner.is_some() {
            return None;
        }
        s.owner = Some(std::thread::current().id());
        Some(Turn { fifo: self })
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = self.fifo.lock();
        match s.queue.pop_front() {
            Some(next) => {
                s.owner = Some(next.id());
                next.unpark();
            }
            None => s.owner = None,
        }
    }
}
