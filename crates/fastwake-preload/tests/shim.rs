//! Semantics of the preload shim: a program must not be able to tell it is
//! there, except by latency.
//!
//! Each test re-runs this test binary as a child with `LD_PRELOAD` set to
//! the freshly built `libfastwake_preload.so` and runs one `child_*`
//! scenario there (they are `#[ignore]`d so a plain run skips them). The
//! scenarios call libc's `epoll_wait`/`poll` as any C program would; the
//! dynamic linker routes them to the shim. The parent checks the exit
//! status and, with FASTWAKE_VERBOSE=1, the shim's counters on stderr.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

mod common;
use common::fds::{epoll_with, ewait, pipe, poll1};
use common::{HYBRID, child, counter, pin, shim};
use std::process::Command;

// ---------------------------------------------------------------- helpers

fn write1(fd: &OwnedFd) {
    // SAFETY: one byte from a live buffer.
    let n = unsafe { libc::write(fd.as_raw_fd(), b"x".as_ptr().cast(), 1) };
    assert_eq!(n, 1);
}

/// Never shorter than asked (the hard rule); the upper slack only catches
/// a hang (precision is checked against the plain call in child_timeouts).
fn within(d: Duration, lo_ms: u64, slack_ms: u64) {
    assert!(
        d >= Duration::from_millis(lo_ms) && d <= Duration::from_millis(lo_ms + slack_ms),
        "waited {d:?}, expected {lo_ms} ms (+{slack_ms} ms slack)"
    );
}

// ------------------------------------------------------------- scenarios

#[test]
#[ignore = "child scenario, run by timeouts_are_honoured"]
fn child_timeouts() {
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    // The raw syscall bypasses the shim: the plain kernel wait, measured
    // interleaved with the shim's so machine noise hits both alike.
    // epoll_pwait with no signal mask is epoll_wait, and the one of the two
    // that aarch64 has.
    let raw = |ms: i32| {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let t = Instant::now();
        // SAFETY: a live epoll fd and event buffer; a null mask.
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                ep.as_raw_fd(),
                evs.as_mut_ptr(),
                4,
                ms,
                std::ptr::null::<libc::sigset_t>(),
                8usize, // the kernel's sigset size (unread: no mask)
            )
        };
        assert_eq!(n, 0);
        t.elapsed()
    };
    let raw_poll = |ms: i32| {
        let mut p = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: ms as i64 * 1_000_000,
        };
        let t = Instant::now();
        // SAFETY: one live pollfd, a live timespec, no sigmask.
        let n = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut p as *mut libc::pollfd,
                1,
                &ts as *const libc::timespec,
                std::ptr::null::<u64>(),
                8,
            )
        };
        assert_eq!(n, 0);
        t.elapsed()
    };
    let budget = Duration::from_micros(
        std::env::var("FASTWAKE_BUDGET_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50),
    );
    for ms in [1, 5, 20] {
        let (mut best_shim, mut best_raw, mut best_poll, mut best_raw_poll) =
            (Duration::MAX, Duration::MAX, Duration::MAX, Duration::MAX);
        for _ in 0..5 {
            let t = Instant::now();
            assert_eq!(ewait(&ep, ms).0, 0);
            let d = t.elapsed();
            within(d, ms as u64, 1_000);
            best_shim = best_shim.min(d);
            let t = Instant::now();
            assert_eq!(poll1(r.as_raw_fd(), ms).0, 0);
            let d = t.elapsed();
            within(d, ms as u64, 1_000);
            best_poll = best_poll.min(d);
            best_raw = best_raw.min(raw(ms));
            best_raw_poll = best_raw_poll.min(raw_poll(ms));
        }
        // The shim may add at most its spin (the remaining time is rounded
        // up to whole ms only after whole ms were asked for), plus 2 ms of
        // scheduling noise on a shared machine.
        let noise = budget + Duration::from_millis(2);
        assert!(
            best_shim <= best_raw + noise && best_poll <= best_raw_poll + noise,
            "{ms} ms: epoll {best_shim:?} vs plain {best_raw:?}, poll {best_poll:?} vs plain {best_raw_poll:?}"
        );
    }
}

