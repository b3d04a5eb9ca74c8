//! A CQ the caller created (`source::verbs::CallerCq`, the C ABI's
//! `fw_verbs_cq`) on a fake provider (its `poll_cq` hands out the wr_ids
//! queued in the CQ's `cq_context`): the data path and the rules, on hosts
//! without rdma-core or a device. Events need a real channel (the
//! Soft-RoCE guest: `c-abi-verbs`, `verbs-tests`).

use fastwake::source::verbs::{CallerCq, CqStats, vector_for_cpu};
use fastwake::{Source, WaitMode, Waiter};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::time::Duration;

type Queue = Mutex<VecDeque<u64>>;

unsafe extern "C" fn fake_poll(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the fake CQ's cq_context is the test's queue, alive
    // while the CQ is; wc has room for n entries (poll_cq's contract).
    unsafe {
        let q = &*((*cq).cq_context as *const Queue);
        let mut q = q.lock().unwrap();
        let mut i = 0;
        while i < n
            && let Some(id) = q.pop_front()
        {
            *wc.add(i as usize) = ibv_wc {
                wr_id: id,
                ..Default::default()
            };
            i += 1;
        }
        i
    }
}

unsafe extern "C" fn fake_notify(_: *mut ibv_cq, _: c_int) -> c_int {
    0
}

/// A context and a CQ on it, as a provider would lay them out.
struct Fake {
    ctx: Box<ibv_context>,
    cq: Box<ibv_cq>,
    queue: Box<Queue>,
}

impl Fake {
    fn new(with_ops: bool) -> Fake {
        // SAFETY: both structs are integers, pointers and optional
        // function pointers (and zeroed pthread objects, which glibc
        // takes as initialized): all-zero is a valid value.
        let (mut ctx, mut cq): (Box<ibv_context>, Box<ibv_cq>) =
            unsafe { (Box::new(std::mem::zeroed()), Box::new(std::mem::zeroed())) };
        if with_ops {
            ctx.ops.poll_cq = Some(fake_poll);
            ctx.ops.req_notify_cq = Some(fake_notify);
        }
        let queue = Box::new(Queue::default());
        cq.context = &mut *ctx;
        cq.cq_context = (&*queue as *const Queue).cast_mut().cast::<c_void>();
        Fake { ctx, cq, queue }
    }

    fn push(&self, ids: impl IntoIterator<Item = u64>) {
        self.queue.lock().unwrap().extend(ids);
    }

    fn source(&mut self) -> CallerCq {
        // SAFETY: the fake outlives every source the tests make from it.
        unsafe { CallerCq::from_raw(&mut *self.cq, std::ptr::null_mut()) }.unwrap()
    }
}

#[test]
fn refuses_null_a_foreign_channel_and_a_provider_without_ops() {
    // SAFETY: null is refused before anything is read.
    let e = unsafe { CallerCq::from_raw(std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_eq!(e.err().map(|e| e.errno()), Some(libc::EINVAL));
    let mut f = Fake::new(true);
    let mut other: ibv_comp_channel = ibv_comp_channel {
        context: &mut *f.ctx,
        fd: -1,
        refcnt: 0,
    };
    // SAFETY: the fake is live; the channel is refused before use.
    let e = unsafe { CallerCq::from_raw(&mut *f.cq, &mut other) }
        .err()
        .unwrap();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.cause().contains("without a completion channel"), "{e}");
    f.cq.channel = &mut other;
    // SAFETY: as above; now the CQ claims the channel, and NULL is refused.
    let e = unsafe { CallerCq::from_raw(&mut *f.cq, std::ptr::null_mut()) }
        .err()
        .unwrap();
    assert!(e.cause().contains("not the CQ's"), "{e}");
    let mut bare = Fake::new(false);
    // SAFETY: the fake is live.
    let e = unsafe { CallerCq::from_raw(&mut *bare.cq, std::ptr::null_mut()) }
        .err()
        .unwrap();
    assert_eq!(e.errno(), libc::ENOTSUP);
    // SAFETY: null is refused.
    let e = unsafe { vector_for_cpu(std::ptr::null_mut(), Some(0)) };
    assert_eq!(e.err().map(|e| e.errno()), Some(libc::EINVAL));
}

#[test]
fn peeks_keep_what_they_saw_and_polls_return_it_first_in_order() {
    let mut f = Fake::new(true);
    let mut src = f.source();
    assert!(!src.ready());
    f.push([1, 2, 3]);
    // A dispatcher's look from another thread moves CQEs aside...
    let peek = src.peek().unwrap().clone();
    std::thread::spawn(move || assert!(peek.ready()))
        .join()
        .unwrap();
    assert_eq!(src.stashed(), 3);
    f.push([4, 5]);
    // ...and the caller still gets every one, in the CQ's order.
    let mut wc = [ibv_wc::default(); 2];
    assert_eq!(src.poll(&mut wc).unwrap(), 2);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (1, 2));
    let mut wc = [ibv_wc::default(); 8];
    assert_eq!(src.poll(&mut wc).unwrap(), 3);
    assert_eq!(
        wc[..3].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert_eq!(src.poll(&mut wc).unwrap(), 0);
    assert_eq!(src.stats(), CqStats::default());
}

#[test]
fn poll_mode_waits_and_a_cq_without_channel_refuses_to_sleep() {
    let mut f = Fake::new(true);
    let mut src = f.source();
    assert!(!src.has_channel() && src.notify_fd().is_none());
    f.push([7]);
    let mut w = Waiter::new(WaitMode::Poll);
    assert_eq!(w.wait(&mut src).unwrap().wr_id, 7);
    let t = w.wait_timeout(&mut src, Duration::from_millis(2)).unwrap();
    assert!(t.is_none());
    // Interrupt mode would have to sleep on a channel it does not have:
    // an error naming poll mode, not a hang or a crash.
    let e = Waiter::new(WaitMode::Interrupt)
        .wait_timeout(&mut src, Duration::from_millis(2))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.cause().contains("only poll mode"), "{e}");
}

#[test]
fn a_peek_handle_outliving_the_source_polls_nothing() {
    let mut f = Fake::new(true);
    let src = f.source();
    let peek = src.peek().unwrap().clone();
    drop(src);
    f.push([1]);
    assert!(!peek.ready());
    assert_eq!(f.queue.lock().unwrap().len(), 1, "the CQ was not polled");
}
