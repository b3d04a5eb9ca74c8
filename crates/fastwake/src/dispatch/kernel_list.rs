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
//!
//! # Relays
//!
//! A dispatch-mode thread about to sleep relays for its core (it does the
//! dispatcher's job for the other waiters, `threads::relay`) from its own
//! thread, so it cannot touch the dispatcher's `KernelList`. What it needs
//! lives in a [`Shared`] part instead: the epoll set, each entry's
//! generation and the listed bits, which only the dispatcher's thread
//! writes. A relay makes its own `epoll_wait(0)` on the set (allowed from
//! any number of threads; level-triggered events are put back on the
//! kernel's list after each report, so a relay takes nothing from the
//! dispatcher) and hands off only an event whose generation is its entry's
//! current one. What it cannot rule out is the one window the relay's
//! per-source peek has too: the entry removed and its slot reused between
//! that check and the hand-off's compare-and-swap on `WAITING`; the woken
//! owner then finds nothing, and waits again. A relay never rebuilds (a
//! stale event it sees is left to the dispatcher, which sees it too), and
//! the set's fd number never changes: a rebuild moves the new set onto it
//! (`dup3`, atomic; an `epoll_wait` in progress on the old set holds its
//! own reference to it), so relays read it without a lock.
//!
//! One cost of sharing: while one thread's `epoll_wait` moves the kernel's
//! ready list, another thread's zero-timeout `epoll_wait` may find it
//! momentarily empty (the kernel checks it without its lock) and report
//! nothing. A level-triggered entry stays on the list, so the next call
//! reports it: a pass's worth of delay, never a loss.

use crate::source::Peek;
use rustix::event::epoll;
use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
// Not `crate::sync`: the loom models do not model epoll, and modelled
// loads of these words would multiply their interleavings for nothing.
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Most events one pass takes from the kernel: more ready sockets than
/// this are served over the following passes (a level-triggered event
/// that was returned goes to the back of the kernel's list, so none
/// starves).
const MAX_EVENTS: usize = 1024;

/// Most events one relay's `epoll_wait` takes: it hands off one wait, and
/// the events it skips (sockets holding data for busy owners) go to the
/// back of the kernel's list, so the next relay pass sees others.
const RELAY_EVENTS: usize = 32;

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
    /// `epoll_wait` calls relaying threads made on the set (threads only).
    pub relay_waits: u64,
    /// Listed sources a relay's `epoll_wait` reported ready while their
    /// owner waited (threads only).
    pub relay_found: u64,
    /// Complete peeks relaying threads made of the other waiting sources
    /// that are neither noticed nor listed (threads only): for a socket,
    /// each is one syscall.
    pub relay_peeks: u64,
}

/// The counters of several lists (dispatchers of several cores, runtimes)
/// added up.
impl std::ops::AddAssign for KernelListStats {
    fn add_assign(&mut self, o: KernelListStats) {
        // Taken apart, so that a counter added later cannot be left out.
        let KernelListStats {
            listed,
            waits,
            found,
            stale,
            rebuilds,
            fallbacks,
            peeks,
            relay_waits,
            relay_found,
            relay_peeks,
        } = o;
        self.listed += listed;
        self.waits += waits;
        self.found += found;
        self.stale += stale;
        self.rebuilds += rebuilds;
        self.fallbacks += fallbacks;
        self.peeks += peeks;
        self.relay_waits += relay_waits;
        self.relay_found += relay_found;
        self.relay_peeks += relay_peeks;
    }
}

/// What a dispatcher's list shares with the threads that relay for its
/// core (module docs, "Relays"). Only the dispatcher's thread writes it,
/// except the relay counters.
pub(crate) struct Shared {
    /// The epoll set, made with the first listed source; its number never
    /// changes (a rebuild moves the new set onto it).
    set: OnceLock<OwnedFd>,
    /// Per entry: the generation of its registration; 0: not listed.
    gens: Box<[AtomicU32]>,
    /// Listed entries, one bit each.
    listed: Box<[AtomicU64]>,
    count: AtomicUsize,
    relay_waits: AtomicU64,
    relay_found: AtomicU64,
    relay_peeks: AtomicU64,
}

