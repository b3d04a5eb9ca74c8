//! The completion-latency monitor for the library's own verbs source: what
//! the preload shim does for unmodified programs (docs/design/stall-monitor.md), for
//! programs that post with [`super::RcQp`] and take completions from a
//! [`super::VerbsCq`] or a [`super::SharedCq`].
//!
//! [`super::RcQp`] dates each send-queue work request in a
//! [`crate::stall::Monitor`] before the provider sees it; a CQ's takes
//! match the completions and judge them. A completion later than the
//! threshold while the CQ was being looked at is a **stall**; consecutive
//! stalls of one QP are an episode, reported once as a [`Stall`] value the
//! CQ keeps until [`super::VerbsCq::take_stalls`] (at most [`KEPT`]; more
//! are counted as `unreported`). Counts: [`StallStats`].
//!
//! "Looked at": a take (empty or not), a peek that found completions (a
//! dispatcher looks for the owner), and a completion event read by a
//! sleeping owner. A CQ nobody looked at for a threshold makes its
//! completions look late for nothing: those are counted as `unobserved`.
//!
//! One threshold for the process, [`set_stall_threshold`] (default
//! [`crate::stall::DEFAULT_THRESHOLD_MS`]): posts and takes read it, so
//! set it before the traffic it is meant for.
//!
//! Data path: a post costs one clock read, a QP-table lookup and the QP's
//! mutex around the provider's post; an empty take one coarse clock read
//! and a store; a take that returns send completions a clock read, a
//! lookup and the QP's mutex per completion. Receives are not monitored
//! (the peer decides when they complete).

use super::sys::ibv_wc as Wc;
use crate::stall::cause::{self, Facts, QpAttrs};
use crate::stall::qp::Posted;
use crate::stall::{self, DEFAULT_THRESHOLD_MS, Monitor, Op, QpKey, Verdict, ports};
use fastwake_verbs_sys::{IBV_WC_SUCCESS, ibv_cq};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static MON: Monitor = Monitor::new();
/// The threshold in ns; 0: off.
static THRESHOLD_NS: AtomicU64 = AtomicU64::new(DEFAULT_THRESHOLD_MS * 1_000_000);

/// Stall reports a CQ keeps for [`super::VerbsCq::take_stalls`].
pub const KEPT: usize = 64;

/// Set the stall threshold of the library's verbs source (`None`, or
/// zero: the monitor is off and posts and takes skip it).
pub fn set_stall_threshold(t: Option<Duration>) {
    let ns = t.map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
    THRESHOLD_NS.store(ns, Ordering::Relaxed);
}

/// The stall threshold in force (`None`: off).
pub fn stall_threshold() -> Option<Duration> {
    match THRESHOLD_NS.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(Duration::from_nanos(ns)),
    }
}

/// One stall episode: its first late completion, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The QP's number.
    pub qp_num: u32,
    /// The late completion's `wr_id`.
    pub wr_id: u64,
    /// What the work request was.
    pub op: Op,
    /// Its completion status (`IBV_WC_SUCCESS` is 0).
    pub status: u32,
    /// From its post to the take that returned it.
    pub waited: Duration,
    /// The likely cause (`stall::cause::name`).
    pub cause: String,
    /// The whole report: where, how late, the QP's retransmission
    /// attributes, the port counters that moved, the cause (what the shim
    /// prints for an unmodified program).
    pub line: String,
}

/// A CQ's monitor counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StallStats {
    /// Send-queue completions matched to their post.
    pub completions: u64,
    /// Of those, later than the threshold while the CQ was looked at.
    pub stalls: u64,
    /// Runs of stalls on one QP, ended by a completion on time.
    pub episodes: u64,
    /// Episodes whose report was not kept (more than [`KEPT`] untaken).
    pub unreported: u64,
    /// Late completions on a CQ nobody had looked at for a threshold: not
    /// stalls.
    pub unobserved: u64,
    /// The longest matched completion.
    pub max: Duration,
}

