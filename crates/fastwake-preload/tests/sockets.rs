//! The blocking socket hooks (`recv`, `recvfrom`, `recvmsg`, `read`,
//! `accept`): a program must not be able to tell the shim is there, except
//! by latency. Each test runs one `child_*` scenario of this binary under
//! the shim (tests/common) and checks its exit status and counters.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{child, counter};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn socketpair(kind: i32) -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0);
    // SAFETY: two fresh fds we now own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn send(fd: &OwnedFd, data: &[u8]) {
    // SAFETY: a live buffer of data.len() bytes.
    let n = unsafe { libc::send(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) };
    assert_eq!(n, data.len() as isize);
}

/// Send `data` on `fd` after `after`, from another thread.
fn send_later(fd: &OwnedFd, after: Duration, data: &'static [u8]) -> std::thread::JoinHandle<()> {
    let fd = fd.try_clone().unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        send(&fd, data);
    })
}

fn recv(fd: &OwnedFd, len: usize, flags: i32) -> (isize, i32, Vec<u8>) {
    let mut buf = vec![0u8; len];
    // SAFETY: a live buffer of len bytes.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len, flags) };
    let e = errno();
    buf.truncate(n.max(0) as usize);
    (n, e, buf)
}

// ---------------------------------------------------------------- data

#[test]
#[ignore = "child scenario, run by socket_calls_keep_their_semantics"]
fn child_semantics() {
    let (a, b) = socketpair(libc::SOCK_STREAM);
    // Arrives while spinning (budget 20 ms), then while blocked.
    for after in [2, 60] {
        let t = send_later(&b, Duration::from_millis(after), b"hello");
        let (n, _, got) = recv(&a, 64, 0);
        assert_eq!((n, &got[..]), (5, &b"hello"[..]), "after {after} ms");
        t.join().unwrap();
    }
    // MSG_PEEK leaves the data for the next call.
    let t = send_later(&b, Duration::from_millis(2), b"peek");
    let (n, _, got) = recv(&a, 64, libc::MSG_PEEK);
    assert_eq!((n, &got[..]), (4, &b"peek"[..]));
    let (n, _, got) = recv(&a, 64, 0);
    assert_eq!((n, &got[..]), (4, &b"peek"[..]));
    t.join().unwrap();
    // MSG_WAITALL waits for all of it across two sends; a short read
    // returns what is there.
    let t = std::thread::spawn({
        let b = b.try_clone().unwrap();
        move || {
            std::thread::sleep(Duration::from_millis(2));
            send(&b, b"1234");
            std::thread::sleep(Duration::from_millis(30));
            send(&b, b"5678");
        }
    });
    let (n, _, got) = recv(&a, 8, libc::MSG_WAITALL);
    assert_eq!((n, &got[..]), (8, &b"12345678"[..]));
    t.join().unwrap();
    send(&b, b"abc");
    let (n, _, got) = recv(&a, 64, 0);
    assert_eq!((n, &got[..]), (3, &b"abc"[..]));
    // MSG_DONTWAIT on nothing: EAGAIN at once, no spin.
    let t0 = Instant::now();
    let (n, e, _) = recv(&a, 64, libc::MSG_DONTWAIT);
    assert_eq!((n, e), (-1, libc::EAGAIN));
    assert!(
        t0.elapsed() < Duration::from_millis(5),
        "{:?}",
        t0.elapsed()
    );
    // A non-blocking socket: EAGAIN at once too.
    let (c, _d) = socketpair(libc::SOCK_STREAM | libc::SOCK_NONBLOCK);
    let t0 = Instant::now();
    let (n, e, _) = recv(&c, 64, 0);
    assert_eq!((n, e), (-1, libc::EAGAIN));
    assert!(
        t0.elapsed() < Duration::from_millis(5),
        "{:?}",
        t0.elapsed()
    );
    // SO_RCVTIMEO: EAGAIN after the timeout, never before.
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: a live timeval of the size given.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    assert_eq!(r, 0);
    let t0 = Instant::now();
    let (n, e, _) = recv(&a, 64, 0);
    let took = t0.elapsed();
    assert_eq!((n, e), (-1, libc::EAGAIN));
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_millis(50 + 20 + 200),
        "{took:?}"
    );
    // read and recvmsg on a socket.
    let t = send_later(&b, Duration::from_millis(2), b"rd");
    let mut buf = [0u8; 16];
    // SAFETY: a live buffer.
    let n = unsafe { libc::read(a.as_raw_fd(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..n as usize], b"rd");
    t.join().unwrap();
    let t = send_later(&b, Duration::from_millis(2), b"msg");
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 16,
    };
    // SAFETY: msghdr is plain data; zero is valid.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    // SAFETY: a msghdr pointing at one live iovec.
    let n = unsafe { libc::recvmsg(a.as_raw_fd(), &mut mh, 0) };
    assert_eq!(&buf[..n as usize], b"msg");
    t.join().unwrap();
    // EOF: the peer closes while we wait.
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        drop(b);
    });
    // SAFETY: clear the receive timeout set above (a zero timeval).
    let zero = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: a live timeval of the size given.
    unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&zero as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let (n, _, _) = recv(&a, 64, 0);
    assert_eq!(n, 0, "EOF");
    t.join().unwrap();
    // UDP recvfrom with the sender's address; accept on TCP.
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = u.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2));
        peer.send_to(b"udp", to).unwrap();
        peer.local_addr().unwrap()
    });
    // SAFETY: sockaddr_in is plain data; zero is valid.
    let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut flen = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: live buffers of the sizes given.
    let n = unsafe {
        libc::recvfrom(
            u.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            16,
            0,
            (&mut from as *mut libc::sockaddr_in).cast(),
            &mut flen,
        )
    };
    let sender = t.join().unwrap();
    assert_eq!(&buf[..n as usize], b"udp");
    assert_eq!(u16::from_be(from.sin_port), sender.port());
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2));
        std::net::TcpStream::connect(addr).unwrap()
    });
    // SAFETY: accept without an address.
    let fd = unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(fd >= 0);
    // SAFETY: a fresh fd we own.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    drop(t.join().unwrap());
}

