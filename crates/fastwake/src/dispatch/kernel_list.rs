//! Sources whose readiness only the kernel knows (sockets), served from
//! the kernel's own ready list: one epoll set per dispatcher, so a pass
//! makes one `epoll_wait(0)` for all of them instead of one `poll` per
//! source (see [`crate::source::Peek::kernel_ready_fd`]).
//!
//! # Level-triggered
//!
//! The registrations are level-triggered (`EPOLLIN | EPOLLRDHUP`, with
//! `EPOLLHUP`/`EPOLLERR` implied): every `epoll_wait` reports each socket
//! that holds data (or its end) *now*, exactly what the peek's zero-timeout
//! `poll` answers, so this is the same readiness test made for all sockets
//! at once. Edge-triggered would report an arrival once, whether or not
//! the owner was waiting then, and the dispatcher cannot see the owner's
//! reads to know when the socket is drained again: a socket whose owner
//! starts to wait on data that arrived earlier would never be reported
//! (a lost hand-off), or every reported socket would have to be re-peeked
//! until its owner drained it (the syscalls this avoids). The price of
//! level-triggered: a socket holding data while its owner is busy comes
//! back in every `epoll_wait` (one slot of the event buffer, skipped by the
//! interest filter), so a pass costs O(ready sockets), not O(ready and
//! waited for); idle sockets cost nothing.
//!
//! # Registrations that outlive their entry
//!
//! epoll keys a registration by the open file description *and* the fd
//! number it was added with, and `EPOLL_CTL_DEL` finds it only through a
//! number that still refers to that file. A socket's peek handle points
//! its number at an empty epoll instance when the source is dropped (see
//! `source::socket`), so removing such an entry cannot delete its
//! registration: it goes away by itself when the socket's file is closed,
//! but lingers, still reporting, while anyone else holds the file open (a
//! dup, a fork). So every registration carries its entry's index *and* a
//! generation, fresh per insert: an event whose generation is not the
//! entry's current one is stale, is never visited (it cannot hand off a
//! removed or reused entry), is counted, and makes the watch rebuild its
//! set from the entries it holds (the lingering registration is not
//! carried over), so a dead registration reports at most once.

use crate::source::Peek;
use rustix::event::epoll;
use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Most events one pass takes from the kernel: more ready sockets than
/// this are served over the following passes (a level-triggered event
/// that was returned goes to the back of the kernel's list, so none
/// starves).
const MAX_EVENTS: usize = 1024;

/// Counters of a dispatcher's kernel ready list
/// ([`crate::source::Peek::kernel_ready_fd`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KernelListStats {
    /// Sources on the list now.
    pub listed: u64,
    /// `epoll_wait` calls made for it: one per pass that had listed
    /// sources, whatever their number.
    pub waits: u64,
    /// Listed sources it reported ready while their owner waited: each is
    /// a hand-off unless the wait ended meanwhile.
    pub found: u64,
    /// Events of registrations whose entry had been removed or reused
    /// since (never handed off).
    pub stale: u64,
    /// Times the set was rebuilt to drop such registrations.
    pub rebuilds: u64,
    /// Sources that offered a kernel fd but are peeked one by one instead:
    /// the epoll instance could not be made, or it refused the fd.
    pub fallbacks: u64,
    /// Complete peeks ([`crate::source::Peek::ready`]) the dispatcher made
    /// of any source: for a socket, each is one syscall.
    pub peeks: u64,
}

enum Set {
    /// No listed source yet: no epoll instance either.
    NotYet,
    Open(OwnedFd),
    /// `epoll_create` failed: every source is peeked.
    Failed,
    /// Turned off by configuration (to measure what the list saves).
    Off,
}

pub(crate) struct KernelList {
    set: RefCell<Set>,
    /// Per entry: the generation of its registration; 0: not listed.
    gens: Vec<u32>,
    next_gen: u32,
    /// Listed entries, one bit each.
    listed: Vec<u64>,
    count: usize,
    events: RefCell<Vec<epoll::Event>>,
    /// Entries the last `epoll_wait` reported, one bit each, and as a list
    /// (to clear the bits before the next).
    seen: Vec<Cell<u64>>,
    seen_list: RefCell<Vec<usize>>,
    /// A stale event was seen: rebuild the set.
    rebuild: Cell<bool>,
    stats: Cell<KernelListStats>,
}

impl KernelList {
    pub(crate) fn new(capacity: usize) -> KernelList {
        let words = capacity.div_ceil(64);
        KernelList {
            set: RefCell::new(Set::NotYet),
            gens: vec![0; capacity],
            next_gen: 0,
            listed: vec![0; words],
            count: 0,
            events: RefCell::new(Vec::new()),
            seen: (0..words).map(|_| Cell::new(0)).collect(),
            seen_list: RefCell::new(Vec::new()),
            rebuild: Cell::new(false),
            stats: Cell::new(KernelListStats::default()),
        }
    }

    /// Stop listing sources (those inserted later are peeked one by one).
    /// For measurements; call before the first insert.
    pub(crate) fn turn_off(&mut self) {
        *self.set.get_mut() = Set::Off;
    }

