//! The socket and io_uring sources: every wait mode delivers every message
//! exactly once and in order under randomized timing; timeouts, closed
//! peers and the busy-poll report behave as documented.

use fastwake::source::socket::{BusyPoll, SocketOptions, SocketSource};
use fastwake::source::uring::{UringSource, UringWake};
use fastwake::{Source, WaitMode, Waiter};
use rand::Rng;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Poll and hybrid waits spin: one test at a time in this binary.
static SPIN: Mutex<()> = Mutex::new(());

const MSG: usize = 16;
const N: u64 = 10_000;
const MODES: [WaitMode; 3] = [
    WaitMode::Poll,
    WaitMode::Interrupt,
    WaitMode::Hybrid {
        budget: Duration::from_micros(20),
    },
];

fn msg(seq: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[8..].copy_from_slice(&(!seq).to_le_bytes());
    m
}

/// Send N messages with random pauses and random write splits, so the
/// consumer sees empty sockets, bursts and torn messages.
fn producer(mut s: UnixStream) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = rand::rng();
        for seq in 0..N {
            let m = msg(seq);
            if rng.random_ratio(1, 64) {
                let cut = rng.random_range(1..MSG);
                s.write_all(&m[..cut]).unwrap();
                std::thread::sleep(Duration::from_micros(rng.random_range(0..50)));
                s.write_all(&m[cut..]).unwrap();
            } else {
                s.write_all(&m).unwrap();
            }
            match rng.random_range(0..100) {
                0..3 => std::thread::sleep(Duration::from_micros(rng.random_range(0..300))),
                3..20 => std::thread::yield_now(),
                _ => {}
            }
        }
    })
}

#[test]
fn socket_source_delivers_every_message_once_in_order_in_every_mode() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    for mode in MODES {
        let (a, b) = UnixStream::pair().unwrap();
        let mut src = SocketSource::new(OwnedFd::from(a), MSG, SocketOptions::default()).unwrap();
        let p = producer(b);
        let mut w = Waiter::new(mode);
        for seq in 0..N {
            let m = w
                .wait_timeout(&mut src, Duration::from_secs(10))
                .unwrap()
                .unwrap_or_else(|| panic!("{mode}: message {seq} never came"));
            assert_eq!(m.seq, seq, "{mode}");
            assert_eq!(src.message(), msg(seq), "{mode}: message {seq} torn");
        }
        p.join().unwrap();
        // Nothing extra, then the close is reported.
        assert!(
            w.wait_timeout(&mut src, Duration::from_secs(5))
                .unwrap_err()
                .is_closed()
        );
        if mode == WaitMode::Interrupt {
            assert!(w.stats().sleeps > 0, "interrupt mode never slept");
        }
    }
}

#[test]
fn socket_source_timeout_and_close() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut src = SocketSource::new(OwnedFd::from(a), MSG, SocketOptions::default()).unwrap();
    let mut w = Waiter::new(WaitMode::Interrupt);
    let t = Instant::now();
    assert!(
        w.wait_timeout(&mut src, Duration::from_millis(20))
            .unwrap()
            .is_none()
    );
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(!src.ready());
    assert!(src.notify_fd().is_some());
    drop(b);
    assert!(
        w.wait_timeout(&mut src, Duration::from_secs(5))
            .unwrap_err()
            .is_closed()
    );
}

#[test]
fn busy_poll_is_reported_as_ineffective_on_loopback() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let opts = SocketOptions {
        busy_poll_us: Some(50),
    };
    let mut rx = SocketSource::new(OwnedFd::from(s), MSG, opts).unwrap();
    let tx = SocketSource::new(OwnedFd::from(c), MSG, SocketOptions::default()).unwrap();
    let before = rx.busy_poll();
    tx.send(&msg(0)).unwrap();
    Waiter::new(WaitMode::Interrupt).wait(&mut rx).unwrap();
    match (before, rx.busy_poll()) {
        (BusyPoll::Refused { errno }, _) => {
            eprintln!("SKIPPED busy-poll report: SO_BUSY_POLL refused here (errno {errno})");
        }
        (BusyPoll::Unknown { us: 50 }, BusyPoll::NoNapiId { us: 50 }) => {}
        other => panic!("loopback busy poll reported as {other:?}"),
    }
}

