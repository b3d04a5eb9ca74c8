//! Turns on a lane's sending side: bulk in arrival order, small messages
//! free to barge.
//!
//! A lane is a queue: a bulk message waits behind those sent before it,
//! not behind every one a faster thread sends after it. A plain mutex lets
//! the thread that just unlocked take it again before the woken waiter
//! runs, so a writer streaming 1 MiB messages kept a shared connection to
//! itself for hundreds of milliseconds while readers waited. So a turn
//! that a bulk sender waits for is handed to the oldest waiter, and no one
//! takes a turn past a waiting bulk sender.
//!
//! Strict hand-off has its own cost where many small senders share a CPU:
//! a thread is often preempted just after its `sendmsg` (over loopback the
//! send wakes the receiving thread, which takes the CPU at the syscall's
//! return), still holding its turn. Every sender that comes meanwhile
//! queues, and each turn then goes to a parked thread that needs a context
//! switch to take it: a convoy, one switch per message more. With 16
//! readers and their serving thread on one CPU a quarter of the latency
//! lane's sends parked that way. So a *small* message (a latency-class
//! one) takes a free turn even when small senders wait: the leaving thread
//! frees the turn and wakes the oldest, who takes it if it is still free
//! when it runs. The oldest is handed the turn (and no one may barge) once
//! it has waited [`Turns::STARVE_NS`], which bounds how long barging can
//! hold a waiter back.
//!
//! Better still, a small sender that finds the turn held need not wait
//! for it at all: where the lane batches, it leaves its framed message
//! with the holder ([`Turns::enter_or_hand`]), who sends it with its own
//! before leaving the turn ([`Turn::try_leave`]), in the same `sendmsg`
//! when both fit. No park, no wake-up, no context switch, and the holder
//! was going to make a `sendmsg` anyway (flat combining). Only while no
//! bulk sender waits, and only as much as one batch holds.

use crate::cpu::monotonic_ns;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, Thread, ThreadId, current_thread, park};
use std::collections::VecDeque;

/// Who may take a free turn while others wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TurnKind {
    /// A small message: takes a free turn unless a bulk sender waits or
    /// the oldest waiter has waited its bound.
    Barging,
    /// A bulk message (or a flush): takes its turn in arrival order.
    InOrder,
}

struct Waiting {
    thread: Thread,
    kind: TurnKind,
    since_ns: u64,
}

#[derive(Default)]
struct State {
    /// The thread whose turn it is, and what it sends: messages are left
    /// only with a small sender, whose `sendmsg` comes soon (a bulk one's
    /// may wait for room for long).
    owner: Option<(ThreadId, TurnKind)>,
    /// Threads waiting for a turn, oldest first.
    queue: VecDeque<Waiting>,
    /// Framed messages left for the holder to send, oldest first, and
    /// their bytes.
    inbox: Vec<Vec<u8>>,
    inbox_bytes: usize,
}

/// What [`Turns::enter_or_hand`] did.
pub(super) enum Entry<'a> {
    /// This thread's turn.
    Turn(Turn<'a>),
    /// The turn was held: the message was left for its holder to send.
    Handed,
}

/// Turns (see the module docs).
pub(super) struct Turns {
    state: Mutex<State>,
    starve_ns: u64,
    /// Turns a thread parked for.
    waits: AtomicU64,
    /// Messages left for a holder.
    handed: AtomicU64,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns::with_bound(Turns::STARVE_NS)
    }
}

/// A turn; freed (or handed on) by [`Turn::try_leave`] or when dropped.
/// Messages left with it that its holder did not take stay in the inbox
/// for the next holder.
pub(super) struct Turn<'a> {
    turns: &'a Turns,
    left: bool,
}

impl State {
    /// A bulk sender (or a flush) waits for a turn.
    fn bulk_waits(&self) -> bool {
        self.queue.iter().any(|w| w.kind == TurnKind::InOrder)
    }