    fn bump(&self, f: impl FnOnce(&mut KernelListStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    pub(crate) fn stats(&self) -> KernelListStats {
        KernelListStats {
            listed: self.count as u64,
            ..self.stats.get()
        }
    }

    /// Count one complete peek of a handle.
    #[inline]
    pub(crate) fn count_peek(&self) {
        self.bump(|s| s.peeks += 1);
    }

    #[inline]
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    #[inline]
    pub(crate) fn listed(&self, i: usize) -> bool {
        self.listed[i / 64] & (1 << (i % 64)) != 0
    }

    /// The listed entries of word `w`.
    #[inline]
    pub(crate) fn listed_word(&self, w: usize) -> u64 {
        self.listed[w]
    }

    /// Did the last `epoll_wait` report listed entry `i` ready?
    #[inline]
    pub(crate) fn seen(&self, i: usize) -> bool {
        self.seen[i / 64].get() & (1 << (i % 64)) != 0
    }

    /// Put entry `i` (empty) on the list if its handle offers a kernel fd
    /// and has no counters (those are cheaper to read than any syscall).
    /// True when listed: then the watch neither peeks nor summarises it.
    pub(crate) fn add(&mut self, i: usize, peek: &dyn Peek) -> bool {
        if peek.counters().is_some() {
            return false;
        }
        let Some(fd) = peek.kernel_ready_fd() else {
            return false;
        };
        let set = self.set.get_mut();
        if let Set::NotYet = set {
            *set = match epoll::create(epoll::CreateFlags::CLOEXEC) {
                Ok(ep) => Set::Open(ep),
                Err(_) => Set::Failed,
            };
        }
        let ep = match &*set {
            Set::Open(ep) => ep,
            Set::Failed => {
                self.bump(|s| s.fallbacks += 1);
                return false;
            }
            Set::Off | Set::NotYet => return false,
        };
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let gen_ = self.next_gen;
        if register(ep.as_fd(), fd, i, gen_).is_err() {
            // EEXIST (the same socket under this number on another entry),
            // ENOMEM, or a file epoll cannot watch: peek it instead.
            self.bump(|s| s.fallbacks += 1);
            return false;
        }
        self.gens[i] = gen_;
        self.listed[i / 64] |= 1 << (i % 64);
        self.count += 1;
        let events = self.events.get_mut();
        let want = self.count.min(MAX_EVENTS);
        if events.capacity() < want {
            events.reserve(want - events.len());
        }
        true
    }

    /// Take entry `i` (holding `peek`) off the list, if it is on it.
    pub(crate) fn remove(&mut self, i: usize, peek: &dyn Peek) {
        if self.gens[i] == 0 {
            return;
        }
        self.gens[i] = 0;
        self.listed[i / 64] &= !(1 << (i % 64));
        self.seen[i / 64].set(self.seen[i / 64].get() & !(1 << (i % 64)));
        self.count -= 1;
        if let (Set::Open(ep), Some(fd)) = (&*self.set.get_mut(), peek.kernel_ready_fd()) {
            // Fails when the number no longer refers to the registered
            // file (module docs): then the registration goes with the
            // file, or lingers and is caught by its generation.
            let _ = epoll::delete(ep, fd);
        }
    }

    /// One `epoll_wait(0)`: mark what the kernel reports ready, and visit
    /// each such entry for which `wanted(i)` (its owner waits).
    #[inline]
    pub(crate) fn harvest(&self, wanted: impl Fn(usize) -> bool, mut visit: impl FnMut(usize)) {
        if self.count == 0 {
            return;
        }
        for i in self.seen_list.borrow_mut().drain(..) {
            self.seen[i / 64].set(0);
        }
        let set = self.set.borrow();
        let Set::Open(ep) = &*set else { return };
        let mut events = self.events.borrow_mut();
        events.clear();
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // EINTR (a signal) leaves the events for the next pass; nothing
        // else can fail on a valid epoll fd with a valid buffer.
        let _ = epoll::wait(
            ep,
            rustix::buffer::spare_capacity(&mut *events),
            Some(&zero),
        );
        let mut found = 0;
        let mut stale = 0;
        let mut seen_list = self.seen_list.borrow_mut();
        for e in events.iter() {
            let d = e.data.u64();
            let (i, gen_) = ((d & u64::from(u32::MAX)) as usize, (d >> 32) as u32);
            if self.gens.get(i) != Some(&gen_) {
                stale += 1;
                continue;
            }
            let w = &self.seen[i / 64];
            w.set(w.get() | 1 << (i % 64));
            seen_list.push(i);
            if wanted(i) {
                found += 1;
                visit(i);
            }
        }
        self.bump(|s| {
            s.waits += 1;
            s.found += found;
            s.stale += stale;
        });
        if stale > 0 {
            self.rebuild.set(true);
        }
    }

    /// A stale event was seen: make a new set holding only the current
    /// entries' registrations (`fd_of(i)`: entry `i`'s kernel fd).
    pub(crate) fn rebuild_if_stale<'a>(&self, fd_of: impl Fn(usize) -> Option<BorrowedFd<'a>>) {
        if !self.rebuild.replace(false) {
            return;
        }
        let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC) else {
            // Keep the old set: stale events stay harmless (never visited),
            // and the next one tries again.
            return;
        };
        for (i, &g) in self.gens.iter().enumerate() {
            if g == 0 {
                continue;
            }
            // Each was accepted once; if one is not now (ENOMEM), the new
            // set would miss it: keep the old one, stale events and all.
            let Some(fd) = fd_of(i) else { return };
            if register(ep.as_fd(), fd, i, g).is_err() {
                return;
            }
        }
        self.bump(|s| s.rebuilds += 1);
        *self.set.borrow_mut() = Set::Open(ep);
    }
}

/// Add `fd` to `ep`, level-triggered, tagged with entry `i` and `gen_`.
fn register(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, i: usize, gen_: u32) -> rustix::io::Result<()> {
    epoll::add(
        ep,
        fd,
        epoll::EventData::new_u64((u64::from(gen_) << 32) | i as u64),
        epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
    )
}
