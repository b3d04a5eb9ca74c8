//! The completion-latency monitor for unmodified programs: the
//! shim wraps `ops.post_send` of every context it understands, dates each
//! send-queue work request in [`fastwake::stall::Monitor`], and the wrapped
//! `poll_cq` matches the completions. A completion later than
//! `FASTWAKE_STALL_MS` (default 50; `off` disables) while the program was
//! looking is a stall: one stderr line per episode names QP, opcode, the
//! wait, the QP's retransmission attributes, the port counters that moved
//! and the likely cause; the counts go to `fastwake stats` and the exit
//! line.
//!
//! Data path (inline): a post costs one clock read, one QP-table lookup and
//! the QP's mutex around the provider's post; a poll that returns
//! completions, one clock read and a lookup per completion; an empty poll,
//! one coarse clock read and a store (the CQ's "last look"). Slow path (out
//! of line, once per episode): sysfs counters and formatting.

use super::odp;
use super::real::VSym;
use fastwake::preload_stats::Stalls;
use fastwake::stall::cause::{self, Facts, QpAttrs};
use fastwake::stall::ports;
use fastwake::stall::qp::Posted;
use fastwake::stall::{Monitor, Op, QpKey, Verdict};
use fastwake_verbs_sys::{
    PostSendFn, ibv_context, ibv_cq, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_send_wr, ibv_wc,
};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

static MON: Monitor = Monitor::new();
/// The threshold in ns; 0 = monitor off.
static THRESHOLD_NS: AtomicU64 = AtomicU64::new(0);

/// Wrapped contexts and their provider's post_send (same size as the
/// context table: a context is only monitored if the shim wrapped it).
struct CtxPost {
    ctx: AtomicUsize,
    post: AtomicUsize,
}
static POSTS: [CtxPost; super::table::MAX_CTX] = [const {
    CtxPost {
        ctx: AtomicUsize::new(0),
        post: AtomicUsize::new(0),
    }
}; super::table::MAX_CTX];

static QUERY_QP: VSym = VSym::new(c"ibv_query_qp", Some(c"IBVERBS_1.1"));
static DESTROY_QP: VSym = VSym::new(c"ibv_destroy_qp", Some(c"IBVERBS_1.1"));
type QueryQpFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
type DestroyQpFn = unsafe extern "C" fn(*mut ibv_qp) -> c_int;

/// Read `FASTWAKE_STALL_MS` (constructor).
pub fn init() {
    QUERY_QP.get();
    DESTROY_QP.get();
    let ms = match fastwake::stall::parse_threshold_ms(
        std::env::var("FASTWAKE_STALL_MS").ok().as_deref(),
    ) {
        Ok(ms) => ms,
        Err(line) => {
            crate::diag(&line);
            Some(fastwake::stall::DEFAULT_THRESHOLD_MS)
        }
    };
    THRESHOLD_NS.store(ms.unwrap_or(0) * 1_000_000, Ordering::Relaxed);
    crate::stats::on_exit(exit_report);
}

fn counters(f: impl FnOnce(&Stalls) -> &AtomicU64, n: u64) {
    crate::stats::add(|s| f(&s.stalls), n);
}