    /// Take the inbox (its messages, oldest first).
    fn take_inbox(&mut self) -> Vec<Vec<u8>> {
        self.inbox_bytes = 0;
        std::mem::take(&mut self.inbox)
    }

    /// The oldest waiter is owed the turn: it waits for bulk, or has
    /// waited `starve_ns`.
    fn owed(&self, now: u64, starve_ns: u64) -> bool {
        self.queue.front().is_some_and(|w| {
            w.kind == TurnKind::InOrder || now.saturating_sub(w.since_ns) >= starve_ns
        })
    }

    /// A free turn may go to a `kind` sender that is not the oldest
    /// waiter.
    fn may_barge(&self, kind: TurnKind, now: u64, starve_ns: u64) -> bool {
        kind == TurnKind::Barging && !self.bulk_waits() && !self.owed(now, starve_ns)
    }

    fn remove(&mut self, me: ThreadId) {
        if let Some(p) = self.queue.iter().position(|w| w.thread.id() == me) {
            self.queue.remove(p);
        }
    }
}

impl Turns {
    /// How long a small sender may be passed by barging ones before the
    /// turn is handed to it: a few of the latency lane's messages' worth
    /// of CPU on a busy core, far below a scheduler slice.
    pub(super) const STARVE_NS: u64 = 200_000;

    /// Turns whose oldest waiter is handed the turn after `starve_ns`.
    pub(super) fn with_bound(starve_ns: u64) -> Turns {
        Turns {
            state: Mutex::new(State::default()),
            starve_ns,
            waits: AtomicU64::new(0),
            handed: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the state is one step: a panic leaves it whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for this thread's turn.
    pub(super) fn enter(&self, kind: TurnKind) -> Turn<'_> {
        let s = self.lock();
        self.enter_locked(s, kind)
    }

    /// Take a free turn as [`Turns::enter`] does; but a small sender that
    /// finds the turn held while no bulk sender waits leaves its message
    /// (`framed()`, `len` bytes) with the holder instead of waiting, when
    /// `fits(messages, bytes)` holds for the inbox with it.
    pub(super) fn enter_or_hand(
        &self,
        kind: TurnKind,
        len: usize,
        fits: impl Fn(usize, usize) -> bool,
        framed: impl FnOnce() -> Vec<u8>,
    ) -> Entry<'_> {
        let mut s = self.lock();
        if kind == TurnKind::Barging
            && s.owner.is_some_and(|(_, k)| k == TurnKind::Barging)
            && !s.bulk_waits()
            && fits(s.inbox.len() + 1, s.inbox_bytes + len)
        {
            s.inbox.push(framed());
            s.inbox_bytes += len;
            drop(s);
            self.handed.fetch_add(1, Ordering::Relaxed);
            return Entry::Handed;
        }
        Entry::Turn(self.enter_locked(s, kind))
    }

    fn enter_locked<'a>(&'a self, mut s: MutexGuard<'a, State>, kind: TurnKind) -> Turn<'a> {
        let me = current_thread();
        let my_id = me.id();
        if s.owner.is_none()
            && (s.queue.is_empty() || s.may_barge(kind, monotonic_ns(), self.starve_ns))
        {
            return self.grant(&mut s, my_id, kind);
        }
        s.queue.push_back(Waiting {
            thread: me,
            kind,
            since_ns: monotonic_ns(),
        });
        drop(s);
        self.waits.fetch_add(1, Ordering::Relaxed);
        loop {
            park();
            let mut s = self.lock();
            if s.owner.is_some_and(|(id, _)| id == my_id) {
                // Handed to us: the leaver took us off the queue.
                return Turn {
                    turns: self,
                    left: false,
                };
            }
            if s.owner.is_none() {
                let first = s.queue.front().is_some_and(|w| w.thread.id() == my_id);
                if first || s.may_barge(kind, monotonic_ns(), self.starve_ns) {
                    s.remove(my_id);
                    return self.grant(&mut s, my_id, kind);
                }
            }
            // Passed by a barging sender (or woken for nothing): the
            // leaver of that turn wakes the oldest again.
        }
    }