#[test]
fn socket_calls_keep_their_semantics() {
    let mode = [("FASTWAKE_MODE", "hybrid:20ms")];
    let Some(out) = child("child_semantics", &mode) else {
        return;
    };
    // Served, not passed through: waits counted, and at least one caught
    // its data while spinning (more when the CPU is not contended: a
    // preempted spin makes the governor back off).
    assert!(
        counter(&out, "waits") >= 5,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        counter(&out, "spin_hits") >= 1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same scenario passes plain, and in every other mode.
    for m in ["off", "interrupt", "adaptive", "dispatch", "poll"] {
        child("child_semantics", &[("FASTWAKE_MODE", m)]);
    }
}

// ---------------------------------------------------------------- files

#[test]
#[ignore = "child scenario, run by files_pipes_and_ttys_pass_through"]
fn child_not_sockets() {
    let (r, w) = {
        let mut fds = [0; 2];
        // SAFETY: a two-int array for pipe2.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh fds we own.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    };
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: one byte from a live buffer.
        unsafe { libc::write(w.as_raw_fd(), b"p".as_ptr().cast(), 1) };
    });
    let mut b = [0u8; 4];
    // SAFETY: a live buffer.
    let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 4) };
    assert_eq!((n, b[0]), (1, b'p'));
    t.join().unwrap();
    // A file read whole, through the hook, and the same bytes as read
    // from the file system by other means.
    let text = std::fs::read("/proc/self/maps").unwrap();
    assert!(!text.is_empty());
}

#[test]
fn files_pipes_and_ttys_pass_through() {
    let Some(out) = child("child_not_sockets", &[("FASTWAKE_MODE", "hybrid:20ms")]) else {
        return;
    };
    assert_eq!(
        counter(&out, "waits"),
        0,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------- signals

static HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

fn handle(sig: libc::c_int, restart: bool) {
    // SAFETY: sigaction is plain data; a handler that only counts.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// Signal this thread every 10 ms, from another thread, until the
/// returned flag is set (a single signal could land before the call
/// starts on a loaded machine, and prove nothing).
fn signal_me() -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    // SAFETY: pthread_self of this thread, alive until the join.
    let me = unsafe { libc::pthread_self() } as usize;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            // SAFETY: the target thread is alive until it joins us.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
        }
    });
    (stop, h)
}

#[test]
#[ignore = "child scenario, run by signals_interrupt_only_where_the_plain_call_would"]
fn child_signals() {
    // No SA_RESTART: the handler runs and recv returns EINTR. (Data comes
    // after 1 s, so a shim that swallowed the EINTR fails here instead of
    // hanging.)
    let (c, d) = socketpair(libc::SOCK_STREAM);
    handle(libc::SIGUSR1, false);
    let before = HANDLED.load(Ordering::Relaxed);
    let (stop, k) = signal_me();
    let late = send_later(&d, Duration::from_secs(1), b"late!");
    let (n, e, _) = recv(&c, 64, 0);
    stop.store(true, Ordering::Relaxed);
    k.join().unwrap();
    assert_eq!((n, e), (-1, libc::EINTR));
    late.join().unwrap();
    let (a, b) = socketpair(libc::SOCK_STREAM);
    assert!(HANDLED.load(Ordering::Relaxed) > before);
    // SA_RESTART: the handler runs and recv goes on to the data.
    handle(libc::SIGUSR1, true);
    let before = HANDLED.load(Ordering::Relaxed);
    let (stop, k) = signal_me();
    let t = send_later(&b, Duration::from_millis(60), b"after");
    let (n, _, got) = recv(&a, 64, 0);
    stop.store(true, Ordering::Relaxed);
    k.join().unwrap();
    t.join().unwrap();
    assert_eq!((n, &got[..]), (5, &b"after"[..]));
    assert!(HANDLED.load(Ordering::Relaxed) > before);
}

#[test]
fn signals_interrupt_only_where_the_plain_call_would() {
    // The signal lands in the spin (200 ms budget) and in a blocked wait
    // (1 µs budget), and plain.
    for m in ["hybrid:200ms", "hybrid:1us", "off"] {
        child("child_signals", &[("FASTWAKE_MODE", m)]);
    }
}