#[inline]
fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
fn coarse_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Start monitoring a context the shim wrapped: replace `ops.post_send`,
/// take the port counters' baseline.
pub(super) fn wrap(ctx: *mut ibv_context, dev: &str) {
    // Polling threads' progress (the hazard rule of `crate::pollers`) is
    // seen here too, so the wrapper is installed for either.
    if THRESHOLD_NS.load(Ordering::Relaxed) == 0 && !crate::config::pollers() {
        return;
    }
    // SAFETY: a live context the shim is wrapping (before the program sees
    // it); the provider filled its ops.
    let ops = unsafe { &mut (*ctx).ops };
    let Some(real) = ops.post_send else { return };
    let Some(slot) = POSTS.iter().find(|s| {
        s.ctx
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return;
    };
    slot.post.store(real as usize, Ordering::Relaxed);
    slot.ctx.store(ctx as usize, Ordering::Release);
    ports::baseline(ctx as usize, dev);
    ops.post_send = Some(post_send);
}

/// Forget a context (closed).
pub fn unwrap(ctx: *mut ibv_context) {
    if let Some(s) = POSTS
        .iter()
        .find(|s| s.ctx.load(Ordering::Acquire) == ctx as usize)
    {
        s.ctx.store(0, Ordering::Release);
    }
    ports::forget(ctx as usize);
}

fn real_post(ctx: *mut ibv_context) -> Option<PostSendFn> {
    let s = POSTS
        .iter()
        .find(|s| s.ctx.load(Ordering::Acquire) == ctx as usize)?;
    let p = s.post.load(Ordering::Relaxed);
    // SAFETY: copied from the provider's ops.post_send of this context (a
    // non-null function pointer of this type) before it was published.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, PostSendFn>(p) })
}

/// The QP's retransmission attributes (once per QP, at its first post).
#[cold]
fn query_attrs(qp: *mut ibv_qp) -> Option<QpAttrs> {
    let a = QUERY_QP.get();
    if a == 0 {
        return None;
    }
    // SAFETY: the symbol ibv_query_qp@IBVERBS_1.1, of this signature.
    let f = unsafe { std::mem::transmute::<usize, QueryQpFn>(a) };
    let mut attr = ibv_qp_attr::default();
    // SAFETY: zeroed plain-data out-structs of verbs.h's layout
    // (crates/fastwake-verbs-sys checks them against the header).
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    let mask = fastwake_verbs_sys::IBV_QP_TIMEOUT
        | fastwake_verbs_sys::IBV_QP_RETRY_CNT
        | fastwake_verbs_sys::IBV_QP_RNR_RETRY
        | fastwake_verbs_sys::IBV_QP_PORT;
    // SAFETY: a live QP (the program is posting on it), valid out-pointers.
    (unsafe { f(qp, &mut attr, mask, &mut init) } == 0).then_some(QpAttrs {
        timeout: attr.timeout,
        retry_cnt: attr.retry_cnt,
        rnr_retry: attr.rnr_retry,
        port: attr.port_num,
    })
}

/// `ops.post_send`: date every work request of the chain, then post.
///
/// # Safety
/// The provider's post_send contract: a live QP, a valid WR chain.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if crate::pollers::on() && crate::pollers::suspect() {
        crate::pollers::progress();
    }
    // SAFETY: a live QP points at its live context.
    let ctx = unsafe { (*qp).context };
    let Some(real) = real_post(ctx) else {
        // Only if the context was closed under the program's feet.
        return libc::EINVAL;
    };
    let th = THRESHOLD_NS.load(Ordering::Relaxed);
    let key = QpKey {
        ctx: ctx as usize,
        // SAFETY: a live QP.
        qpn: unsafe { (*qp).qp_num },
    };
    let Some(mut q) = (if th == 0 { None } else { MON.qp(key, true) }) else {
        if th != 0 {
            counters(|s| &s.untracked, 1);
        }
        // SAFETY: forwarding unchanged.
        return unsafe { real(qp, wr, bad) };
    };
    if !q.attrs_tried {
        q.attrs_tried = true;
        q.attrs = crate::guarded(|| query_attrs(qp), || None);
    }
    let t = now_ns();
    let mut n = 0usize;
    let mut w = wr;
    let dropped = q.dropped;
    while !w.is_null() {
        // SAFETY: a node of the caller's valid chain.
        let r = unsafe { &*w };
        MON.posted(
            &mut q,
            Posted {
                wr_id: r.wr_id,
                t_ns: t,
                op: Op::from_wr_opcode(r.opcode),
                odp: odp::touches(r),
            },
        );
        n += 1;
        w = r.next;
    }
    // Recorded before the provider sees the requests (so no completion can
    // come back before its record), under the QP's lock (so a concurrent
    // poller matches against a finished record).
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { real(qp, wr, bad) };
    if rc != 0 {
        // Requests from *bad on were not posted: forget them.
        let stop = if bad.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: on failure the provider points *bad into the chain.
            unsafe { *bad }
        };
        let mut accepted = 0;
        let mut w = wr;
        while !w.is_null() && w != stop {
            accepted += 1;
            // SAFETY: as above.
            w = unsafe { (*w).next };
        }
        let c = q.unpost(n - accepted.min(n));
        MON.reads(c);
    }
    if q.dropped != dropped {
        counters(|s| &s.untracked, q.dropped - dropped);
    }
    rc
}