    /// Turns a thread had to park for, since the start.
    pub(super) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Messages left with a holder, since the start.
    pub(super) fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// A turn now, if no one has it or waits for it.
    pub(super) fn try_enter(&self) -> Option<Turn<'_>> {
        let mut s = self.lock();
        if s.owner.is_some() || !s.queue.is_empty() {
            return None;
        }
        // A receiver's push of queued bytes (`Tx::tick`): short, and it
        // never waits for room, so a small sender may leave its message.
        Some(self.grant(&mut s, current_thread().id(), TurnKind::Barging))
    }

    /// The turn is `me`'s now, sending `kind`.
    fn grant(&self, s: &mut State, me: ThreadId, kind: TurnKind) -> Turn<'_> {
        s.owner = Some((me, kind));
        Turn {
            turns: self,
            left: false,
        }
    }
}

impl Turn<'_> {
    /// The messages left with this turn's holder so far (oldest first),
    /// taken out of the inbox.
    pub(super) fn take_handed(&self) -> Vec<Vec<u8>> {
        self.turns.lock().take_inbox()
    }

    /// Leave the turn, unless messages were left with it meanwhile: then
    /// keep it and return them (send them, and try again). Checked and
    /// left under the lock the senders leave messages under, so none is
    /// left with a turn that is gone.
    pub(super) fn try_leave(&mut self) -> Option<Vec<Vec<u8>>> {
        let mut s = self.turns.lock();
        if !s.inbox.is_empty() {
            return Some(s.take_inbox());
        }
        self.left = true;
        self.turns.release(s);
        None
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.turns.release(self.turns.lock());
        }
    }
}