#[test]
fn timeouts_are_honoured() {
    for mode in ["hybrid", "adaptive", "poll"] {
        let Some(out) = child(
            "child_timeouts",
            &[("FASTWAKE_MODE", mode), ("FASTWAKE_BUDGET_US", "200")],
        ) else {
            return;
        };
        // The shim was really there (else the test proves nothing), and
        // the fixed-budget modes spun. Adaptive learns from waits that
        // ended with an event; waits that all time out teach it nothing,
        // so it rightly stays in interrupt mode here.
        assert!(counter(&out, "waits") > 0, "{mode}: the shim saw no wait");
        if mode != "adaptive" {
            assert!(counter(&out, "spins") > 0, "{mode}: no spin happened");
        }
    }
}

#[test]
#[ignore = "child scenario, run by data_arrives_while_spinning_and_while_blocked"]
fn child_delivery() {
    let (r, w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    // Quick writes (caught while spinning) and slow ones (after blocking).
    pin(0);
    for delay_us in [20u64, 50, 100, 10_000, 30_000] {
        let w2 = w.try_clone().unwrap();
        let h = std::thread::spawn(move || {
            pin(1);
            std::thread::sleep(Duration::from_micros(delay_us));
            write1(&w2);
        });
        let (n, _, evs) = ewait(&ep, 2_000);
        assert_eq!(n, 1, "epoll_wait after {delay_us} µs");
        assert_eq!({ evs[0].u64 }, r.as_raw_fd() as u64);
        let mut b = [0u8; 1];
        // SAFETY: one byte into a live buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        assert_eq!(n, 1);
        h.join().unwrap();
        let w2 = w.try_clone().unwrap();
        let h = std::thread::spawn(move || {
            pin(1);
            std::thread::sleep(Duration::from_micros(delay_us));
            write1(&w2);
        });
        let (n, _, rev) = poll1(r.as_raw_fd(), 2_000);
        assert_eq!((n, rev & libc::POLLIN), (1, libc::POLLIN));
        // SAFETY: as above.
        let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        assert_eq!(n, 1);
        h.join().unwrap();
    }
}

#[test]
fn data_arrives_while_spinning_and_while_blocked() {
    // A 4 ms budget: the quick writes (≤ 100 µs, from a thread pinned to
    // the other CPU) land within it, the slow ones (≥ 10 ms) do not. On a
    // machine loaded by other work a writer can still miss every spin, so
    // allow three runs; every run must deliver everything regardless.
    let env = [("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_BUDGET_US", "4000")];
    let mut seen = (0, 0, 0);
    for _ in 0..3 {
        let Some(out) = child("child_delivery", &env) else {
            return;
        };
        seen = (
            counter(&out, "spin_hits"),
            counter(&out, "blocked"),
            counter(&out, "contended"),
        );
        if seen.0 > 0 && seen.1 > 0 {
            return;
        }
    }
    if seen.0 == 0 && seen.2 > 0 {
        // Every run found the CPU contended (a spin was preempted) and
        // backed off, as it must; the spin path could not be observed.
        eprintln!(
            "SKIPPED data_arrives_while_spinning (spin path): CPU contended by other work, shim backed off {} times",
            seen.2
        );
        assert!(seen.1 > 0);
        return;
    }
    panic!("spin hits / blocked / contended: {seen:?}; expected hits and blocked > 0");
}

#[test]
#[ignore = "child scenario, run by zero_timeout_does_not_spin"]
fn child_zero_timeout() {
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    for _ in 0..20_000 {
        assert_eq!(ewait(&ep, 0).0, 0);
        assert_eq!(poll1(r.as_raw_fd(), 0).0, 0);
    }
}

#[test]
fn zero_timeout_does_not_spin() {
    for mode in ["poll", "hybrid", "adaptive"] {
        let Some(out) = child(
            "child_zero_timeout",
            &[("FASTWAKE_MODE", mode), ("FASTWAKE_BUDGET_US", "1000")],
        ) else {
            return;
        };
        // Zero-timeout calls go straight through: not even counted as waits.
        assert_eq!(counter(&out, "spins"), 0, "{mode}");
        assert_eq!(counter(&out, "waits"), 0, "{mode}");
    }
}

#[test]
fn the_exit_report_says_when_nothing_was_intercepted() {
    let Some(so) = shim() else {
        eprintln!("SKIPPED: libfastwake_preload.so not built next to the test binary");
        return;
    };
    // `true` makes no hooked call at all.
    let out = Command::new("true")
        .env("LD_PRELOAD", &so)
        .env("FASTWAKE_MODE", "hybrid")
        .env("FASTWAKE_VERBOSE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "mode=hybrid: no waits intercepted: no hooked call was made (hooked: epoll_wait"
        ),
        "{err}"
    );
    // Mode off: the calls made are named, with why they passed through.
    let out = child("child_zero_timeout", &[("FASTWAKE_MODE", "off")]).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mode=off: no waits intercepted; calls seen:")
            && err.contains("epoll_wait seen=")
            && err.contains("(mode_off="),
        "{err}"
    );
}

