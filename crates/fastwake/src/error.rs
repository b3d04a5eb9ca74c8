//! The error type. Like Demikernel's `Fail`, every error carries an errno so
//! the C ABI can return it unchanged, plus a one-line human cause.

use std::fmt;

/// An error from fastwake: an errno and a short cause.
///
/// `Display` prints exactly one line, so a CLI or a preload shim can show it
/// to a user as-is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    errno: i32,
    cause: String,
}

/// `Result` with [`Fail`].
pub type Result<T> = std::result::Result<T, Fail>;

impl Fail {
    /// A failure with an explicit errno and cause.
    pub fn new(errno: i32, cause: impl Into<String>) -> Self {
        Fail {
            errno,
            cause: cause.into(),
        }
    }

    /// A failed system call: `op` names what we were doing.
    pub fn os(op: &str, err: rustix::io::Errno) -> Self {
        Fail::new(err.raw_os_error(), format!("{op}: {err}"))
    }

    /// Bad argument or configuration (`EINVAL`).
    pub fn invalid(cause: impl Into<String>) -> Self {
        Fail::new(libc::EINVAL, cause)
    }

    /// The other end is gone and nothing is left to consume (`EPIPE`).
    pub fn closed(cause: impl Into<String>) -> Self {
        Fail::new(libc::EPIPE, cause)
    }

    /// A deadline passed with nothing ready (`ETIMEDOUT`).
    pub fn timed_out() -> Self {
        Fail::new(libc::ETIMEDOUT, "timed out")
    }

    /// The host lacks what this needs (`ENOTSUP`).
    pub fn unsupported(cause: impl Into<String>) -> Self {
        Fail::new(libc::ENOTSUP, cause)
    }

    /// The errno, for C callers.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The one-line cause.
    pub fn cause(&self) -> &str {
        &self.cause
    }

    /// True for a timeout, which callers often treat as "nothing yet".
    pub fn is_timeout(&self) -> bool {
        self.errno == libc::ETIMEDOUT
    }

    /// True when the peer closed the source.
    pub fn is_closed(&self) -> bool {
        self.errno == libc::EPIPE
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Causes come from many places; fold any newline so the promise of
        // one line holds.
        write!(f, "{}", self.cause.replace('\n', " "))
    }
}

impl std::error::Error for Fail {}

impl From<rustix::io::Errno> for Fail {
    fn from(e: rustix::io::Errno) -> Self {
        Fail::new(e.raw_os_error(), e.to_string())
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail::new(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
    }
}
