//! A blocking `ibv_get_cq_event` as a library source, for dispatch mode:
//! the dispatcher peeks the channel's armed CQs (a CQE is moved to the
//! shim's stash, which the program cannot tell) and its fd; the thread
//! then reports the event as the spinning modes do.

use crate::fds::sleep_readable;
use fastwake::Fail;
use fastwake::source::{Peek, Rechecked, Source};
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

/// The channel (address, fd) a handle peeks.
type ChannelKey = (usize, c_int);

thread_local! {
    // The handle of the channel this thread waited on last (see
    // `crate::fds`); with its channel and fd, to tell it is the same.
    static LAST: RefCell<Option<(ChannelKey, Arc<dyn Peek>)>> = const { RefCell::new(None) };
}

/// A completion channel as a dispatcher sees it: its managed CQs (a CQE
/// is moved to the shim's stash, which the program cannot tell) and its
/// fd. Peeked only while its waiter is inside `ibv_get_cq_event` on it
/// (a dispatcher peeks waiting slots only), so the channel is alive.
struct VerbsPeek {
    channel: usize,
    fd: c_int,
}

impl Peek for VerbsPeek {
    fn ready(&self) -> bool {
        super::event::channel_ready(self.channel as *mut _, self.fd)
    }
}

/// `ibv_get_cq_event` on `channel` as a source: taking is a synthetic
/// event, or the real read when the fd is readable.
struct VerbsWait<'a> {
    real_get: super::real::GetCqEventFn,
    channel: *mut fastwake_verbs_sys::ibv_comp_channel,
    fd: c_int,
    peek: &'a Arc<dyn Peek>,
}

impl Source for VerbsWait<'_> {
    type Completion = super::event::Event;

    fn name(&self) -> &'static str {
        "verbs-channel"
    }

    fn ready(&self) -> bool {
        super::event::channel_ready(self.channel, self.fd)
    }

    fn try_take(&mut self) -> fastwake::Result<Option<Self::Completion>> {
        // SAFETY: we are inside the program's ibv_get_cq_event on channel.
        unsafe { super::event::try_event(self.real_get, self.channel, self.fd) }
            .map_err(|e| Fail::new(e, "ibv_get_cq_event"))
    }

    fn arm(&mut self) -> fastwake::Result<()> {
        // The program armed its CQs (req_notify_cq, which the shim makes
        // real); poll on the fd queues us before it checks.
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> fastwake::Result<()> {
        // EINTR is a spurious wake-up here: the blocking read the program
        // asked for is restarted after a handler installed with
        // SA_RESTART, so a signal must not end this wait.
        sleep_readable(self.fd, timeout, false)
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(self.peek)
    }
}

/// The program's blocking `ibv_get_cq_event(channel)` in dispatch mode, or
/// `None` when it cannot be dispatched (inactive, or the thread's state
/// busy). Signals do not end it (see `VerbsWait::sleep`).
pub(crate) fn verbs_wait(
    real_get: super::real::GetCqEventFn,
    channel: *mut fastwake_verbs_sys::ibv_comp_channel,
    fd: c_int,
) -> Option<Result<super::event::Event, c_int>> {
    let key = channel as usize;
    let cached = LAST
        .try_with(|l| {
            let l = l.try_borrow().ok()?;
            let (k, p) = l.as_ref()?;
            (*k == (key, fd)).then(|| p.clone())
        })
        .ok()
        .flatten();
    let peek = match cached {
        Some(p) => p,
        None => {
            let p: Arc<dyn Peek> = Arc::new(VerbsPeek { channel: key, fd });
            LAST.try_with(|l| {
                l.try_borrow_mut()
                    .map(|mut l| *l = Some(((key, fd), p.clone())))
            })
            .ok()?
            .ok()?;
            p
        }
    };
    let mut src = VerbsWait {
        real_get,
        channel,
        fd,
        peek: &peek,
    };
    // Signals do not end it (see `VerbsWait::sleep`).
    Some(
        crate::dispatch::serve(&mut src, None, false)?
            .map(|e| e.expect("no deadline"))
            .map_err(|e| e.errno()),
    )
}