static USR1: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
#[ignore = "child scenario, run by signals_interrupt_waits"]
fn child_eintr() {
    // SAFETY: installing a no-op handler without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    // Signals every 100 µs land while the shim spins (budget 2 ms); every
    // 30 ms, while it blocks in the kernel. Either way the wait must end
    // with EINTR. (Signals repeat because one sent before the call began
    // would, with or without the shim, not interrupt it.)
    for period_us in [100u64, 30_000] {
        for use_poll in [false, true] {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop2 = stop.clone();
            let h = std::thread::spawn(move || {
                while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(period_us));
                    // SAFETY: `me` is the live waiting thread.
                    unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                }
            });
            let t = Instant::now();
            let (n, e) = if use_poll {
                let (n, e, _) = poll1(r.as_raw_fd(), 1_000);
                (n, e)
            } else {
                let (n, e, _) = ewait(&ep, 1_000);
                (n, e)
            };
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            h.join().unwrap();
            assert_eq!(
                (n, e),
                (-1, libc::EINTR),
                "period {period_us} µs poll={use_poll}"
            );
            assert!(t.elapsed() < Duration::from_millis(500));
        }
    }
    let before = USR1.load(std::sync::atomic::Ordering::SeqCst);
    // epoll_pwait with a mask that blocks SIGUSR1: the signal must NOT end
    // the wait (it stays pending), as without the shim.
    // SAFETY: building a sigset and unblocking a pending signal later.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(100));
            libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1);
        });
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let t = Instant::now();
        let n = libc::epoll_pwait(ep.as_raw_fd(), evs.as_mut_ptr(), 4, 20, &set);
        assert_eq!(n, 0, "masked signal ended epoll_pwait");
        within(t.elapsed(), 20, 1_000);
        h.join().unwrap();
    }
    // The masked signal was still delivered, once the wait's mask lifted.
    assert_eq!(USR1.load(std::sync::atomic::Ordering::SeqCst), before + 1);
}

#[test]
fn signals_interrupt_waits() {
    let Some(out) = child(
        "child_eintr",
        &[("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_BUDGET_US", "2000")],
    ) else {
        return;
    };
    assert!(counter(&out, "spins") > 0);
}

#[test]
#[ignore = "child scenario, run by many_fds"]
fn child_many_fds() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get and raise our own soft limit up to the hard one.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let n = ((lim.rlim_cur as usize).saturating_sub(64) / 2).min(2000);
    assert!(n >= 200, "RLIMIT_NOFILE too low ({})", lim.rlim_cur);
    let pipes: Vec<(OwnedFd, OwnedFd)> = (0..n).map(|_| pipe()).collect();
    let rfds: Vec<i32> = pipes.iter().map(|p| p.0.as_raw_fd()).collect();
    let ep = epoll_with(&rfds);
    let mut pfds: Vec<libc::pollfd> = rfds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    for (k, delay_us) in [(n - 1, 30u64), (n / 2, 10_000), (0, 50)] {
        let w = pipes[k].1.try_clone().unwrap();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(delay_us));
            write1(&w);
        });
        let (got, _, evs) = ewait(&ep, 2_000);
        assert_eq!(got, 1);
        assert_eq!({ evs[0].u64 }, rfds[k] as u64);
        // SAFETY: n live pollfds.
        let got = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, 2_000) };
        assert_eq!(got, 1);
        let ready: Vec<usize> = (0..n).filter(|&i| pfds[i].revents != 0).collect();
        assert_eq!(ready, vec![k]);
        let mut b = [0u8; 1];
        // SAFETY: one byte into a live buffer.
        assert_eq!(unsafe { libc::read(rfds[k], b.as_mut_ptr().cast(), 1) }, 1);
        h.join().unwrap();
    }
}