/// One CQ's side of the monitor: its last look and what it found.
#[derive(Default)]
pub(super) struct CqStalls {
    /// CLOCK_MONOTONIC(_COARSE) ns of the last look at the CQ.
    last_look: AtomicU64,
    found: Mutex<(StallStats, VecDeque<Stall>)>,
}

#[inline]
fn on() -> Option<u64> {
    match THRESHOLD_NS.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(ns),
    }
}

fn coarse_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Start monitoring QPs of context `ctx` (device `dev`): the port
/// counters' baseline, once per context.
pub(super) fn watch_context(ctx: usize, dev: &str) {
    if on().is_some() {
        ports::baseline(ctx, dev);
    }
}

/// The context is closing: forget its baseline.
pub(super) fn forget_context(ctx: usize) {
    ports::forget(ctx);
}

/// Post one work request on QP `key` through `post` (the provider's call,
/// returning its errno or 0), dated first: a completion cannot come back
/// before its record, and a concurrent take matches against a finished one
/// (the QP's lock is held across the post).
#[inline]
pub(super) fn dated_post(
    key: QpKey,
    attrs: QpAttrs,
    wr_id: u64,
    op: Op,
    odp: bool,
    post: impl FnOnce() -> i32,
) -> i32 {
    let Some(mut q) = on().and_then(|_| MON.qp(key, true)) else {
        return post();
    };
    if !q.attrs_tried {
        q.attrs_tried = true;
        q.attrs = Some(attrs);
    }
    let t_ns = crate::cpu::monotonic_ns();
    MON.posted(
        &mut q,
        Posted {
            wr_id,
            t_ns,
            op,
            odp,
        },
    );
    let rc = post();
    if rc != 0 {
        let c = q.unpost(1);
        MON.reads(c);
    }
    rc
}

/// QP `key` is destroyed (its number may be reused).
pub(super) fn forget_qp(key: QpKey) {
    MON.forget(key);
}

impl CqStalls {
    /// The CQ was looked at and something was there (a peek that found
    /// completions, an event read by a sleeping owner).
    #[inline]
    pub(super) fn looked(&self) {
        if on().is_some() {
            self.last_look.store(coarse_ns(), Ordering::Relaxed);
        }
    }

    /// A take returned `wcs` from `cq` (a live CQ).
    #[inline]
    pub(super) fn taken(&self, cq: *mut ibv_cq, wcs: &[Wc]) {
        let Some(th) = on() else { return };
        if wcs.is_empty() {
            self.last_look.store(coarse_ns(), Ordering::Relaxed);
            return;
        }
        self.judge(cq, wcs, th);
    }

