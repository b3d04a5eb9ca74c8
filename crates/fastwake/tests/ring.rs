//! A ring owned by the caller (`source::ring::ExternalRing`), one behaviour
//! per test: bad arguments, delivery in every wait mode, dispatch mode
//! hand-offs, a closed fd.
//!
//! Spinning modes run under `SPIN`, one test at a time, and every wait is
//! bounded.

use fastwake::dispatch::{Config, Dispatcher};
use fastwake::source::ring::{ExternalRing, RingFd};
use fastwake::{Source, WaitMode, Waiter};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static SPIN: Mutex<()> = Mutex::new(());

fn spin_lock() -> std::sync::MutexGuard<'static, ()> {
    SPIN.lock().unwrap_or_else(|e| e.into_inner())
}

const WAIT: Duration = Duration::from_secs(10);

/// A one-slot user ring: the producer writes `slot`, publishes `tail`
/// (release), then writes the eventfd, as an io_uring does with a
/// registered eventfd.
struct UserRing {
    head: AtomicU32,
    tail: AtomicU32,
    slot: AtomicU64,
    efd: OwnedFd,
}

impl UserRing {
    fn new(flags: rustix::event::EventfdFlags) -> Arc<UserRing> {
        Arc::new(UserRing {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            slot: AtomicU64::new(0),
            efd: rustix::event::eventfd(0, flags).unwrap(),
        })
    }

    fn source(&self) -> fastwake::Result<ExternalRing> {
        // SAFETY: the counters live in `self`, which the tests keep alive
        // (an Arc) for longer than the source; the eventfd too.
        unsafe {
            ExternalRing::new(
                self.head.as_ptr(),
                self.tail.as_ptr(),
                self.efd.as_raw_fd(),
                RingFd::EventFd,
            )
        }
    }

    /// Produce values 1..=n, one at a time (waits for the consumer to
    /// free the slot), sleeping a little now and then so consumers sleep.
    fn produce(self: Arc<Self>, n: u64) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for v in 1..=n {
                while self.tail.load(Ordering::Acquire) != self.head.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                if v % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                self.slot.store(v, Ordering::Relaxed);
                self.tail.fetch_add(1, Ordering::Release);
                rustix::io::write(&self.efd, &1u64.to_ne_bytes()).unwrap();
            }
        })
    }

    /// Consume n values with `w`, checking order; the owner's reap.
    fn consume(&self, w: &mut Waiter, n: u64) {
        let mut src = self.source().unwrap();
        for expect in 1..=n {
            let ready = w
                .wait_timeout(&mut src, WAIT)
                .unwrap()
                .unwrap_or_else(|| panic!("value {expect} not seen within {WAIT:?}"));
            assert_eq!(ready, 1, "a one-slot ring holds one entry");
            assert_eq!(
                self.slot.load(Ordering::Relaxed),
                expect,
                "lost or duplicated"
            );
            self.head.fetch_add(1, Ordering::Release);
        }
    }
}

