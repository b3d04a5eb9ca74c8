//! Loom models of the dispatch hand-off slot (`fastwake::dispatch::slot`).
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test
//! --release -p fastwake --test dispatch_loom`. Without `--cfg loom` this
//! file compiles to nothing.
//!
//! The source is modelled as a produced counter (the channel's head) and a
//! consumed counter (its tail); the dispatcher's peek is `head > tail`, the
//! same comparison the channel's peek handle makes. A lost hand-off shows
//! up as a loom deadlock (the futex is modelled by a condvar).
#![cfg(loom)]

use fastwake::dispatch::slot::{DEAD, HANDED, RUNNING, Slot, WAITING, WaitSet};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

struct Src {
    head: AtomicU64,
    tail: AtomicU64,
}

impl Src {
    fn new() -> Arc<Src> {
        Arc::new(Src {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
        })
    }

    fn ready(&self) -> bool {
        let t = self.tail.load(Ordering::SeqCst);
        self.head.load(Ordering::SeqCst) > t
    }
}

/// The owner's side of one dispatch-mode wait, as `dispatch::waiter` does
/// it. Returns false when the dispatcher was found dead (interrupt mode).
fn wait_one(slot: &Slot, set: &WaitSet, src: &Src) -> bool {
    loop {
        let (h, t) = (
            src.head.load(Ordering::SeqCst),
            src.tail.load(Ordering::SeqCst),
        );
        if h > t {
            src.tail.store(t + 1, Ordering::SeqCst);
            return true;
        }
        if !slot.announce(set, 0) {
            return false;
        }
        fence(Ordering::SeqCst);
        let st = if src.ready() {
            slot.cancel()
        } else {
            let mut s;
            loop {
                s = slot.sleep(None);
                if s != WAITING {
                    break;
                }
            }
            s
        };
        if st == RUNNING {
            continue;
        }
        if slot.reclaim() == DEAD {
            return false;
        }
    }
}

/// The dispatcher's pass over one slot, as `dispatch::threads` does it.
fn pass(slot: &Slot, set: &WaitSet, src: &Src) {
    if set.word(0) & 1 == 0 {
        return;
    }
    if slot.state() != WAITING {
        set.unmark(0, slot);
    } else if src.ready() {
        slot.hand(HANDED);
    }
}

/// Two completions, two waits: covers hand-off, cancel-after-recheck, and
/// the bit being cleared while the owner re-announces.
#[test]
fn handoff_is_never_lost() {
    // The dispatcher's polling loop makes the full state space huge; three
    // preemptions cover every interleaving of the races named above.
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let slot = Arc::new(Slot::default());
        let set = Arc::new(WaitSet::new(64));
        let src = Src::new();
        let done = Arc::new(AtomicBool::new(false));

        let d = {
            let (slot, set, src, done) = (slot.clone(), set.clone(), src.clone(), done.clone());
            loom::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    pass(&slot, &set, &src);
                    loom::thread::yield_now();
                }
            })
        };
        let p = {
            let src = src.clone();
            loom::thread::spawn(move || {
                for i in 1..=2 {
                    src.head.store(i, Ordering::SeqCst);
                }
            })
        };
        for _ in 0..2 {
            assert!(wait_one(&slot, &set, &src));
        }
        done.store(true, Ordering::SeqCst);
        p.join().unwrap();
        d.join().unwrap();
        assert_eq!(src.tail.load(Ordering::SeqCst), 2);
    });
}

/// A dispatcher dying while the owner announces: the owner never sleeps
/// forever; it either gets its completion handed or learns of the death.
#[test]
fn dying_dispatcher_releases_waiter() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        let set = Arc::new(WaitSet::new(64));
        let src = Src::new();
        let d = {
            let slot = slot.clone();
            loom::thread::spawn(move || slot.kill())
        };
        let got = wait_one(&slot, &set, &src);
        d.join().unwrap();
        // No producer: the only way out is the death notice.
        assert!(!got);
        assert_eq!(slot.state(), DEAD);
    });
}

/// The relay: a second waker (another waiting thread of the core, see
/// `dispatch::waiter`) runs the same peek-and-hand step as the dispatcher,
/// without the bitmap clean-up. Racing the dispatcher, exactly one of them
/// hands off: the owner gets its completion once and is rung once.
#[test]
fn relay_and_dispatcher_hand_off_once() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let slot = Arc::new(Slot::default());
        let set = Arc::new(WaitSet::new(64));
        let src = Src::new();
        let done = Arc::new(AtomicBool::new(false));
        let handed = Arc::new(AtomicU64::new(0));
        let waker = |relay: bool| {
            let (slot, set, src, done, handed) = (
                slot.clone(),
                set.clone(),
                src.clone(),
                done.clone(),
                handed.clone(),
            );
            loom::thread::spawn(move || {
                // The relayer makes two passes at any point of the run (a
                // waiter relays only briefly); the dispatcher polls until
                // the end, as the real one does, so nothing is left
                // sleeping. Two unbounded spinners exceed loom's budget.
                let mut passes = 0;
                while !done.load(Ordering::SeqCst) && !(relay && passes == 2) {
                    passes += 1;
                    if relay {
                        // dispatch::threads::Core::relay_pass
                        if set.word(0) & 1 != 0
                            && slot.state() == WAITING
                            && src.ready()
                            && slot.hand(HANDED)
                        {
                            handed.fetch_add(1, Ordering::SeqCst);
                        }
                    } else if set.word(0) & 1 != 0 {
                        if slot.state() != WAITING {
                            set.unmark(0, &slot);
                        } else if src.ready() && slot.hand(HANDED) {
                            handed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    loom::thread::yield_now();
                }
            })
        };
        let d = waker(false);
        let r = waker(true);
        let p = {
            let src = src.clone();
            loom::thread::spawn(move || src.head.store(1, Ordering::SeqCst))
        };
        assert!(wait_one(&slot, &set, &src));
        done.store(true, Ordering::SeqCst);
        p.join().unwrap();
        d.join().unwrap();
        r.join().unwrap();
        assert_eq!(src.tail.load(Ordering::SeqCst), 1);
        // At most one hand-off for one completion (zero when the owner's
        // own re-check found it first).
        assert!(handed.load(Ordering::SeqCst) <= 1);
    });
}

/// A wait withdrawn by a signal (`Waiter::set_interruptible`: cancel after
/// the owner announced and slept) racing the dispatcher's hand-off of a
/// completion that just arrived: exactly one of the two CASes wins; if the
/// hand-off won, the owner reclaims the slot before it returns EINTR-or-
/// completion; either way the slot ends RUNNING and the retried wait
/// takes the completion (it lives in the source, not in the hand-off).
#[test]
fn withdrawal_racing_a_hand_off_settles_once() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        let set = Arc::new(WaitSet::new(64));
        let src = Src::new();
        let d = {
            let (slot, set, src) = (slot.clone(), set.clone(), src.clone());
            loom::thread::spawn(move || {
                src.head.store(1, Ordering::SeqCst);
                pass(&slot, &set, &src);
            })
        };
        assert!(slot.announce(&set, 0));
        // The signal: withdraw, as the interruptible wait does.
        match slot.cancel() {
            RUNNING => {}
            s => {
                assert_eq!(s, HANDED, "only a hand-off can beat the withdrawal");
                assert_eq!(slot.reclaim(), HANDED);
            }
        }
        d.join().unwrap();
        assert_eq!(slot.state(), RUNNING);
        // The program retries: the completion is taken, once.
        assert!(wait_one(&slot, &set, &src));
        assert_eq!(src.tail.load(Ordering::SeqCst), 1);
    });
}
