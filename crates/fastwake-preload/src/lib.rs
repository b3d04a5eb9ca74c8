//! `libfastwake_preload.so`: fastwake's wait modes for unmodified programs.
//!
//! Loaded with `LD_PRELOAD` (usually through `fastwake run`), the library
//! interposes the calls a program blocks in and applies the mode chosen by
//! the `FASTWAKE_*` environment variables (docs/reference/environment.md).
//!
//! Rules every module here follows, because a shim must never break its
//! host:
//! - no panic crosses the FFI boundary: hook bodies are plain arithmetic and
//!   syscalls, and any path that could fail falls back to the real call;
//! - the real function is found with `dlsym(RTLD_NEXT)` ([`real`]);
//! - the shim's own needs use raw syscalls (rustix, `libc::syscall`), never
//!   a libc function it hooks, so it cannot recurse into itself;
//! - the fd hooks (`epoll_wait`, `epoll_pwait`, `epoll_pwait2`, `poll`,
//!   `ppoll`, `select`, `pselect`, and the blocking socket calls) in the
//!   spinning modes take no lock and allocate nothing: their state is a
//!   per-thread cell (the thread's [`fastwake::wait::Governor`], no heap)
//!   or global atomics, which stay consistent across `fork` and in signal
//!   handlers (a hook entered from a signal handler while its thread waits
//!   finds the cell borrowed and passes through). Where that does not hold,
//!   and why it is safe:
//!   - the verbs hooks (`ibv_poll_cq`, `ibv_req_notify_cq`,
//!     `ibv_get_cq_event`, `ibv_ack_cq_events`) take the shim's mutex of
//!     that one CQ (`verbs::table`), held for a few loads and stores and the
//!     provider's own non-blocking `poll_cq`, never across a wait; the
//!     dispatcher only ever `try_lock`s it. Like the provider's own CQ lock
//!     it must not be taken from a signal handler that interrupted a verbs
//!     call on the same CQ, which libibverbs programs already may not do;
//!   - `dispatch` mode: the first dispatched wait on a CPU starts that CPU's
//!     dispatcher (two threads); a thread's first dispatched wait, and any
//!     wait on a different fd set or completion channel than its previous
//!     one, allocates one peek handle (an `Arc`) and takes the library's
//!     registration lock for a few stores. A wait on the same set as the
//!     previous one allocates nothing and takes no lock. The thread's
//!     dispatch state is borrowed for the whole wait, so a signal handler's
//!     hook passes through instead of re-entering the registration.
//!
//! Modules: [`config`] (environment), [`dispatch`] (dispatch mode: waits
//! handed off by a per-CPU dispatcher), [`real`] (the next definitions of the
//! hooked symbols), [`wait`] (the spinning fd-hook wait; every decision is
//! the library's [`fastwake::wait::Governor`]'s), [`peer`] (which socket
//! tells the peer's CPU), and one
//! module per family of hooked calls: [`epoll`], [`poll`], [`select`],
//! [`sockets`] (blocking `recv`/`recvfrom`/`recvmsg`/`read`/`accept`),
//! [`uring`] (liburing's `__io_uring_get_cqe`, `io_uring_wait_cqe_timeout`),
//! [`verbs`] (libibverbs: completion channels and the context's CQ ops).
//!
//! Counters: [`stats`] (one shared-memory segment per process that
//! `fastwake stats` reads live; the exit report; `sigaction`/`signal`,
//! interposed only to keep SIGTERM/SIGINT's report invisible).

// A cdylib: its docs are for its maintainers (`cargo doc
// --document-private-items`), so module docs may link private items.
#![allow(rustdoc::private_intra_doc_links)]

pub mod config;
pub mod dispatch;
pub mod epoll;
pub mod fd_sleep;
pub mod fds;
pub mod fdwait;
pub mod peer;
pub mod poll;
pub mod pollers;
pub mod pollset;
pub mod real;
pub mod select;
pub mod sends;
pub mod slice;
pub mod sockets;
pub mod sys;
pub mod uring;
pub mod verbs;
pub mod wait;

// Live counters (shared memory), the exit report, SIGTERM/SIGINT.
pub mod stats;

/// Run a hook body; if it panics (it should not), make the plain call
/// instead of unwinding into C.
pub fn guarded<R>(body: impl FnOnce() -> R, plain: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => plain(),
    }
}

/// Write one line to stderr with a raw syscall (no stdio lock, no hooks).
pub fn diag(line: &str) {
    let mut buf = [0u8; 512];
    let prefix = b"fastwake-preload: ";
    let body = line.as_bytes();
    let n = (prefix.len() + body.len()).min(buf.len() - 1);
    buf[..prefix.len()].copy_from_slice(prefix);
    buf[prefix.len()..n].copy_from_slice(&body[..n - prefix.len()]);
    buf[n] = b'\n';
    // SAFETY: fd 2 is only borrowed for the duration of the write; if the
    // host closed it the write fails harmlessly with EBADF.
    let stderr = unsafe { rustix::fd::BorrowedFd::borrow_raw(2) };
    let _ = rustix::io::write(stderr, &buf[..=n]);
}

/// Runs when the loader maps the library, before the host's `main`: read
/// the configuration, resolve the real functions, publish.
extern "C" fn init() {
    // Nothing here may unwind into the loader.
    let _ = std::panic::catch_unwind(|| {
        let cfg = config::parse(|k| std::env::var(k).ok());
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        for line in config::unknown_variables(names.iter().map(String::as_str)) {
            diag(&line);
        }
        // Resolve every forwarded symbol now, while dlsym is safe to call.
        hooks_resolve();
        match cfg {
            Ok(c) => {
                if c.mode == Some(fastwake::WaitMode::Dispatch) {
                    dispatch::start();
                }
                config::publish(&c);
                let seg = stats::start(&c);
                if c.verbose {
                    diag(&format!(
                        "fastwake {} in {}: mode={} budget={}us cpu_cap={} pollers={} pid={}{}",
                        env!("CARGO_PKG_VERSION"),
                        std::env::args_os()
                            .next()
                            .map_or("?".into(), |a| a.to_string_lossy().into_owned()),
                        c.mode.map_or("off".to_string(), |m| m.to_string()),
                        c.budget.as_micros(),
                        c.cpu_cap,
                        if c.pollers { "sleep" } else { "off" },
                        std::process::id(),
                        match &seg {
                            Ok(Some(path)) => format!(" stats={path}"),
                            _ => String::new(),
                        }
                    ));
                    if let Err(line) = &seg {
                        diag(line);
                    }
                }
            }
            Err(line) => diag(&line),
        }
    });
}

/// Resolve the real functions of every hook module.
fn hooks_resolve() {
    epoll::resolve();
    poll::resolve();
    select::resolve();
    sockets::resolve();
    pollers::init();
    sends::resolve();
    uring::resolve();
    stats::leave::resolve();
    verbs::init();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// Runs at exit (and at dlclose): the counters, when verbose; the
/// shared-memory segment goes.
extern "C" fn fini() {
    let _ = std::panic::catch_unwind(stats::exit);
}

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = fini;