/// The errno `ExternalRing::new` fails with.
fn refused(head: *const u32, tail: *const u32, fd: i32, kind: RingFd) -> i32 {
    // SAFETY: every pointer passed here is either valid for the test's
    // duration or one `new` must reject before using it.
    match unsafe { ExternalRing::new(head, tail, fd, kind) } {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

#[test]
fn bad_arguments_are_refused_with_their_errno() {
    let r = UserRing::new(rustix::event::EventfdFlags::NONBLOCK);
    let head = r.head.as_ptr().cast_const();
    let tail = r.tail.as_ptr().cast_const();
    let fd = r.efd.as_raw_fd();
    let null = std::ptr::null();
    assert_eq!(refused(null, tail, fd, RingFd::EventFd), libc::EINVAL);
    let odd = (head as usize + 1) as *const u32;
    assert_eq!(refused(odd, tail, fd, RingFd::EventFd), libc::EINVAL);
    assert_eq!(refused(head, tail, -1, RingFd::EventFd), libc::EBADF);
    let blocking = UserRing::new(rustix::event::EventfdFlags::empty());
    let bfd = blocking.efd.as_raw_fd();
    assert_eq!(
        refused(head, tail, bfd, RingFd::EventFd),
        libc::EINVAL,
        "blocking eventfd"
    );
    assert_eq!(
        refused(head, tail, 1 << 20, RingFd::Level),
        libc::EBADF,
        "closed fd"
    );
    assert_eq!(
        refused(head, tail, fd, RingFd::EventFd),
        0,
        "valid arguments"
    );
}

#[test]
fn peek_counts_entries_and_never_consumes() {
    let r = UserRing::new(rustix::event::EventfdFlags::NONBLOCK);
    let mut src = r.source().unwrap();
    assert!(!src.ready());
    assert_eq!(src.try_take().unwrap(), None);
    r.tail.store(3, Ordering::Release);
    assert!(src.ready());
    assert_eq!(src.try_take().unwrap(), Some(3));
    assert_eq!(src.try_take().unwrap(), Some(3), "taking does not consume");
    r.head.store(3, Ordering::Release);
    assert_eq!(src.try_take().unwrap(), None);
    // Counters wrap like io_uring's.
    r.head.store(u32::MAX, Ordering::Release);
    r.tail.store(1, Ordering::Release);
    assert_eq!(src.pending(), 2);
}

#[test]
fn delivers_in_every_wait_mode() {
    let _g = spin_lock();
    for mode in ["interrupt", "poll", "hybrid:20us", "adaptive"] {
        let r = UserRing::new(rustix::event::EventfdFlags::NONBLOCK);
        let n = 2_000;
        let p = r.clone().produce(n);
        let mut w = Waiter::new(mode.parse::<WaitMode>().unwrap());
        r.consume(&mut w, n);
        p.join().unwrap();
        if mode == "interrupt" {
            assert!(w.stats().sleeps > 0, "interrupt mode never slept");
        }
    }
}

#[test]
fn a_dispatcher_hands_off_ring_completions() {
    let _g = spin_lock();
    // SAFETY: sysconf has no preconditions.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } < 2 {
        eprintln!("SKIPPED a_dispatcher_hands_off_ring_completions: needs 2 CPUs");
        return;
    }
    let d = Dispatcher::start(Config::new(1)).unwrap();
    let r = UserRing::new(rustix::event::EventfdFlags::NONBLOCK);
    let n = 2_000;
    let consumer = {
        let r = r.clone();
        std::thread::spawn(move || {
            fastwake::cpu::pin(1).unwrap();
            let mut w = Waiter::new(WaitMode::Dispatch);
            r.consume(&mut w, n);
            w.stats()
        })
    };
    fastwake::cpu::pin(0).unwrap();
    r.clone().produce(n).join().unwrap();
    let st = consumer.join().unwrap();
    drop(d);
    assert!(
        st.handoffs + st.relays > 0,
        "the dispatcher never handed a ring completion off: {st:?}"
    );
}

#[test]
fn a_closed_fd_ends_the_wait_with_ebadf() {
    // Level-triggered fd: an eventfd stands in, closed under the source.
    let r = UserRing::new(rustix::event::EventfdFlags::NONBLOCK);
    let fd = rustix::io::dup(&r.efd).unwrap();
    // SAFETY: counters in `r`, alive for the test.
    let mut src = unsafe {
        ExternalRing::new(
            r.head.as_ptr(),
            r.tail.as_ptr(),
            fd.as_raw_fd(),
            RingFd::Level,
        )
    }
    .unwrap();
    drop(fd);
    let mut w = Waiter::new(WaitMode::Interrupt);
    let e = w.wait_timeout(&mut src, WAIT).unwrap_err();
    assert_eq!(e.errno(), libc::EBADF, "{e}");
}
