//! The ODP guard: `FASTWAKE_ODP=keep|prefetch|pin` for programs
//! that register memory with `IBV_ACCESS_ON_DEMAND`, on contexts the shim
//! wraps.
//!
//! - `keep` (default): registrations pass through; ODP ones are remembered
//!   (by lkey/rkey) so the stall monitor can say a late work request
//!   touched ODP memory.
//! - `prefetch`: the registration passes through; right after it the shim
//!   asks the NIC to fault the whole buffer in (`ibv_advise_mr`, prefetch
//!   advice, flush flag: the call returns once it is done), so the first
//!   work request does not meet a page fault.
//! - `pin`: the buffer is registered without `ON_DEMAND` (pinned), when the
//!   memlock limit allows (or the process has CAP_IPC_LOCK); one line and
//!   `keep` when it does not, or for implicit ODP (the whole address space
//!   cannot be pinned). Since the program then never touches ODP memory,
//!   the context's `ibv_query_device_ex` also reports the ODP capabilities
//!   (support, RC/UD send/recv/read/write/atomic): a program that checks
//!   for ODP before asking for it (`ibv_rc_pingpong -o`) runs on a device
//!   without ODP.

use super::real::VSym;
use fastwake::source::verbs::odp::OdpPolicy;
use fastwake_verbs_sys::odp::*;
use fastwake_verbs_sys::{
    IBV_ACCESS_LOCAL_WRITE, ibv_context, ibv_mr, ibv_pd, ibv_send_wr, ibv_sge,
};
use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};

/// RC/UC caps reported under pin: send, recv, write, read, atomic, SRQ.
const ODP_RC_CAPS: u32 = IBV_ODP_SUPPORT_SEND
    | IBV_ODP_SUPPORT_RECV
    | IBV_ODP_SUPPORT_WRITE
    | IBV_ODP_SUPPORT_READ
    | IBV_ODP_SUPPORT_ATOMIC
    | IBV_ODP_SUPPORT_SRQ_RECV;
const ODP_UD_CAPS: u32 = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;

const KEEP: u8 = 0;
const PREFETCH: u8 = 1;
const PIN: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(KEEP);

/// Parse `FASTWAKE_ODP` (the library's [`OdpPolicy`]). `Err`: one line;
/// the guard keeps.
pub fn parse(v: Option<&str>) -> Result<u8, String> {
    Ok(match v.unwrap_or("").parse::<OdpPolicy>()? {
        OdpPolicy::Keep => KEEP,
        OdpPolicy::Prefetch => PREFETCH,
        OdpPolicy::Pin => PIN,
    })
}

pub fn init() {
    for s in [&REG_MR, &REG_MR_IOVA, &REG_MR_IOVA2, &DEREG_MR] {
        s.get();
    }
    match parse(std::env::var("FASTWAKE_ODP").ok().as_deref()) {
        Ok(m) => MODE.store(m, Ordering::Relaxed),
        Err(line) => crate::diag(&line),
    }
}

static REG_MR: VSym = VSym::new(c"ibv_reg_mr", Some(c"IBVERBS_1.1"));
static REG_MR_IOVA: VSym = VSym::new(c"ibv_reg_mr_iova", Some(c"IBVERBS_1.7"));
static REG_MR_IOVA2: VSym = VSym::new(c"ibv_reg_mr_iova2", Some(c"IBVERBS_1.8"));
static DEREG_MR: VSym = VSym::new(c"ibv_dereg_mr", Some(c"IBVERBS_1.1"));
type RegMrFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type RegMrIovaFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
type RegMrIova2Fn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
type DeregMrFn = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut u8, usize) -> c_int;

// ---- ODP registrations, for the monitor -------------------------------------

const MAX_MR: usize = 64;
struct OdpMr {
    used: AtomicBool,
    lkey: AtomicU32,
    rkey: AtomicU32,
}
static MRS: [OdpMr; MAX_MR] = [const {
    OdpMr {
        used: AtomicBool::new(false),
        lkey: AtomicU32::new(0),
        rkey: AtomicU32::new(0),
    }
}; MAX_MR];
/// ODP MRs remembered: lets `touches` return at once while there are none.
static ODP_MRS: AtomicU32 = AtomicU32::new(0);