#[test]
fn many_fds() {
    child("child_many_fds", HYBRID);
}

#[test]
#[ignore = "child scenario, run by fd_closed_while_another_thread_waits"]
fn child_close_while_waiting() {
    // Closing the write end while a thread waits: the reader sees HUP.
    let (r, w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        drop(w);
    });
    let (n, _, evs) = ewait(&ep, 2_000);
    assert_eq!(n, 1);
    assert!(evs[0].events & libc::EPOLLHUP as u32 != 0);
    h.join().unwrap();
    // Closing the watched fd itself removes it from the epoll set: the
    // wait then runs to its timeout, as without the shim.
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        drop(r);
    });
    let t = Instant::now();
    let (n, _, _) = ewait(&ep, 100);
    assert_eq!(n, 0);
    within(t.elapsed(), 100, 1_000);
    h.join().unwrap();
    // poll on an fd another thread closes: returns by its timeout, or
    // POLLNVAL if the close won the race with the call; never hangs.
    let (r, _w) = pipe();
    let fd = r.as_raw_fd();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        drop(r);
    });
    let t = Instant::now();
    let (n, _, rev) = poll1(fd, 100);
    assert!(n == 0 || (n == 1 && rev & libc::POLLNVAL != 0), "{n} {rev}");
    assert!(t.elapsed() < Duration::from_millis(1_000));
    h.join().unwrap();
}

#[test]
fn fd_closed_while_another_thread_waits() {
    child("child_close_while_waiting", HYBRID);
}

#[test]
#[ignore = "child scenario, run by fork_and_exec"]
fn child_fork_exec() {
    // Another thread is inside the shim (spinning or blocked) at the fork.
    let (r, w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    let ep2 = epoll_with(&[r.as_raw_fd()]);
    let busy = std::thread::spawn(move || {
        let (n, _, _) = ewait(&ep2, 200);
        assert!(n >= 0);
    });
    std::thread::sleep(Duration::from_millis(1));
    // SAFETY: fork; the child only uses async-signal-safe calls and the
    // shim's hooks (which take no locks) before _exit or exec.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // Child: its own waits work, with timeouts and data.
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: live buffers; async-signal-safe calls only.
        unsafe {
            let t = libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 4, 20);
            if t != 0 {
                libc::_exit(10);
            }
            libc::write(w.as_raw_fd(), b"y".as_ptr().cast(), 1);
            if libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 4, 1_000) != 1 {
                libc::_exit(11);
            }
            let mut b = [0u8; 1];
            libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
            // exec keeps the exit status (and the shim stays preloaded).
            let sh = c"/bin/sh".as_ptr();
            let args = [sh, c"-c".as_ptr(), c"exit 7".as_ptr(), std::ptr::null()];
            libc::execv(sh, args.as_ptr());
            libc::_exit(12);
        }
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(libc::WIFEXITED(st), "child status {st:#x}");
    assert_eq!(libc::WEXITSTATUS(st), 7, "child exit status");
    busy.join().unwrap();
}

#[test]
fn fork_and_exec() {
    child("child_fork_exec", HYBRID);
}

fn select1(fd: i32, timeout: Option<Duration>) -> (i32, i32, bool, Option<Duration>) {
    // SAFETY: a zeroed fd_set with one fd below FD_SETSIZE, a live timeval.
    unsafe {
        let mut set: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(fd, &mut set);
        let mut tv = timeout.map(|d| libc::timeval {
            tv_sec: d.as_secs() as _,
            tv_usec: d.subsec_micros() as _,
        });
        let tvp = tv.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut _);
        let n = libc::select(
            fd + 1,
            &mut set,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            tvp,
        );
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let left = tv.map(|t| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000));
        (n, e, libc::FD_ISSET(fd, &set), left)
    }
}

