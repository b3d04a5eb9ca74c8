//! Busy-polling threads under `FASTWAKE_POLLERS=sleep`: a thread that
//! spins on a non-blocking socket sleeps through idle gaps (its CPU falls,
//! what it receives does not change), and a thread that also polls a
//! memory flag is switched off by the hazard rule as soon as it shows
//! progress the shim cannot explain. Each test runs a `child_*` scenario
//! of this binary under the shim (tests/common).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::child;

fn socketpair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0);
    // SAFETY: two fresh fds we now own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn nonblocking(fd: &OwnedFd) {
    // SAFETY: fcntl on a live fd.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

fn send(fd: &OwnedFd, data: &[u8]) {
    // SAFETY: a live buffer.
    let n = unsafe { libc::send(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) };
    assert_eq!(n, data.len() as isize);
}

/// One non-blocking `recv` of up to `buf.len()` bytes: n, or None on EAGAIN.
fn try_recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: a live buffer.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(e, Some(libc::EAGAIN), "recv failed");
        return None;
    }
    Some(n as usize)
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A `key=value` of the shim's pollers exit line.
fn pollers(out: &std::process::Output, key: &str) -> u64 {
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .filter(|l| l.starts_with("fastwake-preload: pollers "))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.strip_prefix(&format!("{key}=")))
        .map(|v| v.parse::<f64>().unwrap_or(0.0) as u64)
        .sum()
}

/// A `key=value` the scenario printed on stdout.
fn printed(out: &std::process::Output, key: &str) -> String {
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {s}"))
        .to_string()
}

// ------------------------------------------------------------ idle gaps

const MESSAGES: usize = 150;

#[test]
#[ignore = "child scenario, run by an_idle_spinning_server_gives_its_cpu_back"]
fn child_spinning_server() {
    let (srv, cli) = socketpair();
    nonblocking(&srv);
    // A second socket that never has data, polled first in each loop (as
    // a server polls its listener): a sleep may start at either, and one
    // ended by the other must return the idle one empty.
    let (idle, _idle_peer) = socketpair();
    nonblocking(&idle);
    let server = std::thread::spawn(move || {
        common::pin(0);
        let mut buf = [0u8; 64];
        let mut sum: u64 = 0;
        let mut got = 0;
        while got < MESSAGES {
            assert!(try_recv(&idle, &mut buf).is_none(), "data from nowhere");
            // Spin: recv until something is there, as a polling server does.
            let Some(n) = try_recv(&srv, &mut buf) else {
                continue;
            };
            assert!(n > 0, "peer closed early");
            for &b in &buf[..n] {
                sum = sum.wrapping_mul(31).wrapping_add(b as u64);
            }
            got += buf[..n].iter().filter(|&&b| b == b'\n').count();
            send(&srv, &buf[..n]);
        }
        (sum, thread_cpu())
    });
    common::pin(1);
    let mut back = [0u8; 64];
    let t0 = Instant::now();
    for i in 0..MESSAGES {
        std::thread::sleep(Duration::from_millis(2));
        let msg = format!("message {i}\n");
        send(&cli, msg.as_bytes());
        let mut have = 0;
        // Blocking read of the echo (the client is not the thread tested).
        while have < msg.len() {
            // SAFETY: a live buffer.
            let n = unsafe {
                libc::recv(
                    cli.as_raw_fd(),
                    back[have..].as_mut_ptr().cast(),
                    back.len() - have,
                    0,
                )
            };
            assert!(n > 0);
            have += n as usize;
        }
        assert_eq!(&back[..have], msg.as_bytes());
    }
    let (sum, cpu) = server.join().unwrap();
    println!(
        "checksum={sum} server_cpu_us={} wall_us={}",
        cpu.as_micros(),
        t0.elapsed().as_micros()
    );
}

#[test]
fn an_idle_spinning_server_gives_its_cpu_back() {
    let base = [("FASTWAKE_MODE", "hybrid")];
    let Some(plain) = child("child_spinning_server", &base) else {
        return;
    };
    let sleep = [("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_POLLERS", "sleep")];
    let Some(slept) = child("child_spinning_server", &sleep) else {
        return;
    };
    let err = String::from_utf8_lossy(&slept.stderr);
    assert_eq!(
        printed(&plain, "checksum"),
        printed(&slept, "checksum"),
        "what the server received changed"
    );
    let cpu = |o| printed(o, "server_cpu_us").parse::<f64>().unwrap();
    let (a, b) = (cpu(&plain), cpu(&slept));
    eprintln!(
        "server CPU: spinning {a:.0} us, with pollers=sleep {b:.0} us ({:.3}x)",
        b / a
    );
    // Idle gaps of 2 ms between messages: the spinning server holds its
    // CPU throughout; asleep it wakes about once per message and bound.
    assert!(b < 0.5 * a, "CPU {b} us against {a} us spinning:\n{err}");
    assert!(pollers(&slept, "sleeps") >= MESSAGES as u64 / 2, "{err}");
    assert!(pollers(&slept, "woke_by_completion") >= 1, "{err}");
    assert_eq!(pollers(&slept, "threads_off_hazard"), 0, "{err}");
    assert_eq!(pollers(&plain, "sleeps"), 0);
}

