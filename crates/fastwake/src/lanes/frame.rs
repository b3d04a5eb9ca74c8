//! The wire format of a lane and its receiving side.
//!
//! A message is a 4-byte little-endian length and that many bytes. The
//! receiver buffers what the socket has and hands out a message only once
//! all of it is there, so a peer that closes mid-message leaves nothing
//! half delivered: the close is an error naming how much was missing.

use crate::source::socket::SocketPeek;
use crate::source::{Peek, Rechecked, Source};
use crate::{Fail, Result};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the length header.
pub(super) const HEADER: usize = 4;

/// The header of a `len`-byte message.
pub(super) fn header(len: usize) -> [u8; HEADER] {
    (len as u32).to_le_bytes()
}

/// A private epoll instance with `sock` registered level-triggered for
/// `events`: it is readable exactly while the socket has one of them, so
/// a sleep on it after a re-check cannot miss one.
pub(super) fn epoll_on(
    sock: &OwnedFd,
    events: rustix::event::epoll::EventFlags,
) -> Result<OwnedFd> {
    let ep = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
        .map_err(|e| Fail::os("epoll_create", e))?;
    rustix::event::epoll::add(
        &ep,
        sock,
        rustix::event::epoll::EventData::new_u64(0),
        events,
    )
    .map_err(|e| Fail::os("epoll_ctl add lane socket", e))?;
    Ok(ep)
}

/// Refresh the sender's CPU every this many messages.
const PEER_SAMPLE: u64 = 16;

/// Receive buffer to start with; it grows to the largest message seen.
const FIRST_BUFFER: usize = 64 << 10;

/// One lane's receiving side as a completion source: a completion is one
/// whole message (its length), whose bytes are [`Frames::message`] until
/// the next take.
pub(super) struct Frames {
    sock: Arc<OwnedFd>,
    ep: OwnedFd,
    buf: Vec<u8>,
    /// Bytes `buf[start..end]` are received and not yet handed out.
    start: usize,
    end: usize,
    /// The message handed out last, dropped at the next take.
    held: std::ops::Range<usize>,
    max_message: usize,
    /// Bytes per `recv` at most: a receive is a stretch the kernel does
    /// not preempt (`PREEMPT_NONE`), so a bulk lane reads in chunks and a
    /// latency message's thread gets the CPU between them.
    cap: usize,
    /// Messages taken, and the CPU that sent the last sampled one
    /// (`SO_INCOMING_CPU`, every [`PEER_SAMPLE`] messages): a hybrid wait
    /// must not spin against a sender on its own CPU.
    taken: u64,
    peer_cpu: u32,
    peek: Arc<SocketPeek>,
    handle: Arc<dyn Peek>,
}

impl Frames {
    pub(super) fn new(sock: Arc<OwnedFd>, max_message: usize) -> Result<Frames> {
        let ep = epoll_on(
            &sock,
            rustix::event::epoll::EventFlags::IN | rustix::event::epoll::EventFlags::RDHUP,
        )?;
        let peek = SocketPeek::new(sock.as_fd())?;
        Ok(Frames {
            sock,
            ep,
            buf: vec![0; FIRST_BUFFER],
            start: 0,
            end: 0,
            held: 0..0,
            max_message,
            cap: usize::MAX,
            taken: 0,
            peer_cpu: u32::MAX,
            handle: peek.clone(),
            peek,
        })
    }

    /// Read at most `cap` bytes per `recv` from now on.
    pub(super) fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }

    /// The message taken last.
    pub(super) fn message(&self) -> &[u8] {
        &self.buf[self.held.clone()]
    }

    /// The length its header gives the message at `at`, if the header is
    /// in.
    fn len_at(&self, at: usize) -> Option<usize> {
        let h = self
            .buf
            .get(at..at + HEADER)
            .filter(|_| self.end - at >= HEADER)?;
        Some(u32::from_le_bytes(h.try_into().expect("HEADER bytes")) as usize)
    }

    /// The length of the whole message at `start`, if its header is in.
    fn next_len(&self) -> Result<Option<usize>> {
        match self.len_at(self.start) {
            Some(len) if len > self.max_message => Err(Fail::new(
                libc::EPROTO,
                format!(
                    "lane peer sent a {len}-byte message, over the {}-byte limit",
                    self.max_message
                ),
            )),
            l => Ok(l),
        }
    }

    /// Is a whole message buffered after the one held (or a header over
    /// the limit, which the next take reports)?
    pub(super) fn buffered(&self) -> bool {
        let start = if self.held.end > 0 {
            self.held.end
        } else {
            self.start
        };
        self.len_at(start)
            .is_some_and(|len| len > self.max_message || self.end - start >= HEADER + len)
    }

    /// Room for `need` bytes from `start`: move the unread bytes to the
    /// front, grow the buffer if even that is not enough.
    fn make_room(&mut self, need: usize) {
        if self.start + need <= self.buf.len() && self.end < self.buf.len() {
            return;
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if need > self.buf.len() {
            self.buf.resize(need, 0);
        }
    }
}

impl Source for Frames {
    type Completion = usize;

    fn name(&self) -> &'static str {
        "lane"
    }

    fn ready(&self) -> bool {
        if self.buffered() {
            return true;
        }
        let mut scratch = [0u8; 1];
        match rustix::net::recv(
            &*self.sock,
            &mut scratch,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            // A byte (maybe not a whole message: a stale true the take
            // resolves), or the end of the stream, which the take reports.
            Ok(_) => true,
            Err(rustix::io::Errno::AGAIN) => false,
            Err(_) => true,
        }
    }

    fn try_take(&mut self) -> Result<Option<usize>> {
        if self.held.end > 0 {
            self.start = self.held.end;
            self.held = 0..0;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        loop {
            let need = match self.next_len()? {
                Some(len) if self.end - self.start >= HEADER + len => {
                    let at = self.start + HEADER;
                    self.held = at..at + len;
                    if self.taken.is_multiple_of(PEER_SAMPLE) {
                        self.peer_cpu = crate::source::socket::incoming_cpu(self.sock.as_fd())
                            .unwrap_or(u32::MAX);
                    }
                    self.taken += 1;
                    return Ok(Some(len));
                }
                Some(len) => HEADER + len,
                None => HEADER,
            };
            self.make_room(need);
            let to = self.buf.len().min(self.end.saturating_add(self.cap));
            match rustix::net::recv(
                &*self.sock,
                &mut self.buf[self.end..to],
                rustix::net::RecvFlags::DONTWAIT,
            ) {
                Ok((0, _)) => {
                    let have = self.end - self.start;
                    if have == 0 {
                        return Err(Fail::closed("lane peer closed the connection"));
                    }
                    return Err(Fail::new(
                        libc::EPROTO,
                        format!(
                            "lane peer closed mid-message: {have} of {need} bytes arrived, nothing delivered"
                        ),
                    ));
                }
                Ok((n, _)) => self.end += n,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::CONNRESET) => {
                    return Err(Fail::closed("lane connection reset by its peer"));
                }
                Err(e) => return Err(Fail::os("recv lane", e)),
            }
        }
    }

    fn arm(&mut self) -> Result<()> {
        // Level-triggered epoll needs no arming.
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        crate::source::wait_readable(self.ep.as_fd(), timeout, false, "ppoll lane").map(drop)
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ep.as_fd())
    }

    fn hints(&self) -> crate::source::Hints {
        crate::source::Hints::producer_on(self.peer_cpu)
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(&self.handle)
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        self.peek.retire(self.ep.as_fd(), self.sock.as_fd());
    }
}
