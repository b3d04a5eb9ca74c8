//! The shared-memory layout of the preload shim's live counters: what
//! `libfastwake_preload.so` writes and `fastwake stats` reads (one
//! definition, so writer and reader cannot disagree).
//!
//! Each shimmed process (mode not `off`) maps one file,
//! `<dir>/fastwake-<pid>`, with `<dir>` the first of `/dev/shm`,
//! `$XDG_RUNTIME_DIR`, `/tmp` that is a directory ([`dirs`]). The file
//! is created mode 0600 (only its user can read it) and holds one
//! [`Segment`]: a [`Header`] written once at creation, then blocks of
//! `AtomicU64` counters the hooks add to with relaxed atomics. The writer
//! stores [`MAGIC`] last (release), so a reader that sees the magic sees a
//! complete header. A reader checks the magic, [`VERSION`] and the size
//! before it trusts anything else, and maps the file read-only.
//!
//! Any change to the layout bumps [`VERSION`]; fields are only ever added
//! at the end of a block's reserved room (so `calls` and `pass` keep their
//! indices: [`Call`] and [`Pass`] are the indices).
//!
//! No allocation and no lock here: the shim uses these types from its hook
//! paths and from a signal handler.

use std::sync::atomic::{AtomicU64, Ordering};

/// `FWSTATS\x01` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FWSTATS\x01");
/// Layout version: bumped on any change of [`Segment`].
pub const VERSION: u32 = 3;
/// File name prefix: `fastwake-<pid>`.
pub const PREFIX: &str = "fastwake-";
/// Room for call kinds ([`Call`]) and pass-through reasons ([`Pass`]).
pub const CALL_SLOTS: usize = 16;
pub const PASS_SLOTS: usize = 8;

/// Written once when the segment is created, then read-only.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`], stored last (release).
    pub magic: AtomicU64,
    pub version: u32,
    /// `size_of::<Segment>()` of the writer.
    pub size: u32,
    pub pid: u32,
    /// Budget (ns) and CPU cap (parts per million) in force.
    pub cpu_cap_ppm: u32,
    pub budget_ns: u64,
    /// CLOCK_REALTIME at creation (ns since the epoch): uptime.
    pub start_unix_ns: u64,
    /// The process's start time in clock ticks since boot (field 22 of
    /// `/proc/PID/stat`): tells a live process from a later one that got
    /// the same pid.
    pub start_ticks: u64,
    /// NUL-padded UTF-8: the mode (`hybrid`, `adaptive`, ...), the fastwake
    /// version, the command line (arguments joined by spaces, truncated).
    pub mode: [u8; 48],
    pub fastwake: [u8; 16],
    pub command: [u8; 256],
}

/// The fd-hook wait engine (crate `fastwake-preload`, `wait.rs`).
#[repr(C)]
#[derive(Default)]
pub struct Engine {
    /// Waits that went through the engine (looked, maybe spun, maybe blocked).
    pub waits: AtomicU64,
    pub spins: AtomicU64,
    /// Spins that ended with something ready (no block).
    pub spin_hits: AtomicU64,
    /// CPU time spent spinning (ns of wall time while spinning).
    pub spin_ns: AtomicU64,
    /// Waits that did not spin, and why.
    pub same_cpu: AtomicU64,
    pub capped: AtomicU64,
    pub contended: AtomicU64,
    pub siblings: AtomicU64,
    /// Waits that ended in the real blocking call.
    pub blocked: AtomicU64,
    /// Adaptive waits planned as pre-wakes (a timed sleep on the fds,
    /// then a spin), and those caught while spinning after the timer.
    /// Taken from the reserved slots: the layout is unchanged.
    pub prewakes: AtomicU64,
    pub prewake_caught: AtomicU64,
    pub reserved: [AtomicU64; 5],
}

/// Dispatch mode (`dispatch.rs`).
#[repr(C)]
#[derive(Default)]
pub struct Dispatch {
    pub waits: AtomicU64,
    /// Hand-offs and relays from a dispatcher.
    pub handoffs: AtomicU64,
    /// Waits the library served in interrupt mode instead (no dispatcher,
    /// or it was idle or starved).
    pub fallbacks: AtomicU64,
    pub reserved: [AtomicU64; 5],
}

