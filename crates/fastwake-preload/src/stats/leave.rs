//! `_exit` and `_Exit`: the ways out that skip the library's destructor.
//! Programs leave through them more often than one would think (dash's
//! `exit` builtin, a forked child's exit, servers that skip `atexit` work),
//! and each then left its segment behind and printed no exit report. The
//! hooks do what the destructor does ([`super::exit`]: the report when
//! verbose, the segment unlinked), then call the real function.
//!
//! Only in the process that owns the segment: a `vfork` child shares its
//! parent's memory and calls `_exit` when its exec fails; it must neither
//! report the parent's counters nor unlink the parent's file (the pid
//! check in [`super::owned`]). glibc's own `posix_spawn` child exits through
//! an internal alias and never reaches these hooks.

use crate::real::Sym;
use std::ffi::c_int;

static EXIT: Sym = Sym::new(c"_exit");
static EXIT_CAP: Sym = Sym::new(c"_Exit");

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    EXIT.get();
    EXIT_CAP.get();
}

fn leave(real: &Sym, status: c_int) -> ! {
    if super::owned() {
        let _ = std::panic::catch_unwind(super::exit);
    }
    let a = real.get();
    if a != 0 {
        // SAFETY: `a` is dlsym's address for this very symbol, whose
        // signature is `void (int)` and which does not return.
        let f: extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(a) };
        f(status)
    }
    // SAFETY: exit_group ends the process; it has no preconditions.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable!("exit_group returned")
}

/// # Safety
/// The libc contract of `_exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    leave(&EXIT, status)
}

/// # Safety
/// The libc contract of `_Exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    leave(&EXIT_CAP, status)
}
