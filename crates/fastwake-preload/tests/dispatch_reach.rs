//! Where dispatch mode reaches: `poll` and `select` sets of any size, the
//! unmasked forms of `ppoll`, `pselect` and `epoll_pwait2`, and worker
//! processes forked without exec (pre-fork servers). Each scenario checks
//! the program's results and that the waits were handed off by a
//! dispatcher, not served by the kernel's wake-up or a fallback.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

mod common;
use common::{child, counter, pin};

const DISPATCH: &[(&str, &str)] = &[("FASTWAKE_MODE", "dispatch")];
/// Waits per scenario, and fds in the big sets (past the 64-fd chunk the
/// dispatcher peeks at a time, and past the old 8-fd limit).
const ROUNDS: usize = 40;
const FDS: usize = 150;

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh fds we now own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// `n` pipes, a writer thread on CPU 0 that writes one byte into pipe
/// `k(i)` 300 µs after round `i` starts (long enough that the waiter is
/// asleep and the dispatcher hands off), and `wait(read fds)` on CPU 1,
/// which must return the index of the one readable pipe. Reads the byte.
fn rounds(n: usize, mut wait: impl FnMut(&[i32]) -> usize) {
    pin(1);
    let pipes: Vec<(OwnedFd, OwnedFd)> = (0..n).map(|_| pipe()).collect();
    let rfds: Vec<i32> = pipes.iter().map(|p| p.0.as_raw_fd()).collect();
    let wfds: Vec<i32> = pipes.iter().map(|p| p.1.as_raw_fd()).collect();
    let pick = move |i: usize| (i * 37 + 11) % n;
    let (go_r, go_w) = pipe();
    let writer = std::thread::spawn(move || {
        pin(0);
        let mut b = [0u8; 1];
        for i in 0..ROUNDS {
            // SAFETY: one byte into a live buffer; the fds outlive the
            // thread (joined below).
            unsafe {
                assert_eq!(libc::read(go_r.as_raw_fd(), b.as_mut_ptr().cast(), 1), 1);
                std::thread::sleep(Duration::from_micros(300));
                assert_eq!(libc::write(wfds[pick(i)], b"x".as_ptr().cast(), 1), 1);
            }
        }
    });
    for i in 0..ROUNDS {
        // SAFETY: one byte from a live buffer.
        unsafe { libc::write(go_w.as_raw_fd(), b"g".as_ptr().cast(), 1) };
        assert_eq!(wait(&rfds), pick(i), "round {i}: wrong fd ready");
        let mut b = [0u8; 1];
        // SAFETY: one byte into a live buffer.
        let got = unsafe { libc::read(rfds[pick(i)], b.as_mut_ptr().cast(), 1) };
        assert_eq!(got, 1);
    }
    writer.join().unwrap();
}

fn pollfds(fds: &[i32]) -> Vec<libc::pollfd> {
    fds.iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// The one index with `revents`, after a call that returned `got`.
fn the_ready(got: i32, p: &[libc::pollfd]) -> usize {
    assert_eq!(got, 1, "poll returned {got}");
    let ready: Vec<usize> = (0..p.len()).filter(|&i| p[i].revents != 0).collect();
    assert_eq!(ready.len(), 1);
    ready[0]
}

#[test]
#[ignore = "child scenario, run by dispatch_serves_big_poll_and_select_sets"]
fn child_big_poll() {
    rounds(FDS, |fds| {
        let mut p = pollfds(fds);
        // SAFETY: live pollfds.
        let got = unsafe { libc::poll(p.as_mut_ptr(), p.len() as _, 2_000) };
        the_ready(got, &p)
    });
}

#[test]
#[ignore = "child scenario, run by dispatch_serves_big_poll_and_select_sets"]
fn child_big_select() {
    rounds(FDS, |fds| {
        // SAFETY: fd_set is plain data; FD_SET fills it with open fds
        // below FD_SETSIZE (150 pipes in a fresh process).
        unsafe {
            let mut set: libc::fd_set = std::mem::zeroed();
            for &fd in fds {
                libc::FD_SET(fd, &mut set);
            }
            let nfds = fds.iter().max().unwrap() + 1;
            let mut tv = libc::timeval {
                tv_sec: 2,
                tv_usec: 0,
            };
            let got = libc::select(
                nfds,
                &mut set,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            assert_eq!(got, 1);
            let ready: Vec<usize> = (0..fds.len())
                .filter(|&i| libc::FD_ISSET(fds[i], &set))
                .collect();
            assert_eq!(ready.len(), 1);
            ready[0]
        }
    });
}

#[test]
#[ignore = "child scenario, run by dispatch_serves_unmasked_timed_waits"]
fn child_ppoll_unmasked() {
    rounds(4, |fds| {
        let mut p = pollfds(fds);
        let ts = libc::timespec {
            tv_sec: 2,
            tv_nsec: 0,
        };
        // SAFETY: live pollfds and timespec, no mask.
        let got = unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as _, &ts, std::ptr::null()) };
        the_ready(got, &p)
    });
}