/// The libibverbs hooks (`verbs/`).
#[repr(C)]
#[derive(Default)]
pub struct Verbs {
    pub ctx_wrapped: AtomicU64,
    pub ctx_passed: AtomicU64,
    pub cqs: AtomicU64,
    pub waits: AtomicU64,
    pub synthetic: AtomicU64,
    pub real: AtomicU64,
    pub swallowed: AtomicU64,
    pub blocked: AtomicU64,
    pub arms_skipped: AtomicU64,
    pub stash_delivered: AtomicU64,
    pub acks_absorbed: AtomicU64,
    /// Completion channels seen created (channels in fd sets).
    pub channels: AtomicU64,
    /// fd-set looks that reported a channel fd ready from a CQE (no
    /// kernel event yet).
    pub fdset_ready: AtomicU64,
    /// Owed real events an fd-set look read and acked itself, so they did
    /// not wake the program.
    pub fdset_absorbed: AtomicU64,
    /// Extended CQs created and passed through (`verbs/cq_ex.rs` says
    /// which: fields beyond a `struct ibv_wc`'s, no channel, a full table).
    pub cqs_ex: AtomicU64,
    /// Extended CQs created and served (peeked, stashed CQEs shown to
    /// `start_poll`; also counted in `cqs`).
    pub cqs_ex_served: AtomicU64,
}

/// The verbs completion-latency monitor and the ODP guard
/// (`verbs/monitor.rs`, `verbs/odp.rs`).
#[repr(C)]
#[derive(Default)]
pub struct Stalls {
    /// Send-queue completions matched to their post.
    pub completions: AtomicU64,
    /// Completions later than the threshold while the program looked.
    pub stalls: AtomicU64,
    /// Episodes (runs of stalls on one QP); each gets one stderr line...
    pub episodes: AtomicU64,
    /// ...except these, over the line rate limit.
    pub unreported: AtomicU64,
    /// Late completions the program had not looked for: not stalls.
    pub unobserved: AtomicU64,
    /// The longest matched completion (ns).
    pub max_ns: AtomicU64,
    /// Posts not tracked (QP table full, or the QP's ring overflowed).
    pub untracked: AtomicU64,
    /// ODP registrations left as asked, given a prefetch, or pinned.
    pub odp_kept: AtomicU64,
    pub odp_prefetched: AtomicU64,
    pub odp_pinned: AtomicU64,
    pub reserved: [AtomicU64; 6],
}

/// Threads that busy-poll (`FASTWAKE_POLLERS=sleep`, the shim's
/// `pollers/`; the rule is [`crate::wait::idle`]).
#[repr(C)]
#[derive(Default)]
pub struct Pollers {
    /// Polls that came back empty (zero-timeout fd waits, `EAGAIN` from a
    /// non-blocking socket, an empty `ibv_poll_cq` or `start_poll`).
    pub empty_polls: AtomicU64,
    /// Empty polls that became a wait for the thread's polled set...
    pub sleeps: AtomicU64,
    /// ...ended by a completion of the set...
    pub woke_by_completion: AtomicU64,
    /// ...or by the bound.
    pub woke_by_bound: AtomicU64,
    /// Wall time of the runs of empty polls that ended in a sleep (ns):
    /// CPU the thread spent polling an idle set.
    pub polling_ns: AtomicU64,
    /// Wall time asleep in those waits (ns): CPU given back.
    pub sleep_ns: AtomicU64,
    /// Threads switched off by the hazard rule (progress after a sleep the
    /// bound ended, before any completion: it polls something unseen).
    pub off_hazard: AtomicU64,
    /// Sleeps not taken because the set held a source the shim cannot wait
    /// for (a CQ with the program's own channel, a CQ created before the
    /// shim, more sources than the set holds).
    pub unsleepable: AtomicU64,
    pub reserved: [AtomicU64; 8],
}

/// One hooked call kind: every call is counted exactly once, as served
/// (the mode's wait ran) or passed through (and why); seen = the sum.
#[repr(C)]
#[derive(Default)]
pub struct CallCounters {
    pub served: AtomicU64,
    pub passed: [AtomicU64; PASS_SLOTS],
}

