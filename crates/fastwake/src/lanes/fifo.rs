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

#[cfg(test)]
mod tests {
    use super::Fifo;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Threads get their turns in the order they asked, and the thread
    /// that leaves cannot take the next turn back before them (a plain
    /// mutex would let it).
    #[test]
    fn turns_go_in_arrival_order_and_the_leaver_queues_behind() {
        let fifo = Arc::new(Fifo::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = fifo.enter();
        let mut threads = Vec::new();
        for name in ['a', 'b', 'c'] {
            let (fifo, order) = (fifo.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let _turn = fifo.enter();
                order.lock().unwrap().push(name);
            }));
            // Long enough for the thread to queue.
            std::thread::sleep(Duration::from_millis(30));
        }
        drop(first);
        {
            let _again = fifo.enter();
            order.lock().unwrap().push('m');
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ['a', 'b', 'c', 'm']);
        assert!(
            fifo.try_enter().is_some(),
            "a free fifo gives a turn at once"
        );
    }
}
