//! `libfastwake_preload.so`: fastwake's wait modes for unmodified programs.
//!
//! Loaded with `LD_PRELOAD` (usually through `fastwake run`), the library
//! interposes the calls a program blocks in and applies the mode chosen by
//! the `FASTWAKE_*` environment variables (docs/preload.md).
//!
//! Rules every module here follows, because a shim must never break its
//! host:
//! - no panic crosses the FFI boundary: hook bodies are plain arithmetic and
//!   syscalls, and any path that could fail falls back to the real call;
//! - the real function is found with `dlsym(RTLD_NEXT)` ([`real`]);
//! - the shim's own needs use raw syscalls (rustix, `libc::syscall`), never
//!   a libc function it hooks, so it cannot recurse into itself;
//! - no locks and no allocation on hook paths: state is per-thread cells or
//!   global atomics, which stay consistent across `fork` and in signal
//!   handlers (a hook entered from a signal handler passes through).
//!
//! Modules: [`config`] (environment), [`dispatch`] (dispatch mode: waits
//! handed off by a per-CPU dispatcher), [`real`] (the next definitions of the
//! hooked symbols), [`wait`] (the spinning fd-hook wait; every decision is
//! the library's [`fastwake::wait::Governor`]'s), [`peer`] (which socket
//! tells the peer's CPU), and one
//! module per family of hooked calls: [`epoll`], [`poll`], [`select`],
//! [`verbs`] (libibverbs: completion channels and the context's CQ ops).

pub mod config;
pub mod dispatch;
pub mod epoll;
pub mod fds;
pub mod peer;
pub mod poll;
pub mod real;
pub mod select;
pub mod verbs;
pub mod wait;

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
        // Resolve every forwarded symbol now, while dlsym is safe to call.
        hooks_resolve();
        match cfg {
            Ok(c) => {
                if c.mode == Some(fastwake::WaitMode::Dispatch) {
                    dispatch::start();
                }
                config::publish(&c);
                if c.verbose {
                    diag(&format!(
                        "mode={} budget={}us cpu_cap={} pid={}",
                        c.mode.map_or("off".to_string(), |m| m.to_string()),
                        c.budget.as_micros(),
                        c.cpu_cap,
                        std::process::id()
                    ));
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
    verbs::init();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// Runs at exit (and at dlclose): the counters, when verbose.
extern "C" fn fini() {
    if config::verbose() {
        let _ = std::panic::catch_unwind(wait::report);
        let _ = std::panic::catch_unwind(dispatch::report);
        let _ = std::panic::catch_unwind(verbs::report);
    }
}

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: extern "C" fn() = fini;