impl Turns {
    /// Free the turn held (or hand it to the oldest waiter if owed).
    fn release(&self, mut s: MutexGuard<'_, State>) {
        let wake = if s.owed(monotonic_ns(), self.starve_ns) {
            let next = s.queue.pop_front().expect("owed: a waiter");
            s.owner = Some((next.thread.id(), next.kind));
            next.thread
        } else {
            s.owner = None;
            // The oldest stays queued and takes the turn if it is still
            // free when it runs.
            match s.queue.front() {
                Some(w) => w.thread.clone(),
                None => return,
            }
        };
        // Unpark outside the lock: the woken thread may take the CPU at
        // once, and must not find the lock held. (Should the oldest have
        // taken a turn meanwhile, the unpark is a spurious wake-up, which
        // its loop absorbs.)
        drop(s);
        wake.unpark();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Entry, TurnKind, Turns};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Queue `names` one after another behind a held turn, each entering
    /// as `kind`, then release the turn and let the holder come back at
    /// once as `again`; returns the order the turns were taken in.
    fn order_behind_a_held_turn(
        turns: Turns,
        names: &[(char, TurnKind)],
        again: TurnKind,
    ) -> Vec<char> {
        let turns = Arc::new(turns);
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = turns.enter(TurnKind::InOrder);
        let mut threads = Vec::new();
        for &(name, kind) in names {
            let (turns, order) = (turns.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let _turn = turns.enter(kind);
                order.lock().unwrap().push(name);
            }));
            // Long enough for the thread to queue.
            std::thread::sleep(Duration::from_millis(30));
        }
        drop(first);
        {
            let _again = turns.enter(again);
            order.lock().unwrap().push('m');
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            turns.try_enter().is_some(),
            "a free turns gives a turn at once"
        );
        order.lock().unwrap().clone()
    }

    /// Bulk senders get their turns in the order they asked, and the
    /// thread that leaves cannot take the next turn back before them (a
    /// plain mutex would let it), whatever it sends.
    #[test]
    fn bulk_turns_go_in_arrival_order_and_the_leaver_queues_behind() {
        let bulk = [
            ('a', TurnKind::InOrder),
            ('b', TurnKind::InOrder),
            ('c', TurnKind::InOrder),
        ];
        for again in [TurnKind::InOrder, TurnKind::Barging] {
            let got = order_behind_a_held_turn(Turns::default(), &bulk, again);
            assert_eq!(got, ['a', 'b', 'c', 'm'], "leaver came back as {again:?}");
        }
    }

    /// A small sender does not barge past a waiting bulk sender, even one
    /// queued behind small waiters.
    #[test]
    fn a_small_sender_does_not_pass_a_waiting_bulk_one() {
        // No bound: only the waiting bulk sender keeps the leaver out.
        let q = [('a', TurnKind::Barging), ('b', TurnKind::InOrder)];
        let got = order_behind_a_held_turn(Turns::with_bound(u64::MAX), &q, TurnKind::Barging);
        assert_eq!(got, ['a', 'b', 'm']);
    }

    /// Among small senders the running thread takes a free turn before
    /// the woken one runs (no convoy), unless the oldest has waited the
    /// bound: then it is handed the turn, in order.
    #[test]
    fn small_senders_barge_until_the_oldest_has_waited_the_bound() {
        let small = [('a', TurnKind::Barging), ('b', TurnKind::Barging)];
        // The leaver re-enters at once and the woken waiter needs a
        // wake-up first, so the leaver wins unless it is preempted in
        // between: three tries (strict hand-off never lets it).
        let orders: Vec<_> = (0..3)
            .map(|_| {
                order_behind_a_held_turn(Turns::with_bound(u64::MAX), &small, TurnKind::Barging)
            })
            .collect();
        assert!(
            orders.iter().any(|o| o[0] == 'm'),
            "the running leaver never barged: {orders:?}"
        );
        // Every waiter queued 30 ms or more ago: past a 1 ms bound.
        let bounded =
            order_behind_a_held_turn(Turns::with_bound(1_000_000), &small, TurnKind::Barging);
        assert_eq!(bounded, ['a', 'b', 'm']);
    }

    /// A small sender that finds a small sender's turn held leaves its
    /// message with it instead of waiting; the holder cannot leave before
    /// taking it. A bulk holder is not handed anything, nor is a holder
    /// while a bulk sender waits.
    #[test]
    fn a_small_sender_leaves_its_message_with_a_small_holder() {
        let turns = Arc::new(Turns::default());
        let hand = |turns: &Turns, id: u8| {
            matches!(
                turns.enter_or_hand(TurnKind::Barging, 1, |_, _| true, || vec![id]),
                Entry::Handed
            )
        };
        let Entry::Turn(mut t) = turns.enter_or_hand(TurnKind::Barging, 1, |_, _| true, || vec![0])
        else {
            panic!("a free turn was not taken");
        };
        let f2 = turns.clone();
        assert!(std::thread::spawn(move || hand(&f2, 1)).join().unwrap());
        // A full inbox: the sender waits for a turn instead.
        let f3 = turns.clone();
        let waiter = std::thread::spawn(move || {
            matches!(
                f3.enter_or_hand(TurnKind::Barging, 1, |n, _| n <= 1, || vec![2]),
                Entry::Turn(_)
            )
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(t.try_leave(), Some(vec![vec![1]]));
        assert_eq!(t.try_leave(), None);
        assert!(
            waiter.join().unwrap(),
            "the sender whose message did not fit got no turn"
        );
        assert_eq!(turns.handed(), 1);
        // A bulk holder takes no messages.
        let bulk = turns.enter(TurnKind::InOrder);
        let f4 = turns.clone();
        let small = std::thread::spawn(move || hand(&f4, 3));
        std::thread::sleep(Duration::from_millis(30));
        drop(bulk);
        assert!(
            !small.join().unwrap(),
            "a message was left with a bulk holder"
        );
    }

    /// Many threads, both kinds, random hold times: every turn is held by
    /// one thread at a time and every thread gets all its turns.
    #[test]
    fn turns_exclude_each_other_under_contention() {
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
        let turns = Arc::new(Turns::with_bound(50_000));
        let inside = Arc::new(AtomicU32::new(0));
        let taken = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let (turns, inside, taken) = (turns.clone(), inside.clone(), taken.clone());
                std::thread::spawn(move || {
                    let kind = if t % 3 == 0 {
                        TurnKind::InOrder
                    } else {
                        TurnKind::Barging
                    };
                    let mut x = t + 1;
                    for _ in 0..2_000 {
                        let _turn = turns.enter(kind);
                        assert_eq!(
                            inside.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two turns at once"
                        );
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        for _ in 0..(x % 64) {
                            std::hint::spin_loop();
                        }
                        if x % 97 == 0 {
                            std::thread::yield_now();
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Relaxed), 6 * 2_000);
        assert!(turns.try_enter().is_some());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom models of the turns, on this file's own `enter` and `Drop`:
    //! one turn at a time, and no waiter left parked for ever (a lost
    //! wake-up shows as a loom deadlock). The hand-off bound reads the
    //! clock, which loom cannot replay, so each model runs with the bound
    //! at 0 (every turn handed on in order) and at never (barging).
    use super::{Entry, TurnKind, Turns};
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU32, Ordering};

    fn model(bound: u64, kinds: [TurnKind; 3]) {
        loom::model(move || {
            let turns = Arc::new(Turns::with_bound(bound));
            let inside = Arc::new(AtomicU32::new(0));
            let threads: Vec<_> = kinds[1..]
                .iter()
                .map(|&kind| {
                    let (turns, inside) = (turns.clone(), inside.clone());
                    loom::thread::spawn(move || {
                        let _turn = turns.enter(kind);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                })
                .collect();
            for _ in 0..2 {
                let _turn = turns.enter(kinds[0]);
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                inside.fetch_sub(1, Ordering::SeqCst);
            }
            for t in threads {
                t.join().unwrap();
            }
            assert!(turns.try_enter().is_some());
        });
    }

    /// Three small senders, each of which may leave its message with the
    /// holder: every message is sent once, by its sender or by a holder
    /// before it leaves, and none is left in the inbox of a turn that is
    /// gone.
    #[test]
    fn loom_small_senders_leave_messages_with_the_holder() {
        loom::model(|| {
            let turns = Arc::new(Turns::with_bound(u64::MAX));
            let sent = Arc::new(loom::sync::Mutex::new(Vec::new()));
            let send = |turns: &Turns, sent: &loom::sync::Mutex<Vec<u8>>, id: u8| {
                if let Entry::Turn(mut t) =
                    turns.enter_or_hand(TurnKind::Barging, 1, |n, _| n <= 2, || vec![id])
                {
                    let mut out = sent.lock().unwrap();
                    out.extend(t.take_handed().concat());
                    out.push(id);
                    drop(out);
                    while let Some(left) = t.try_leave() {
                        sent.lock().unwrap().extend(left.concat());
                    }
                }
            };
            let threads: Vec<_> = [1u8, 2]
                .into_iter()
                .map(|id| {
                    let (turns, sent) = (turns.clone(), sent.clone());
                    loom::thread::spawn(move || send(&turns, &sent, id))
                })
                .collect();
            send(&turns, &sent, 0);
            for t in threads {
                t.join().unwrap();
            }
            let mut got = sent.lock().unwrap().clone();
            got.sort();
            assert_eq!(got, [0, 1, 2], "each message sent once");
            let t = turns.try_enter().expect("a free turn");
            assert!(t.take_handed().is_empty());
        });
    }

    #[test]
    fn loom_small_senders_barging() {
        model(u64::MAX, [TurnKind::Barging; 3]);
    }

    #[test]
    fn loom_small_senders_handed_in_order() {
        model(0, [TurnKind::Barging; 3]);
    }

    #[test]
    fn loom_small_and_bulk_senders() {
        model(
            u64::MAX,
            [TurnKind::Barging, TurnKind::InOrder, TurnKind::Barging],
        );
    }
}