#[test]
#[ignore = "child scenario, run by dispatch_serves_unmasked_timed_waits"]
fn child_pwait2_unmasked() {
    let mut ep = None;
    rounds(3, |fds| {
        let ep = *ep.get_or_insert_with(|| {
            // SAFETY: a new epoll instance (leaked with the process), and
            // registrations of live fds carrying their index.
            unsafe {
                let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
                for (i, &fd) in fds.iter().enumerate() {
                    let mut ev = libc::epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: i as u64,
                    };
                    assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
                }
                ep
            }
        });
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let ts = libc::timespec {
            tv_sec: 2,
            tv_nsec: 0,
        };
        // SAFETY: live buffers; epoll_pwait2 by number (glibc 2.35+ has a
        // wrapper, bookworm's 2.36 too, but the libc crate may not bind
        // it): dlsym finds the shim's hook first, as a program's call would.
        let got = unsafe {
            let f = libc::dlsym(libc::RTLD_DEFAULT, c"epoll_pwait2".as_ptr());
            assert!(!f.is_null(), "no epoll_pwait2 in this libc");
            let f: unsafe extern "C" fn(
                i32,
                *mut libc::epoll_event,
                i32,
                *const libc::timespec,
                *const libc::sigset_t,
            ) -> i32 = std::mem::transmute(f);
            f(ep, evs.as_mut_ptr(), 4, &ts, std::ptr::null())
        };
        assert_eq!(got, 1);
        evs[0].u64 as usize
    });
}

/// A pre-fork server: the parent waits once (so it has a dispatcher
/// before the fork, as a master that waited does), then forks two workers
/// without exec; each serves its rounds in dispatch mode and exits with
/// its verdict.
#[test]
#[ignore = "child scenario, run by dispatch_serves_pre_fork_workers"]
fn child_pre_fork() {
    // One wait that times out: it starts the parent's dispatcher for CPU 1
    // and hands nothing off, so every hand-off counted is a worker's.
    pin(1);
    let (r, _w) = pipe();
    let mut p = pollfds(&[r.as_raw_fd()]);
    // SAFETY: a live pollfd.
    assert_eq!(unsafe { libc::poll(p.as_mut_ptr(), 1, 5) }, 0);
    let workers: Vec<libc::pid_t> = (0..2)
        .map(|_| {
            // SAFETY: the child runs its scenario and leaves with exit
            // (flushing the shim's report), never returning here.
            match unsafe { libc::fork() } {
                0 => {
                    let ok = std::panic::catch_unwind(|| {
                        rounds(2, |fds| {
                            let mut p = pollfds(fds);
                            // SAFETY: live pollfds.
                            let got = unsafe { libc::poll(p.as_mut_ptr(), 2, 2_000) };
                            the_ready(got, &p)
                        })
                    })
                    .is_ok();
                    std::process::exit(if ok { 0 } else { 1 });
                }
                pid => {
                    assert!(pid > 0, "fork failed");
                    pid
                }
            }
        })
        .collect();
    for pid in workers {
        let mut st = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "worker {pid} failed ({st:#x})"
        );
    }
}

/// Every wait of the scenario was dispatched and most were handed off.
fn assert_dispatched(name: &str, waits: u64) {
    let Some(out) = child(name, DISPATCH) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    let (w, h) = (counter(&out, "dispatch_waits"), counter(&out, "handoffs"));
    assert!(
        w >= waits,
        "{name}: {w} dispatched waits of {waits}:\n{err}"
    );
    // The writer waits 300 µs per round: the waiter is asleep by then, so
    // the dispatcher hands off (a relay pass or a fallback may catch a
    // few on a busy host).
    assert!(h >= waits / 2, "{name}: {h} hand-offs of {w} waits:\n{err}");
}

#[test]
fn dispatch_serves_big_poll_and_select_sets() {
    assert_dispatched("child_big_poll", ROUNDS as u64);
    assert_dispatched("child_big_select", ROUNDS as u64);
}

#[test]
fn dispatch_serves_unmasked_timed_waits() {
    assert_dispatched("child_ppoll_unmasked", ROUNDS as u64);
    assert_dispatched("child_pwait2_unmasked", ROUNDS as u64);
}

/// Worker processes forked without exec start dispatchers of their own:
/// their waits are handed off (the parent's one wait timed out, so every
/// hand-off is a worker's).
#[test]
fn dispatch_serves_pre_fork_workers() {
    let Some(out) = child("child_pre_fork", DISPATCH) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    let reports = err.lines().filter(|l| l.contains("waits=")).count();
    assert!(
        reports >= 3,
        "expected the parent's and two workers' reports:\n{err}"
    );
    let (w, h) = (counter(&out, "dispatch_waits"), counter(&out, "handoffs"));
    assert!(w > 2 * ROUNDS as u64, "{w} dispatched waits:\n{err}");
    assert!(h >= ROUNDS as u64, "{h} hand-offs of {w} waits:\n{err}");
}