/// The whole segment.
#[repr(C)]
pub struct Segment {
    pub header: Header,
    pub engine: Engine,
    pub dispatch: Dispatch,
    pub verbs: Verbs,
    pub calls: [CallCounters; CALL_SLOTS],
    pub stalls: Stalls,
    pub pollers: Pollers,
}

/// The hooked calls, as indices of [`Segment::calls`]. The socket calls
/// are reserved for the blocking socket-call hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Call {
    EpollWait = 0,
    EpollPwait = 1,
    Poll = 2,
    Select = 3,
    IbvGetCqEvent = 4,
    Recv = 5,
    Recvfrom = 6,
    Recvmsg = 7,
    Read = 8,
    Accept = 9,
    Accept4 = 10,
    Ppoll = 11,
    Pselect = 12,
    EpollPwait2 = 13,
    IoUringGetCqe = 14,
    IoUringWaitCqeTimeout = 15,
}

impl Call {
    pub const ALL: [Call; 16] = [
        Call::EpollWait,
        Call::EpollPwait,
        Call::Poll,
        Call::Select,
        Call::IbvGetCqEvent,
        Call::Recv,
        Call::Recvfrom,
        Call::Recvmsg,
        Call::Read,
        Call::Accept,
        Call::Accept4,
        Call::Ppoll,
        Call::Pselect,
        Call::EpollPwait2,
        Call::IoUringGetCqe,
        Call::IoUringWaitCqeTimeout,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Call::EpollWait => "epoll_wait",
            Call::EpollPwait => "epoll_pwait",
            Call::Poll => "poll",
            Call::Select => "select",
            Call::IbvGetCqEvent => "ibv_get_cq_event",
            Call::Recv => "recv",
            Call::Recvfrom => "recvfrom",
            Call::Recvmsg => "recvmsg",
            Call::Read => "read",
            Call::Accept => "accept",
            Call::Accept4 => "accept4",
            Call::Ppoll => "ppoll",
            Call::Pselect => "pselect",
            Call::EpollPwait2 => "epoll_pwait2",
            Call::IoUringGetCqe => "__io_uring_get_cqe",
            Call::IoUringWaitCqeTimeout => "io_uring_wait_cqe_timeout",
        }
    }
}

/// Why a call was passed through unchanged, as indices of
/// [`CallCounters::passed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Pass {
    /// `FASTWAKE_MODE=off` (or the configuration was bad).
    ModeOff = 0,
    /// `interrupt` mode: the kernel's own blocking wait is the mode.
    Interrupt = 1,
    /// A zero timeout: a look, never spun.
    ZeroTimeout = 2,
    /// A non-blocking fd or channel.
    NonBlocking = 3,
    /// Not a socket (the socket-call hooks).
    NotSocket = 4,
    /// The thread was already inside a hook (a signal handler's wait) or
    /// exiting.
    Busy = 5,
    /// Arguments the shim leaves to the real call (null, empty or too big
    /// a set, a bad timeout), or the hook's state was unavailable.
    Other = 6,
}

impl Pass {
    pub const ALL: [Pass; 7] = [
        Pass::ModeOff,
        Pass::Interrupt,
        Pass::ZeroTimeout,
        Pass::NonBlocking,
        Pass::NotSocket,
        Pass::Busy,
        Pass::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pass::ModeOff => "mode_off",
            Pass::Interrupt => "interrupt",
            Pass::ZeroTimeout => "zero_timeout",
            Pass::NonBlocking => "non_blocking",
            Pass::NotSocket => "not_socket",
            Pass::Busy => "busy",
            Pass::Other => "other",
        }
    }
}

impl Segment {
    /// A zeroed segment (no magic: not valid until [`Segment::init`]).
    pub const fn zeroed() -> Segment {
        // SAFETY: every field is an integer, an atomic integer or a byte
        // array, for which all-zero bytes are a valid value.
        unsafe { std::mem::zeroed() }
    }

    pub fn call(&self, c: Call) -> &CallCounters {
        &self.calls[c as usize]
    }