impl Shared {
    pub(crate) fn new(capacity: usize) -> Shared {
        Shared {
            set: OnceLock::new(),
            gens: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            listed: (0..capacity.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            count: AtomicUsize::new(0),
            relay_waits: AtomicU64::new(0),
            relay_found: AtomicU64::new(0),
            relay_peeks: AtomicU64::new(0),
        }
    }

    /// The listed entries of word `w`.
    #[inline]
    pub(crate) fn listed_word(&self, w: usize) -> u64 {
        self.listed[w].load(Ordering::Relaxed)
    }

    /// A relay's look at the list, from any thread: one `epoll_wait(0)` on
    /// the set, and the first reported entry whose registration is current
    /// and for which `want(i)` holds (its owner waits). Nothing (and no
    /// syscall) while no source is listed.
    pub(crate) fn relay_find(&self, want: impl Fn(usize) -> bool) -> Option<usize> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let ep = self.set.get()?;
        let mut events = [MaybeUninit::<epoll::Event>::uninit(); RELAY_EVENTS];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // EINTR: nothing found this time; the dispatcher still looks.
        let (got, _) = epoll::wait(ep, &mut events, Some(&zero)).ok()?;
        self.relay_waits.fetch_add(1, Ordering::Relaxed);
        let found = got.iter().find_map(|e| {
            let (i, gen_) = decode(e.data.u64());
            // A stale or not yet published registration: never handed off
            // (the dispatcher, which sees it too, rebuilds).
            (self.gens.get(i).map(|g| g.load(Ordering::Acquire)) == Some(gen_) && want(i))
                .then_some(i)
        });
        if found.is_some() {
            self.relay_found.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// `s` with the relay counters as they are now.
    pub(crate) fn with_relays(&self, s: KernelListStats) -> KernelListStats {
        KernelListStats {
            relay_waits: self.relay_waits.load(Ordering::Relaxed),
            relay_found: self.relay_found.load(Ordering::Relaxed),
            relay_peeks: self.relay_peeks.load(Ordering::Relaxed),
            ..s
        }
    }

    /// Count `n` complete peeks a relay made.
    pub(crate) fn count_relay_peeks(&self, n: u64) {
        if n > 0 {
            self.relay_peeks.fetch_add(n, Ordering::Relaxed);
        }
    }
}

enum Set {
    /// No listed source yet: no epoll instance either.
    NotYet,
    /// The epoll instance is `Shared::set`.
    Open,
    /// `epoll_create` failed: every source is peeked.
    Failed,
    /// Turned off by configuration (to measure what the list saves).
    Off,
}

pub(crate) struct KernelList {
    set: Set,
    /// The set, the generations and the listed bits (`Shared`).
    shared: Arc<Shared>,
    next_gen: u32,
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
    /// A list for `capacity` entries sharing `shared` (made for as many)
    /// with relaying threads.
    pub(crate) fn new(shared: Arc<Shared>) -> KernelList {
        let capacity = shared.gens.len();
        let words = capacity.div_ceil(64);
        KernelList {
            set: Set::NotYet,
            shared,
            next_gen: 0,
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
        self.set = Set::Off;
    }

    fn bump(&self, f: impl FnOnce(&mut KernelListStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    pub(crate) fn stats(&self) -> KernelListStats {
        self.shared.with_relays(KernelListStats {
            listed: self.count() as u64,
            ..self.stats.get()
        })
    }

    /// Count one complete peek of a handle.
    #[inline]
    pub(crate) fn count_peek(&self) {
        self.bump(|s| s.peeks += 1);
    }

    #[inline]
    pub(crate) fn count(&self) -> usize {
        // Only this thread writes it.
        self.shared.count.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn listed(&self, i: usize) -> bool {
        self.listed_word(i / 64) & (1 << (i % 64)) != 0
    }

    /// The listed entries of word `w`.
    #[inline]
    pub(crate) fn listed_word(&self, w: usize) -> u64 {
        self.shared.listed_word(w)
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
        if let Set::NotYet = self.set {
            self.set = match epoll::create(epoll::CreateFlags::CLOEXEC) {
                Ok(ep) => {
                    let _ = self.shared.set.set(ep);
                    Set::Open
                }
                Err(_) => Set::Failed,
            };
        }
        let ep = match (&self.set, self.shared.set.get()) {
            (Set::Open, Some(ep)) => ep,
            (Set::Failed, _) => {
                self.bump(|s| s.fallbacks += 1);
                return false;
            }
            _ => return false,
        };
        self.next_gen = self.next_gen.wrapping_add(1).max(1);
        let gen_ = self.next_gen;
        // Published before the registration, which is what can report it:
        // a relay that gets the event then finds the generation current.
        let g = &self.shared.gens[i];
        g.store(gen_, Ordering::Release);
        if register(ep.as_fd(), fd, i, gen_).is_err() {
            // EEXIST (the same socket under this number on another entry),
            // ENOMEM, or a file epoll cannot watch: peek it instead.
            g.store(0, Ordering::Release);
            self.bump(|s| s.fallbacks += 1);
            return false;
        }
        self.shared.listed[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
        let count = self.shared.count.fetch_add(1, Ordering::Relaxed) + 1;
        let events = self.events.get_mut();
        let want = count.min(MAX_EVENTS);
        if events.capacity() < want {
            events.reserve(want - events.len());
        }
        true
    }

    /// Take entry `i` (holding `peek`) off the list, if it is on it.
    pub(crate) fn remove(&mut self, i: usize, peek: &dyn Peek) {
        let sh = &self.shared;
        if sh.gens[i].swap(0, Ordering::Release) == 0 {
            return;
        }
        sh.listed[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Relaxed);
        self.seen[i / 64].set(self.seen[i / 64].get() & !(1 << (i % 64)));
        sh.count.fetch_sub(1, Ordering::Relaxed);
        if let (Some(ep), Some(fd)) = (sh.set.get(), peek.kernel_ready_fd()) {
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
        if self.count() == 0 {
            return;
        }
        for i in self.seen_list.borrow_mut().drain(..) {
            self.seen[i / 64].set(0);
        }
        let Some(ep) = self.shared.set.get() else {
            return;
        };
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
            let (i, gen_) = decode(e.data.u64());
            if self.shared.gens.get(i).map(|g| g.load(Ordering::Relaxed)) != Some(gen_) {
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
        let Some(old) = self.shared.set.get() else {
            return;
        };
        let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC) else {
            // Keep the old set: stale events stay harmless (never visited),
            // and the next one tries again.
            return;
        };
        for (i, g) in self.shared.gens.iter().enumerate() {
            let g = g.load(Ordering::Relaxed);
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
        // The new set takes the old one's number, so relays, which read
        // the number without a lock, never see it change (module docs).
        // SAFETY: both numbers are open and owned (`old` by the shared
        // part, for as long as it lives; `ep` here); dup3 swaps the file
        // behind `old` atomically and closes only the old set's file,
        // which an `epoll_wait` still in progress holds a reference of
        // its own to.
        if unsafe { libc::dup3(ep.as_raw_fd(), old.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            // Keep the old set, as above.
            return;
        }
        self.bump(|s| s.rebuilds += 1);
    }
}

/// An event's entry and generation (see `register`).
fn decode(d: u64) -> (usize, u32) {
    ((d & u64::from(u32::MAX)) as usize, (d >> 32) as u32)
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::source::Source;
    use crate::source::socket::{SocketOptions, SocketSource};
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn pair() -> (SocketSource, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let src = SocketSource::new(OwnedFd::from(a), 8, SocketOptions::default()).unwrap();
        (src, b)
    }

    /// What a relay on another thread finds in the shared set.
    fn relay_finds(shared: &Arc<Shared>) -> Option<usize> {
        let shared = shared.clone();
        std::thread::spawn(move || shared.relay_find(|_| true))
            .join()
            .unwrap()
    }

    /// A relay on another thread finds what the dispatcher's list holds,
    /// takes nothing from the dispatcher (level-triggered), never reports
    /// an entry whose registration is stale, and keeps using the same fd
    /// number across the dispatcher's rebuild.
    #[test]
    fn relays_share_the_set_and_skip_stale_registrations() {
        let shared = Arc::new(Shared::new(64));
        let mut list = KernelList::new(shared.clone());
        // An idle entry, so the list is never empty (an empty one is not
        // even asked).
        let (idle, _idle_peer) = pair();
        assert!(list.add(9, &**idle.peek().unwrap()));
        let (src, mut peer) = pair();
        let peek = src.peek().unwrap().clone();
        assert!(list.add(5, &*peek));
        assert_eq!(relay_finds(&shared), None, "nothing readable yet");
        peer.write_all(&[1; 8]).unwrap();
        assert_eq!(relay_finds(&shared), Some(5));
        // Level-triggered: the relay's report left it for the dispatcher.
        let mut seen = Vec::new();
        list.harvest(|_| true, |i| seen.push(i));
        assert_eq!(seen, [5]);
        assert_eq!(relay_finds(&shared), Some(5), "reported once only");
        // The source goes with its data unread while a dup keeps its file
        // open: its registration outlives the entry (module docs).
        let keep = src.socket().try_clone_to_owned().unwrap();
        drop(src);
        list.remove(5, &*peek);
        drop(peek);
        let number = shared.set.get().unwrap().as_raw_fd();
        assert_eq!(relay_finds(&shared), None, "a stale registration");
        // A new socket at the same entry, readable too.
        let (src2, mut peer2) = pair();
        let peek2 = src2.peek().unwrap().clone();
        assert!(list.add(5, &*peek2));
        peer2.write_all(&[2; 8]).unwrap();
        assert_eq!(relay_finds(&shared), Some(5), "the new registration");
        let mut seen = Vec::new();
        list.harvest(|_| true, |i| seen.push(i));
        assert_eq!(seen, [5], "the stale event is not visited");
        list.rebuild_if_stale(|i| match i {
            5 => peek2.kernel_ready_fd(),
            9 => idle.peek().unwrap().kernel_ready_fd(),
            _ => None,
        });
        let st = list.stats();
        assert_eq!((st.stale, st.rebuilds), (1, 1), "{st:?}");
        assert_eq!(
            shared.set.get().unwrap().as_raw_fd(),
            number,
            "the rebuilt set has a new number"
        );
        // The rebuilt set holds the new registration only.
        let ep = shared.set.get().unwrap();
        let mut events = [MaybeUninit::<epoll::Event>::uninit(); 4];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let (got, _) = epoll::wait(ep, &mut events, Some(&zero)).unwrap();
        assert_eq!(got.len(), 1, "the stale registration was carried over");
        assert_eq!(relay_finds(&shared), Some(5));
        let st = shared.with_relays(KernelListStats::default());
        assert_eq!(st.relay_found, 4, "{st:?}");
        drop(keep);
        drop(src2);
    }
}