/// A uring end receiving from `sock` into a buffer. A recv is posted only
/// when a message is missing, so the buffer is compacted with no request
/// in flight.
struct UringRx {
    src: UringSource,
    sock: OwnedFd,
    buf: Box<[u8; 4096]>,
    have: usize,
    start: usize,
    in_flight: bool,
}

impl UringRx {
    /// Post a recv if none is in flight.
    fn post(&mut self) {
        if self.in_flight {
            return;
        }
        self.buf.copy_within(self.start..self.have, 0);
        self.have -= self.start;
        self.start = 0;
        let free = &mut self.buf[self.have..];
        // SAFETY: the buffer outlives the request: every test takes the CQE
        // (or the peer closes, completing it) before dropping UringRx.
        unsafe {
            self.src
                .recv(self.sock.as_fd(), free.as_mut_ptr(), free.len() as u32, 7)
                .unwrap()
        };
        self.in_flight = true;
    }

    /// Next whole message, waiting in `w`'s mode; None at EOF.
    fn next(&mut self, w: &mut Waiter) -> Option<[u8; MSG]> {
        while self.have - self.start < MSG {
            self.post();
            let cqe = w
                .wait_timeout(&mut self.src, Duration::from_secs(10))
                .unwrap()?;
            self.in_flight = false;
            assert_eq!(cqe.user_data(), 7);
            let r = cqe.result();
            assert!(r >= 0, "recv failed: {r}");
            if r == 0 {
                return None;
            }
            self.have += r as usize;
        }
        let m: [u8; MSG] = self.buf[self.start..self.start + MSG].try_into().unwrap();
        self.start += MSG;
        Some(m)
    }
}

fn uring_rx(sock: OwnedFd, wake: UringWake) -> Option<UringRx> {
    let src = match UringSource::new(8, wake) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED uring tests: {e}");
            return None;
        }
    };
    Some(UringRx {
        src,
        sock,
        buf: Box::new([0; 4096]),
        have: 0,
        start: 0,
        in_flight: false,
    })
}

#[test]
fn uring_source_delivers_every_message_once_in_order_in_every_mode_and_wake() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    for wake in [UringWake::Enter, UringWake::EventFd] {
        for mode in MODES {
            let (a, b) = UnixStream::pair().unwrap();
            let Some(mut rx) = uring_rx(OwnedFd::from(a), wake) else {
                return;
            };
            let p = producer(b);
            let mut w = Waiter::new(mode);
            for seq in 0..N {
                let m = rx
                    .next(&mut w)
                    .unwrap_or_else(|| panic!("{wake:?} {mode}: message {seq} never came"));
                assert_eq!(m, msg(seq), "{wake:?} {mode}: message {seq}");
            }
            p.join().unwrap();
            // The producer closed: the in-flight recv completes with 0.
            assert!(rx.next(&mut w).is_none(), "{wake:?} {mode}: extra data");
            if mode == WaitMode::Interrupt {
                assert!(w.stats().sleeps > 0, "{wake:?}: interrupt mode never slept");
            }
        }
    }
}

#[test]
fn uring_source_times_out_and_peeks_without_taking() {
    for wake in [UringWake::Enter, UringWake::EventFd] {
        let (a, mut b) = UnixStream::pair().unwrap();
        let Some(mut rx) = uring_rx(OwnedFd::from(a), wake) else {
            return;
        };
        let mut w = Waiter::new(WaitMode::Interrupt);
        rx.post();
        let t = Instant::now();
        assert!(
            w.wait_timeout(&mut rx.src, Duration::from_millis(20))
                .unwrap()
                .is_none()
        );
        assert!(t.elapsed() >= Duration::from_millis(20), "{wake:?}");
        assert!(rx.src.notify_fd().is_some());
        b.write_all(&msg(1)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !rx.src.ready() {
            // Task work completes the recv once this thread enters the
            // kernel; any syscall does.
            std::thread::sleep(Duration::from_micros(100));
            assert!(Instant::now() < deadline, "{wake:?}: CQE never showed");
        }
        // ready() is a peek: it does not consume.
        assert!(rx.src.ready());
        assert_eq!(rx.next(&mut w).unwrap(), msg(1));
        drop(b);
        assert!(rx.next(&mut w).is_none());
    }
}