/// The program looked at `cq` and found nothing (an empty poll) or was
/// told of a completion (an event): its "last look".
#[inline]
pub fn looked(cq: *mut ibv_cq) {
    if THRESHOLD_NS.load(Ordering::Relaxed) != 0 && !cq.is_null() {
        MON.look(cq as usize, coarse_ns());
    }
}

/// Is the monitor on (a threshold set)? What a caller checks before it
/// gathers a completion's fields for [`polled`].
#[inline]
pub fn on() -> bool {
    THRESHOLD_NS.load(Ordering::Relaxed) != 0
}

/// Completions the wrapped poll_cq returns to the program.
///
/// # Safety
/// `wc` holds `n` completions polled from `cq`, a live CQ.
#[inline]
pub unsafe fn polled(cq: *mut ibv_cq, wc: *const ibv_wc, n: c_int) {
    let th = THRESHOLD_NS.load(Ordering::Relaxed);
    if th == 0 {
        return;
    }
    if n <= 0 {
        MON.look(cq as usize, coarse_ns());
        return;
    }
    let now = now_ns();
    let unlooked = now.saturating_sub(MON.look(cq as usize, now));
    // SAFETY: a live CQ.
    let ctx = unsafe { (*cq).context } as usize;
    for i in 0..n as usize {
        // SAFETY: i < n entries written by the provider.
        let w = unsafe { &*wc.add(i) };
        if !fastwake::stall::judged(w.status, w.opcode) {
            continue;
        }
        let key = QpKey { ctx, qpn: w.qp_num };
        let Some((d, v, attrs)) = MON.complete_on(key, w.wr_id, now, th, unlooked) else {
            continue;
        };
        counters(|s| &s.completions, 1);
        if let Some(s) = crate::stats::counters() {
            s.stalls.max_ns.fetch_max(d.latency_ns, Ordering::Relaxed);
        }
        match v {
            Verdict::OnTime => {}
            Verdict::Unobserved => counters(|s| &s.unobserved, 1),
            Verdict::Stall { first } => {
                counters(|s| &s.stalls, 1);
                if first {
                    counters(|s| &s.episodes, 1);
                    let facts = Facts {
                        waited_ns: d.latency_ns,
                        op: Some(d.op),
                        odp: d.odp,
                        odp_read_qps: MON.odp_read_qps(),
                        attrs,
                        moved: Vec::new(),
                    };
                    crate::guarded(
                        || report(key, w.wr_id, w.status, th, d.outstanding, facts),
                        || (),
                    );
                }
            }
        }
    }
}

/// At most this many episode lines per second (bursts of 10), so a sick
/// fabric cannot flood the program's stderr; the rest are counted.
static LAST_LINE: AtomicU64 = AtomicU64::new(0);
static BURST: AtomicU64 = AtomicU64::new(0);