// ------------------------------------------------------------ the hazard

const FLAGS: usize = 12;

/// A thread polls a socket and a memory flag that another thread sets;
/// when it sees the flag it answers on a second socket (its progress).
/// Prints the flag latencies (µs), first one first.
#[test]
#[ignore = "child scenario, run by a_thread_polling_memory_is_switched_off"]
fn child_flag_poller() {
    let (srv, cli) = socketpair();
    let (ans, ans_peer) = socketpair();
    nonblocking(&srv);
    let flag = Arc::new(AtomicBool::new(false));
    let set_at = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let poller = {
        let (flag, set_at, done) = (flag.clone(), set_at.clone(), done.clone());
        std::thread::spawn(move || {
            common::pin(0);
            let csw0 = involuntary_switches();
            let mut buf = [0u8; 64];
            let mut lat = Vec::new();
            while !done.load(Ordering::Acquire) {
                let _ = try_recv(&srv, &mut buf);
                if flag.swap(false, Ordering::AcqRel) {
                    let now = epoch.elapsed().as_nanos() as u64;
                    lat.push(now.saturating_sub(set_at.load(Ordering::Acquire)) / 1000);
                    send(&ans, b"!");
                }
            }
            (lat, involuntary_switches() - csw0)
        })
    };
    common::pin(1);
    let set_flag = || {
        set_at.store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
        flag.store(true, Ordering::Release);
        let mut b = [0u8; 1];
        // Wait for the answer (blocking), so flags never overlap.
        // SAFETY: a live one-byte buffer.
        let n = unsafe { libc::recv(ans_peer.as_raw_fd(), b.as_mut_ptr().cast(), 1, 0) };
        assert_eq!(n, 1);
    };
    // Idle first: the poller's sleeps end by their bound.
    std::thread::sleep(Duration::from_millis(5));
    set_flag();
    for _ in 1..FLAGS {
        // Socket traffic (completions that grow the bound), then a flag
        // in the middle of the next idle gap.
        for _ in 0..3 {
            send(&cli, b"x");
            std::thread::sleep(Duration::from_micros(1500));
        }
        std::thread::sleep(Duration::from_micros(700));
        set_flag();
    }
    done.store(true, Ordering::Release);
    let (lat, preempted) = poller.join().unwrap();
    let list: Vec<String> = lat.iter().map(u64::to_string).collect();
    println!("latencies_us={} preempted={preempted}", list.join(","));
}

/// The calling thread's involuntary context switches so far.
fn involuntary_switches() -> i64 {
    // SAFETY: a zeroed rusage for getrusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nivcsw
}

fn latencies(out: &std::process::Output) -> Vec<u64> {
    printed(out, "latencies_us")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn a_thread_polling_memory_is_switched_off() {
    let with = [("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_POLLERS", "sleep")];
    let Some(on) = child("child_flag_poller", &with) else {
        return;
    };
    let without = [
        ("FASTWAKE_MODE", "hybrid"),
        ("FASTWAKE_POLLERS", "sleep"),
        ("FASTWAKE_TEST_POLLERS_NO_HAZARD", "1"),
    ];
    let off = child("child_flag_poller", &without).expect("shim built");
    let (a, b) = (latencies(&on), latencies(&off));
    eprintln!("flag latencies (us), hazard rule on: {a:?}");
    eprintln!("flag latencies (us), hazard rule off: {b:?}");
    let err = String::from_utf8_lossy(&on.stderr);
    assert_eq!(pollers(&on, "threads_off_hazard"), 1, "{err}");
    assert_eq!(pollers(&off, "threads_off_hazard"), 0);
    let first_bound = fastwake::wait::idle::BOUND_START_NS / 1000;
    // With the rule: one sleep's worth at most (the first flag came while
    // the bound was the first one; a wake-up's lateness on top), then the
    // thread polls the flag again.
    // With the rule: the first flag waits one sleep at most (it came while
    // the bound was the first one; a wake-up's lateness on top), then the
    // thread polls the flag again. A flag waits longer only where another
    // task took the poller's CPU (each such wait needs an involuntary
    // switch of the poller).
    let preempted: usize = printed(&on, "preempted").parse().unwrap();
    let late =
        (a[0] >= first_bound + 200) as usize + a[1..].iter().filter(|&&l| l >= first_bound).count();
    assert!(
        late <= preempted,
        "with the rule, {late} flags waited longer than a first bound, with {preempted} preemptions: {a:?}"
    );
    // Without it, the bound grows on the socket's completions, and flags
    // wait up to it.
    let mut later = b[1..].to_vec();
    later.sort_unstable();
    let median = later[later.len() / 2];
    assert!(
        median > 2 * first_bound,
        "without the rule the flags' median wait was {median} us: {b:?}"
    );
}