    #[inline(never)]
    fn judge(&self, cq: *mut ibv_cq, wcs: &[Wc], th: u64) {
        let now = crate::cpu::monotonic_ns();
        let unlooked = now.saturating_sub(self.last_look.swap(now, Ordering::Relaxed));
        // SAFETY: a live CQ (the caller's take holds it).
        let ctx = unsafe { (*cq).context } as usize;
        for w in wcs.iter().filter(|w| stall::judged(w.status, w.opcode)) {
            let key = QpKey { ctx, qpn: w.qp_num };
            let Some((d, v, attrs)) = MON.complete_on(key, w.wr_id, now, th, unlooked) else {
                continue;
            };
            let mut f = self.lock();
            f.0.completions += 1;
            f.0.max = f.0.max.max(Duration::from_nanos(d.latency_ns));
            match v {
                Verdict::OnTime => {}
                Verdict::Unobserved => f.0.unobserved += 1,
                Verdict::Stall { first } => {
                    f.0.stalls += 1;
                    if first {
                        f.0.episodes += 1;
                        if f.1.len() >= KEPT {
                            f.0.unreported += 1;
                        } else {
                            f.1.push_back(report(
                                key,
                                w,
                                th,
                                d.outstanding,
                                d.op,
                                d.latency_ns,
                                attrs,
                            ));
                        }
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (StallStats, VecDeque<Stall>)> {
        self.found.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn stats(&self) -> StallStats {
        self.lock().0
    }

    pub(super) fn take(&self) -> Vec<Stall> {
        self.lock().1.drain(..).collect()
    }
}

/// Name an episode's first stall (slow path: port counters from sysfs).
#[cold]
fn report(
    key: QpKey,
    w: &Wc,
    th: u64,
    outstanding: usize,
    op: Op,
    waited_ns: u64,
    attrs: Option<QpAttrs>,
) -> Stall {
    let port = attrs.map_or(1, |a| a.port.max(1));
    let (dev, moved) = ports::moved(key.ctx, port);
    let f = Facts {
        waited_ns,
        op: Some(op),
        odp: false,
        odp_read_qps: MON.odp_read_qps(),
        attrs,
        moved,
    };
    let mut place = format!("{dev} port {port} qp {:#x}", key.qpn);
    if w.status != IBV_WC_SUCCESS {
        place.push_str(&format!(" (completion status {})", w.status));
    }
    Stall {
        qp_num: key.qpn,
        wr_id: w.wr_id,
        op,
        status: w.status,
        waited: Duration::from_nanos(waited_ns),
        cause: cause::name(&f),
        line: cause::line(&place, w.wr_id, th, outstanding, &f),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_SEND, ibv_context};

    /// The CQ side against a fake CQ (only its `context` is read) and the
    /// post side with a fake provider: the judgement, without a device.
    /// (The guest's `verbs_source` test runs it against Soft-RoCE.)
    #[test]
    fn stalls_need_a_look_and_end_on_time() {
        // SAFETY: ibv_cq is plain C data; zeroed is a valid value, and
        // only `context` is read here.
        let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = 0x7f00_1000usize as *mut ibv_context;
        let cq: *mut ibv_cq = &mut cq;
        let key = QpKey {
            ctx: 0x7f00_1000,
            qpn: 0x99,
        };
        let attrs = QpAttrs {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            port: 1,
        };
        // The threshold is the process's: the only lib test that sets it.
        set_stall_threshold(Some(Duration::from_millis(20)));
        let m = CqStalls::default();
        let wc = |wr_id| Wc {
            wr_id,
            opcode: IBV_WC_SEND,
            qp_num: key.qpn,
            ..Wc::default()
        };
        let post = |wr_id| assert_eq!(dated_post(key, attrs, wr_id, Op::Send, false, || 0), 0);
        // Looked at throughout (empty takes): a stall, one episode.
        post(1);
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(30) {
            m.taken(cq, &[]);
        }
        m.taken(cq, &[wc(1)]);
        // On time: ends it.
        post(2);
        m.taken(cq, &[wc(2)]);
        // Nobody looked for longer than the threshold: unobserved.
        post(3);
        std::thread::sleep(Duration::from_millis(30));
        m.taken(cq, &[wc(3)]);
        // A refused post is forgotten: its wr_id matches nothing.
        assert_eq!(dated_post(key, attrs, 4, Op::Send, false, || 22), 22);
        m.taken(cq, &[wc(4)]);
        // A receive is not monitored.
        m.taken(
            cq,
            &[Wc {
                opcode: IBV_WC_RECV,
                ..wc(5)
            }],
        );
        let s = m.stats();
        assert_eq!(
            (s.completions, s.stalls, s.episodes, s.unobserved),
            (3, 1, 1, 1),
            "{s:?}"
        );
        assert!(s.max >= Duration::from_millis(30), "{s:?}");
        let r = m.take();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].qp_num, r[0].wr_id, r[0].op), (0x99, 1, Op::Send));
        assert!(
            r[0].line.contains("qp 0x99") && r[0].line.contains("rnr_retry 7"),
            "{}",
            r[0].line
        );
        assert!(m.take().is_empty());
        // Off: neither dated nor judged.
        set_stall_threshold(None);
        post(6);
        m.taken(cq, &[wc(6)]);
        assert_eq!(m.stats().completions, 3);
        forget_qp(key);
        set_stall_threshold(Some(Duration::from_millis(DEFAULT_THRESHOLD_MS)));
    }
}