#[cold]
#[inline(never)]
fn report(key: QpKey, wr_id: u64, status: u32, th: u64, outstanding: usize, mut f: Facts) {
    let now = now_ns();
    let last = LAST_LINE.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= 1_000_000_000 {
        BURST.store(0, Ordering::Relaxed);
    }
    if BURST.fetch_add(1, Ordering::Relaxed) >= 10 {
        counters(|s| &s.unreported, 1);
        return;
    }
    LAST_LINE.store(now, Ordering::Relaxed);
    let port = f.attrs.map_or(1, |a| a.port.max(1));
    let (dev, moved) = ports::moved(key.ctx, port);
    f.moved = moved;
    let mut place = format!("{dev} port {port} qp {:#x}", key.qpn);
    if status != 0 {
        place.push_str(&format!(" (completion status {status})"));
    }
    crate::diag(&cause::line(&place, wr_id, th, outstanding, &f));
}

/// `ibv_destroy_qp`: forget the QP's monitor state, then destroy.
///
/// # Safety
/// libibverbs' contract for `ibv_destroy_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let a = DESTROY_QP.get();
    if a == 0 {
        return libc::ENOSYS;
    }
    if !qp.is_null() {
        // SAFETY: a live QP (caller's contract).
        let key = unsafe {
            QpKey {
                ctx: (*qp).context as usize,
                qpn: (*qp).qp_num,
            }
        };
        MON.forget(key);
    }
    // SAFETY: the symbol ibv_destroy_qp@IBVERBS_1.1, forwarded unchanged.
    unsafe { std::mem::transmute::<usize, DestroyQpFn>(a)(qp) }
}

/// Forget a destroyed CQ's last look.
pub fn cq_destroyed(cq: *mut ibv_cq) {
    MON.forget_cq(cq as usize);
}

/// The exit lines: per monitored QP and opcode, count and p50/p99/max,
/// stalls and episodes. Printed with FASTWAKE_VERBOSE=1, or whenever a
/// stall was seen.
pub fn exit_report(verbose: bool) {
    if THRESHOLD_NS.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(s) = crate::stats::counters() else {
        return;
    };
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let st = &s.stalls;
    if !verbose && l(&st.stalls) == 0 {
        return;
    }
    if l(&st.completions) + l(&st.untracked) == 0 && !verbose {
        return;
    }
    crate::diag(&format!(
        "stall monitor pid={} threshold={}ms completions={} stalls={} episodes={} unreported_episodes={} unobserved={} max={:.3}ms untracked_posts={}",
        std::process::id(),
        THRESHOLD_NS.load(Ordering::Relaxed) / 1_000_000,
        l(&st.completions),
        l(&st.stalls),
        l(&st.episodes),
        l(&st.unreported),
        l(&st.unobserved),
        l(&st.max_ns) as f64 / 1e6,
        l(&st.untracked),
    ));
    MON.for_each(|k, q| {
        let mut line = format!("stall monitor qp {:#x}:", k.qpn);
        let mut any = false;
        for op in Op::ALL {
            let h = &q.hist[op as usize];
            if h.count() == 0 {
                continue;
            }
            any = true;
            line.push_str(&format!(
                " {} n={} p50={:.1}us p99={:.1}us max={:.3}ms;",
                op.name(),
                h.count(),
                h.quantile(0.5) as f64 / 1e3,
                h.quantile(0.99) as f64 / 1e3,
                h.max() as f64 / 1e6
            ));
        }
        if any {
            line.push_str(&format!(" stalls={} episodes={}", q.stalls, q.episodes));
            crate::diag(&line);
        }
    });
}

/// Set the threshold (tests drive the wrapped ops with a fake provider).
#[cfg(test)]
pub(super) fn set_threshold_ns(ns: u64) {
    THRESHOLD_NS.store(ns, Ordering::Relaxed);
}

/// (SEND completions recorded, stalls, episodes) of a QP.
#[cfg(test)]
pub(super) fn qp_counts(key: QpKey) -> Option<(u64, u64, u64)> {
    let q = MON.qp(key, false)?;
    Some((q.hist[Op::Send as usize].count(), q.stalls, q.episodes))
}