fn remember(mr: &ibv_mr) {
    if let Some(s) = MRS.iter().find(|s| {
        s.used
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) {
        s.lkey.store(mr.lkey, Ordering::Relaxed);
        s.rkey.store(mr.rkey, Ordering::Relaxed);
        ODP_MRS.fetch_add(1, Ordering::Release);
    }
}

fn forget(mr: &ibv_mr) {
    if let Some(s) = MRS.iter().find(|s| {
        s.used.load(Ordering::Acquire)
            && s.lkey.load(Ordering::Relaxed) == mr.lkey
            && s.rkey.load(Ordering::Relaxed) == mr.rkey
    }) {
        s.used.store(false, Ordering::Release);
        ODP_MRS.fetch_sub(1, Ordering::Relaxed);
    }
}

fn is_odp_key(lkey: Option<u32>, rkey: Option<u32>) -> bool {
    MRS.iter().any(|s| {
        s.used.load(Ordering::Acquire)
            && (lkey == Some(s.lkey.load(Ordering::Relaxed))
                || rkey == Some(s.rkey.load(Ordering::Relaxed)))
    })
}

/// Does this work request touch memory registered ON_DEMAND (one of its
/// local buffers, or for RDMA/atomic the remote key, when the remote MR is
/// in this process)? Free when no ODP MR exists (the common case).
#[inline]
pub fn touches(r: &ibv_send_wr) -> bool {
    if ODP_MRS.load(Ordering::Relaxed) == 0 {
        return false;
    }
    touches_slow(r)
}

#[cold]
fn touches_slow(r: &ibv_send_wr) -> bool {
    let rkey = match r.opcode {
        0 | 1 | 4 => Some(r._unions[1] as u32), // wr.rdma.rkey
        5 | 6 => Some(r._unions[3] as u32),     // wr.atomic.rkey
        _ => None,
    };
    if is_odp_key(None, rkey) {
        return true;
    }
    (0..r.num_sge.max(0) as usize).any(|i| {
        // SAFETY: sg_list has num_sge entries (the caller's valid WR).
        let sge = unsafe { &*r.sg_list.add(i) };
        is_odp_key(Some(sge.lkey), None)
    })
}

// ---- the registration hooks -------------------------------------------------

thread_local! {
    /// Inside one of our registration hooks: libibverbs' ibv_reg_mr calls
    /// ibv_reg_mr_iova2 through the PLT, which lands here again.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Contexts the shim wrapped get the guard (same rule as every verbs hook).
fn guarded_pd(pd: *mut ibv_pd) -> bool {
    if pd.is_null() {
        return false;
    }
    // SAFETY: a live PD begins with its context pointer (struct ibv_pd).
    let ctx = unsafe { *(pd as *const *mut ibv_context) };
    super::table::ctx_slot(ctx).is_some()
}

/// Pinned bytes of this process (`VmPin` of /proc/self/status, kB).
fn pinned_bytes() -> u64 {
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        "/proc/self/status",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(&fd, &mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let text = String::from_utf8_lossy(&buf[..n]);
    text.lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn has_ipc_lock() -> bool {
    // CapEff of /proc/self/status, bit 14 (CAP_IPC_LOCK).
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        "/proc/self/status",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut buf = vec![0u8; 4096];
    let n = rustix::io::read(&fd, &mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|c| c & (1 << 14) != 0)
}

/// May `len` more bytes be pinned? `Err`: why not, for the one line.
pub fn may_pin(
    len: usize,
    soft_limit: Option<u64>,
    pinned: u64,
    ipc_lock: bool,
) -> Result<(), String> {
    match soft_limit {
        None => Ok(()),
        Some(_) if ipc_lock => Ok(()),
        Some(l) if pinned.saturating_add(len as u64) <= l => Ok(()),
        Some(l) => Err(format!(
            "memlock limit {l} bytes < {pinned} pinned + {len} asked (raise `ulimit -l`)"
        )),
    }
}

fn memlock_soft() -> Option<u64> {
    let r = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    r.current
}

static SAID_PIN: AtomicBool = AtomicBool::new(false);
static SAID_FAIL: AtomicBool = AtomicBool::new(false);

fn once(flag: &AtomicBool, line: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        crate::diag(line);
    }
}

/// The common body of the three registration hooks: `reg(access)` makes
/// the real call with the given access flags.
fn register(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_uint,
    reg: impl Fn(c_uint) -> *mut ibv_mr,
) -> *mut ibv_mr {
    if access & IBV_ACCESS_ON_DEMAND == 0 || INSIDE.with(Cell::get) || !guarded_pd(pd) {
        return reg(access);
    }
    INSIDE.with(|c| c.set(true));
    let mr = crate::guarded(|| register_odp(pd, addr, len, access, &reg), || reg(access));
    INSIDE.with(|c| c.set(false));
    mr
}

fn register_odp(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_uint,
    reg: &impl Fn(c_uint) -> *mut ibv_mr,
) -> *mut ibv_mr {
    let mode = MODE.load(Ordering::Relaxed);
    if mode == PIN {
        let implicit = addr.is_null() && len == usize::MAX;
        let allowed = if implicit {
            Err("implicit ODP (the whole address space) cannot be pinned".to_string())
        } else {
            may_pin(len, memlock_soft(), pinned_bytes(), has_ipc_lock())
        };
        match allowed {
            Ok(()) => {
                let mr = reg(access & !IBV_ACCESS_ON_DEMAND);
                if !mr.is_null() {
                    crate::stats::add(|s| &s.stalls.odp_pinned, 1);
                    once(
                        &SAID_PIN,
                        "FASTWAKE_ODP=pin: ODP registrations are pinned (registered without ON_DEMAND)",
                    );
                    return mr;
                }
                let e = std::io::Error::last_os_error();
                once(
                    &SAID_FAIL,
                    &format!("FASTWAKE_ODP=pin: the pinned registration failed ({e}); keeping ODP"),
                );
            }
            Err(why) => once(&SAID_FAIL, &format!("FASTWAKE_ODP=pin: {why}; keeping ODP")),
        }
    }
    let mr = reg(access);
    if mr.is_null() {
        return mr;
    }
    // SAFETY: a live MR the real call returned.
    let m = unsafe { &*mr };
    remember(m);
    if mode == PREFETCH && prefetch(pd, addr, len, access, m.lkey) {
        crate::stats::add(|s| &s.stalls.odp_prefetched, 1);
    } else {
        crate::stats::add(|s| &s.stalls.odp_kept, 1);
    }
    mr
}

/// The verbs_context slot `off` bytes before a context the shim wrapped.
fn ctx_op(ctx: *mut ibv_context, off: usize) -> Option<*mut usize> {
    // SAFETY: a context the shim wrapped looks like rdma-core's
    // (`understood`): a verbs_context with `sz` before it.
    unsafe { ctx_slot(ctx, off) }
}

static SAID_PREFETCH: AtomicBool = AtomicBool::new(false);

fn prefetch(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_uint, lkey: u32) -> bool {
    // SAFETY: a live PD begins with its context pointer.
    let ctx = unsafe { *(pd as *const *mut ibv_context) };
    // SAFETY: a slot inside the verbs_context (ctx_op checked sz).
    let f = ctx_op(ctx, VERBS_CTX_ADVISE_MR)
        .map(|p| unsafe { *p })
        .unwrap_or(0);
    if f == 0 || addr.is_null() {
        once(
            &SAID_PREFETCH,
            "FASTWAKE_ODP=prefetch: the provider has no ibv_advise_mr; keeping ODP",
        );
        return false;
    }
    // SAFETY: the provider's advise_mr, of verbs.h's signature.
    let f = unsafe { std::mem::transmute::<usize, AdviseMrFn>(f) };
    let advice = if access & IBV_ACCESS_LOCAL_WRITE as c_uint != 0 {
        IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
    } else {
        IBV_ADVISE_MR_ADVICE_PREFETCH
    };
    // One SGE holds at most 2^31 bytes here; larger buffers take several.
    const CHUNK: usize = 1 << 31;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(CHUNK);
        let mut sge = ibv_sge {
            addr: addr as u64 + off as u64,
            length: n as u32,
            lkey,
        };
        // SAFETY: a live PD and MR; one valid SGE inside the MR.
        let rc = unsafe { f(pd, advice, IB_UVERBS_ADVISE_MR_FLAG_FLUSH, &mut sge, 1) };
        if rc != 0 {
            once(
                &SAID_PREFETCH,
                &format!(
                    "FASTWAKE_ODP=prefetch: ibv_advise_mr failed ({rc}); the buffer faults in on first use"
                ),
            );
            return false;
        }
        off += n;
    }
    true
}

/// # Safety
/// libibverbs' contract for `ibv_reg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    let a = REG_MR.get();
    if a == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: the symbol of this name and version, verbs.h's signature.
    let real = unsafe { std::mem::transmute::<usize, RegMrFn>(a) };
    // SAFETY: the caller's arguments, access flags possibly without ON_DEMAND.
    register(pd, addr, length, access as c_uint, |acc| unsafe {
        real(pd, addr, length, acc as c_int)
    })
}

/// # Safety
/// libibverbs' contract for `ibv_reg_mr_iova`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let a = REG_MR_IOVA.get();
    if a == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as in ibv_reg_mr.
    let real = unsafe { std::mem::transmute::<usize, RegMrIovaFn>(a) };
    // SAFETY: as in ibv_reg_mr.
    register(pd, addr, length, access as c_uint, |acc| unsafe {
        real(pd, addr, length, iova, acc as c_int)
    })
}

