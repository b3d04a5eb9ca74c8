//! The next definitions of the symbols the shim interposes, found with
//! `dlsym(RTLD_NEXT, ..)` and cached.
//!
//! All are resolved once in the library constructor; a hook called before
//! that (from another library's constructor) resolves lazily. `dlsym` is not
//! async-signal-safe, but after the constructor no hook path calls it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// One cached symbol.
pub struct Sym {
    name: &'static std::ffi::CStr,
    addr: AtomicUsize,
}

impl Sym {
    pub const fn new(name: &'static std::ffi::CStr) -> Sym {
        Sym {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The address, or 0 if no later object defines the symbol.
    pub fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: RTLD_NEXT with a NUL-terminated name is dlsym's documented
        // use; the result is only an address we store.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        self.addr.store(p, Ordering::Relaxed);
        p
    }
}