#[test]
#[ignore = "child scenario, run by select_keeps_its_semantics"]
fn child_select() {
    let (r, w) = pipe();
    let fd = r.as_raw_fd();
    // Timeout: never shorter than asked, the set cleared, nothing left.
    let t = Instant::now();
    let (n, _, isset, left) = select1(fd, Some(Duration::from_millis(5)));
    within(t.elapsed(), 5, 1_000);
    assert_eq!((n, isset, left), (0, false, Some(Duration::ZERO)));
    // Data while spinning and after blocking: the set says which fd, and
    // the time not slept is left in the timeval.
    pin(0);
    for delay_us in [30u64, 20_000] {
        let w2 = w.try_clone().unwrap();
        let h = std::thread::spawn(move || {
            pin(1);
            std::thread::sleep(Duration::from_micros(delay_us));
            write1(&w2);
        });
        let (n, _, isset, left) = select1(fd, Some(Duration::from_secs(2)));
        assert_eq!((n, isset), (1, true), "after {delay_us} µs");
        let left = left.unwrap();
        assert!(
            left < Duration::from_secs(2) && left > Duration::from_secs(1),
            "{left:?}"
        );
        let mut b = [0u8; 1];
        // SAFETY: one byte into a live buffer.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        assert_eq!(n, 1);
        h.join().unwrap();
    }
    // No timeout at all: waits for the data.
    let w2 = w.try_clone().unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        write1(&w2);
    });
    assert_eq!(select1(fd, None).0, 1);
    h.join().unwrap();
}

#[test]
fn select_keeps_its_semantics() {
    let env = [("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_BUDGET_US", "4000")];
    let Some(out) = child("child_select", &env) else {
        return;
    };
    assert!(counter(&out, "spins") > 0);
}

#[test]
#[ignore = "child scenario, run by no_spin_against_a_peer_on_the_same_cpu"]
fn child_same_cpu() {
    // A TCP loopback pair: the kernel records the sender's CPU on the
    // receiving socket (SO_INCOMING_CPU), which is how the shim knows.
    let peer_cpu: usize = std::env::var("PEER_CPU").unwrap().parse().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (rx, _) = l.accept().unwrap();
    pin(0);
    let h = std::thread::spawn(move || {
        pin(peer_cpu);
        let mut tx = tx;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_micros(300));
            std::io::Write::write_all(&mut tx, b"z").unwrap();
        }
    });
    for _ in 0..40 {
        let (n, _, rev) = poll1(rx.as_raw_fd(), 2_000);
        assert_eq!((n, rev & libc::POLLIN), (1, libc::POLLIN));
        let mut b = [0u8; 1];
        std::io::Read::read_exact(&mut &rx, &mut b).unwrap();
    }
    h.join().unwrap();
}

#[test]
fn no_spin_against_a_peer_on_the_same_cpu() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("SKIPPED no_spin_against_a_peer_on_the_same_cpu: needs 2 CPUs");
        return;
    }
    let base = [("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_BUDGET_US", "1000")];
    let Some(same) = child("child_same_cpu", &[base[0], base[1], ("PEER_CPU", "0")]) else {
        return;
    };
    // The first wait learns the peer's CPU; (nearly) every later one skips
    // the spin. A preempted sample can cost a few.
    let skips = counter(&same, "same_cpu_skips");
    assert!(
        skips >= 30,
        "same CPU: only {skips} of 40 waits skipped the spin"
    );
    let Some(cross) = child("child_same_cpu", &[base[0], base[1], ("PEER_CPU", "1")]) else {
        return;
    };
    assert_eq!(
        counter(&cross, "same_cpu_skips"),
        0,
        "peer on the other CPU"
    );
}

#[test]
fn bad_configuration_prints_one_line_and_passes_through() {
    for (k, v) in [
        ("FASTWAKE_MODE", "turbo"),
        ("FASTWAKE_BUDGET_US", "lots"),
        ("FASTWAKE_CPU_CAP", "700"),
    ] {
        let Some(out) = child("child_timeouts", &[(k, v), ("FASTWAKE_VERBOSE", "0")]) else {
            return;
        };
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("fastwake-preload:"))
            .collect();
        assert_eq!(lines.len(), 1, "{k}={v}: {err}");
        assert!(lines[0].contains(k) && lines[0].contains("passing through"));
    }
}

// ------------------------------------------------------- dispatch mode

const DISPATCH: &[(&str, &str)] = &[("FASTWAKE_MODE", "dispatch"), ("FASTWAKE_BUDGET_US", "200")];