/// # Safety
/// libibverbs' contract for `ibv_reg_mr_iova2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let a = REG_MR_IOVA2.get();
    if a == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as in ibv_reg_mr.
    let real = unsafe { std::mem::transmute::<usize, RegMrIova2Fn>(a) };
    // SAFETY: as in ibv_reg_mr.
    register(pd, addr, length, access, |acc| unsafe {
        real(pd, addr, length, iova, acc)
    })
}

/// # Safety
/// libibverbs' contract for `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let a = DEREG_MR.get();
    if a == 0 {
        return libc::ENOSYS;
    }
    if !mr.is_null() && ODP_MRS.load(Ordering::Relaxed) != 0 {
        // SAFETY: a live MR (caller's contract).
        forget(unsafe { &*mr });
    }
    // SAFETY: the symbol of this name and version, forwarded unchanged.
    unsafe { std::mem::transmute::<usize, DeregMrFn>(a)(mr) }
}

// ---- ibv_query_device_ex under pin ------------------------------------------

/// The provider's query_device_ex per wrapped context (key: context).
static QDX: [(AtomicUsize, AtomicUsize); super::table::MAX_CTX] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; super::table::MAX_CTX];

/// Under `pin`, wrap the context's `query_device_ex` (see the module doc).
pub fn wrap(ctx: *mut ibv_context) {
    if MODE.load(Ordering::Relaxed) != PIN {
        return;
    }
    let Some(slot) = ctx_op(ctx, VERBS_CTX_QUERY_DEVICE_EX) else {
        return;
    };
    // SAFETY: the slot inside the verbs_context (ctx_op checked sz).
    let real = unsafe { *slot };
    if real == 0 {
        return;
    }
    let Some(s) = QDX.iter().find(|s| {
        s.0.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return;
    };
    s.1.store(real, Ordering::Relaxed);
    s.0.store(ctx as usize, Ordering::Release);
    // SAFETY: replacing the op before the program has the context.
    unsafe { *slot = query_device_ex as QueryDeviceExFn as usize };
}

pub fn unwrap(ctx: *mut ibv_context) {
    if let Some(s) = QDX
        .iter()
        .find(|s| s.0.load(Ordering::Acquire) == ctx as usize)
    {
        s.0.store(0, Ordering::Release);
    }
}

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const c_void,
    attr: *mut u8,
    attr_size: usize,
) -> c_int {
    let Some(s) = QDX
        .iter()
        .find(|s| s.0.load(Ordering::Acquire) == ctx as usize)
    else {
        return libc::EOPNOTSUPP;
    };
    // SAFETY: the provider's query_device_ex, saved by `wrap`.
    let real =
        unsafe { std::mem::transmute::<usize, QueryDeviceExFn>(s.1.load(Ordering::Relaxed)) };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { real(ctx, input, attr, attr_size) };
    if rc == 0 && !attr.is_null() && attr_size >= DEVICE_ATTR_EX_ODP_CAPS + 20 {
        // SAFETY: attr has attr_size bytes; odp_caps lies inside.
        unsafe {
            let g = attr.add(DEVICE_ATTR_EX_ODP_CAPS) as *mut u64;
            g.write_unaligned(g.read_unaligned() | IBV_ODP_SUPPORT);
            let t = attr.add(DEVICE_ATTR_EX_ODP_CAPS + 8) as *mut u32;
            t.write_unaligned(t.read_unaligned() | ODP_RC_CAPS);
            t.add(1)
                .write_unaligned(t.add(1).read_unaligned() | ODP_RC_CAPS);
            t.add(2)
                .write_unaligned(t.add(2).read_unaligned() | ODP_UD_CAPS);
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odp_variable() {
        assert_eq!(parse(None), Ok(KEEP));
        assert_eq!(parse(Some("pin")), Ok(PIN));
        assert_eq!(parse(Some("prefetch")), Ok(PREFETCH));
        let e = parse(Some("bogus")).unwrap_err();
        assert!(e.contains("FASTWAKE_ODP='bogus'") && e.contains("keeping") && !e.contains('\n'));
    }

    #[test]
    fn memlock_rule() {
        assert!(may_pin(1 << 30, None, 0, false).is_ok(), "unlimited");
        assert!(may_pin(1 << 20, Some(8 << 20), 4 << 20, false).is_ok());
        let e = may_pin(8 << 20, Some(8 << 20), 4 << 20, false).unwrap_err();
        assert!(e.contains("memlock limit"), "{e}");
        assert!(
            may_pin(8 << 20, Some(8 << 20), 4 << 20, true).is_ok(),
            "CAP_IPC_LOCK"
        );
    }

    #[test]
    fn odp_keys_are_remembered_and_forgotten() {
        let mr = ibv_mr {
            context: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            addr: std::ptr::null_mut(),
            length: 0,
            handle: 0,
            lkey: 0x1234,
            rkey: 0x5678,
        };
        remember(&mr);
        assert!(is_odp_key(Some(0x1234), None));
        assert!(is_odp_key(None, Some(0x5678)));
        assert!(!is_odp_key(Some(0x5678), None));
        forget(&mr);
        assert!(!is_odp_key(Some(0x1234), None));
    }
}