    /// Every counter (the blocks after the header), in layout order.
    pub fn counters(&self) -> &[AtomicU64] {
        let off = std::mem::offset_of!(Segment, engine);
        let n = (std::mem::size_of::<Segment>() - off) / 8;
        // SAFETY: from `engine` to its end, the repr(C) Segment holds only
        // AtomicU64s (blocks of them and arrays of blocks; all 8-aligned,
        // the header a multiple of 8 bytes: no padding), inside `self`.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Segment as *const u8)
                    .add(off)
                    .cast::<AtomicU64>(),
                n,
            )
        }
    }

    /// Zero every counter (a forked child's start).
    pub fn clear(&self) {
        for c in self.counters() {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Fill the header (magic last). `mode`, `command`: truncated to fit.
    #[allow(clippy::too_many_arguments)]
    pub fn init(
        &mut self,
        pid: u32,
        mode: &[u8],
        budget_ns: u64,
        cpu_cap_ppm: u32,
        start_unix_ns: u64,
        start_ticks: u64,
        command: &[u8],
    ) {
        let h = &mut self.header;
        h.version = VERSION;
        h.size = std::mem::size_of::<Segment>() as u32;
        h.pid = pid;
        h.budget_ns = budget_ns;
        h.cpu_cap_ppm = cpu_cap_ppm;
        h.start_unix_ns = start_unix_ns;
        h.start_ticks = start_ticks;
        copy_str(&mut h.mode, mode);
        copy_str(&mut h.fastwake, env!("CARGO_PKG_VERSION").as_bytes());
        copy_str(&mut h.command, command);
        h.magic.store(MAGIC, Ordering::Release);
    }
}

/// Copy `s` into `dst`, truncated, NUL-padded (the last byte stays NUL).
pub fn copy_str(dst: &mut [u8], s: &[u8]) {
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s[..n]);
    dst[n..].fill(0);
}

/// A NUL-padded field as text.
pub fn field_str(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// Where segments live, in order of preference: `/dev/shm`, then
/// `$XDG_RUNTIME_DIR`, then `/tmp` (the writer uses the first that is a
/// directory; a reader looks in all).
pub fn dirs() -> Vec<std::path::PathBuf> {
    let mut v = vec![std::path::PathBuf::from("/dev/shm")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        v.push(x.into());
    }
    v.push("/tmp".into());
    v
}

/// Field 22 (starttime, clock ticks since boot) of a `/proc/PID/stat`
/// text: the fields after the command name, which is in parentheses and
/// may contain anything but ends at the last `)`.
pub fn start_ticks(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&c| c == b')')?;
    // After ")": field 3 (state) is the first; starttime is field 22.
    let rest = &stat[close + 1..];
    let field = rest
        .split(|&c| c == b' ')
        .filter(|f| !f.is_empty())
        .nth(22 - 3)?;
    let mut n: u64 = 0;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        // Header 48 + 48 + 16 + 256; blocks of u64; a change here means
        // bumping VERSION.
        assert_eq!(std::mem::size_of::<Header>(), 368);
        assert_eq!(std::mem::size_of::<Engine>(), 16 * 8);
        assert_eq!(std::mem::size_of::<Dispatch>(), 8 * 8);
        assert_eq!(std::mem::size_of::<Verbs>(), 16 * 8);
        assert_eq!(std::mem::size_of::<CallCounters>(), 9 * 8);
        assert_eq!(std::mem::size_of::<Stalls>(), 16 * 8);
        assert_eq!(std::mem::size_of::<Pollers>(), 16 * 8);
        assert_eq!(
            std::mem::size_of::<Segment>(),
            368 + 128 + 64 + 128 + 16 * 72 + 128 + 128
        );
        assert!(Call::ALL.len() <= CALL_SLOTS && Pass::ALL.len() <= PASS_SLOTS);
        for (i, c) in Call::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        for (i, p) in Pass::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
        }
    }

    #[test]
    fn init_and_strings() {
        let mut s = Box::new(Segment::zeroed());
        s.init(42, b"hybrid", 50_000, 750_000, 1, 2, &[b'x'; 400]);
        assert_eq!(s.header.magic.load(Ordering::Acquire), MAGIC);
        assert_eq!(field_str(&s.header.mode), "hybrid");
        assert_eq!(field_str(&s.header.command).len(), 255);
        assert_eq!(field_str(&s.header.fastwake), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn proc_stat_start_time() {
        let stat =
            b"1234 (a) b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(start_ticks(stat), Some(98765));
        assert_eq!(start_ticks(b"garbage"), None);
    }
}