/// Dispatch mode serves epoll_wait, poll and select through the per-CPU
/// dispatchers; the program must see exactly the plain calls' results:
/// events after quick and slow writes, timeouts honoured, EINTR on
/// signals, many fds, a close under a waiter, fork and exec. Each scenario
/// runs once.
#[test]
fn dispatch_mode_keeps_epoll_and_poll_semantics() {
    for scenario in [
        "child_delivery",
        "child_timeouts",
        "child_eintr",
        "child_many_fds",
        "child_close_while_waiting",
        "child_fork_exec",
        "child_zero_timeout",
        "child_select",
    ] {
        let Some(out) = child(scenario, DISPATCH) else {
            return;
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.lines().any(|l| l.contains("no dispatcher")),
            "{scenario}: a dispatcher failed to start:\n{err}"
        );
        if scenario != "child_zero_timeout" {
            assert!(
                counter(&out, "dispatch_waits") > 0,
                "{scenario}: no wait went through dispatch mode:\n{err}"
            );
        }
        if scenario == "child_delivery" {
            // Five epoll_wait and five poll waits.
            assert!(
                counter(&out, "dispatch_waits") >= 10,
                "poll was not dispatched:\n{err}"
            );
        }
    }
}

/// The point of the mode: waits are handed off by a dispatcher, not
/// served by the kernel's wake-up (or the fallback).
#[test]
fn dispatch_mode_hands_off() {
    let Some(out) = child("child_delivery", DISPATCH) else {
        return;
    };
    let (h, f) = (counter(&out, "handoffs"), counter(&out, "fallbacks"));
    assert!(
        h > 0,
        "no hand-off (fallbacks {f}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ------------------------------------------------- threads sharing a CPU

/// Two threads of this process wait on CPU 1, A first, then B. With
/// `due`, A has just had short blocked waits (about 0.4 ms each), so its
/// wait is due and B, finding it there, must not spin (A's data would
/// need the CPU B's spin holds). Without, A sleeps as a listener does
/// (no short waits behind it) and B spins as if alone.
fn siblings(due: bool) {
    let (ra, wa) = pipe();
    let (rb, wb) = pipe();
    let epa = epoll_with(&[ra.as_raw_fd()]);
    let epb = epoll_with(&[rb.as_raw_fd()]);
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    // How many waits A has begun.
    let begun = std::sync::Arc::new(AtomicUsize::new(0));
    let b2 = begun.clone();
    let ra2 = ra.try_clone().unwrap();
    let short = if due { 6 } else { 0 };
    let a = std::thread::spawn(move || {
        pin(1);
        let mut longest = Duration::ZERO;
        for _ in 0..short {
            b2.fetch_add(1, SeqCst);
            let t = Instant::now();
            assert_eq!(ewait(&epa, 2_000).0, 1);
            longest = longest.max(t.elapsed());
            let mut b = [0u8; 1];
            // SAFETY: a live one-byte buffer.
            unsafe { libc::read(ra2.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        }
        b2.fetch_add(1, SeqCst);
        (ewait(&epa, 2_000).0, longest)
    });
    pin(0);
    for i in 0..=short {
        while begun.load(SeqCst) <= i {
            std::thread::yield_now();
        }
        if i < short {
            std::thread::sleep(Duration::from_micros(400));
            write1(&wa);
        }
    }
    // A spins its 200 µs budget, then blocks. B waits on CPU 1 already
    // (yielding, so it runs the moment A blocks) for the go, given 300 µs
    // after A began: its plan lands just after A blocked, well inside
    // twice A's usual wait, even when this host is slow to wake a sleeper.
    let go = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g2 = go.clone();
    let b = std::thread::spawn(move || {
        pin(1);
        while !g2.load(SeqCst) {
            std::thread::yield_now();
        }
        ewait(&epb, 2_000).0
    });
    std::thread::sleep(Duration::from_micros(if due { 300 } else { 20_000 }));
    go.store(true, SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    write1(&wa);
    let (n, longest) = a.join().unwrap();
    assert_eq!(n, 1);
    write1(&wb);
    assert_eq!(b.join().unwrap(), 1);
    drop((ra, rb));
    // A loaded host stretched A's "short" waits past the 1 ms the rule
    // calls short: the scenario tested nothing; the parent runs it again.
    if due && longest > Duration::from_micros(950) {
        std::process::exit(common::RETRY);
    }
}

#[test]
#[ignore = "child scenario, run by no_spin_while_a_due_sibling_waits_on_the_cpu"]
fn child_due_sibling() {
    siblings(true);
}

#[test]
#[ignore = "child scenario, run by a_long_sleeping_sibling_does_not_stop_a_spin"]
fn child_long_sibling() {
    siblings(false);
}

fn two_cpus(name: &str) -> bool {
    // SAFETY: sysconf has no preconditions.
    let ok = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } >= 2;
    if !ok {
        eprintln!("SKIPPED {name}: needs 2 CPUs");
    }
    ok
}

#[test]
fn no_spin_while_a_due_sibling_waits_on_the_cpu() {
    if !two_cpus("no_spin_while_a_due_sibling_waits_on_the_cpu") {
        return;
    }
    let Some(out) = common::child_retrying("child_due_sibling", HYBRID) else {
        return;
    };
    assert!(
        counter(&out, "sibling_skips") > 0,
        "the second waiter on CPU 1 spun next to a due sibling:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The listener case: a thread asleep with no short waits
/// behind it must not switch spinning off for its CPU.
#[test]
fn a_long_sleeping_sibling_does_not_stop_a_spin() {
    if !two_cpus("a_long_sleeping_sibling_does_not_stop_a_spin") {
        return;
    }
    let Some(out) = child("child_long_sibling", HYBRID) else {
        return;
    };
    assert_eq!(
        counter(&out, "sibling_skips"),
        0,
        "a waiter skipped its spin for a long-sleeping sibling:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "child scenario, run by an_idle_dispatched_wait_costs_little_cpu"]
fn child_idle_cpu() {
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    let cpu = || {
        // SAFETY: getrusage into a zeroed struct.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        Duration::from_micros(us(u.ru_utime) + us(u.ru_stime))
    };
    // The first wait starts this CPU's dispatcher; then 300 ms of idle.
    assert_eq!(ewait(&ep, 10).0, 0);
    let c0 = cpu();
    assert_eq!(ewait(&ep, 300).0, 0);
    let used = cpu() - c0;
    // The dispatcher polls until its 2 ms idle threshold, then sleeps (and
    // its waiter with it, in interrupt mode): far below 10 % of the wait.
    assert!(
        used < Duration::from_millis(30),
        "{used:?} of CPU in a 300 ms idle wait"
    );
    eprintln!("idle-cpu: {used:?} in 300 ms");
}

/// The docs promise an idle program under dispatch mode costs next to no
/// CPU: the dispatcher goes to sleep after its idle threshold.
#[test]
fn an_idle_dispatched_wait_costs_little_cpu() {
    let Some(out) = child("child_idle_cpu", DISPATCH) else {
        return;
    };
    assert!(counter(&out, "dispatch_waits") >= 2);
}

#[test]
#[ignore = "child scenario, run by a_thread_the_shim_serves_asks_for_fastwake_slice"]
fn child_slice() {
    let before = fastwake::slice::get_slice().unwrap();
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    // A wait the shim serves (nothing comes: it times out).
    assert_eq!(ewait(&ep, 5).0, 0);
    let after = fastwake::slice::get_slice().unwrap();
    println!("SLICE before={before:?} after={after:?}");
}

#[test]
fn a_thread_the_shim_serves_asks_for_fastwake_slice() {
    // Does this kernel keep a thread's own slice at all?
    let probe = std::thread::spawn(|| fastwake::slice::set_slice(Some(Duration::from_micros(300))))
        .join()
        .unwrap();
    if let Err(e) = probe {
        eprintln!("SKIPPED a_thread_the_shim_serves_asks_for_fastwake_slice: {e}");
        return;
    }
    let line = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.find("SLICE ").map(|i| l[i..].to_string()))
            .unwrap_or_else(|| panic!("no SLICE line: {out:?}"))
    };
    let Some(off) = child("child_slice", &[("FASTWAKE_MODE", "interrupt")]) else {
        return;
    };
    let off = line(&off);
    let (before, after) = off.split_once(" after=").unwrap();
    assert_eq!(
        before.trim_start_matches("SLICE before="),
        after.split_whitespace().next().unwrap(),
        "the slice changed without FASTWAKE_SLICE: {off}"
    );
    let on = child(
        "child_slice",
        &[("FASTWAKE_MODE", "interrupt"), ("FASTWAKE_SLICE", "300us")],
    )
    .unwrap();
    let on = line(&on);
    assert!(on.contains("after=Some(300µs)"), "{on}");
    // (Its before may already be 300us: a thread made by a thread that
    // asked inherits the slice, as the kernel passes it on at clone.)
    assert!(!off.contains("300µs"), "{off}");
}
