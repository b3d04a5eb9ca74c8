//! A stream socket as a completion source: one completion per whole
//! message of a fixed size, readiness through epoll.
//!
//! # How the contract maps onto a socket
//!
//! A socket has no completion queue in user memory, so the peek
//! ([`Source::ready`]) cannot be syscall-free as the trait asks: it is one
//! `recv(MSG_PEEK | MSG_DONTWAIT)` unless a whole message is already
//! buffered. That is still the cheapest readiness check Linux offers for a
//! socket (~0.2 µs here) and what a polling server does.
//!
//! Interrupt mode sleeps in `epoll_wait` on an epoll instance of the
//! source's own, with the socket registered **level-triggered** once: a
//! level-triggered registration cannot miss data that arrived before the
//! wait, so [`Source::arm`] has nothing to do and the re-check in
//! [`super::block_until_ready`] is a belt to those braces.
//! [`Source::notify_fd`] hands out that epoll fd, so a caller can nest it.
//!
//! # Dispatch
//!
//! The peek handle ([`Source::peek`]), which a dispatcher calls from its
//! own thread, cannot see the bytes of a message the owner has already
//! read, so it asks the socket alone: a zero-timeout `poll(POLLIN)`, one
//! syscall per peek (its cost is in the [`Peek`] contract). A dispatcher
//! does not make it every pass: the handle names the socket's dup as its
//! [`Peek::kernel_ready_fd`], and the dispatcher learns which of its
//! sockets are readable from one `epoll_wait` on a set of its own. It says true
//! while any byte, the end of the stream or an error waits: a torn message is a stale true (the
//! owner reads the piece and waits again), and whole messages already
//! buffered never depend on it, since a wait takes them before it sleeps.
//! It polls a dup of the socket, so it never peeks a number the source
//! closed and something else reopened; dropping the source points that
//! dup at an empty epoll instance, which closes the connection as before
//! and leaves the handle reporting false.
//!
//! # Kernel busy polling
//!
//! With [`SocketOptions::busy_poll_us`] the source sets `SO_BUSY_POLL` (and
//! `SO_PREFER_BUSY_POLL`), which make the kernel spin on the NIC queue of
//! the socket's last packet inside a blocking receive, and the same budget
//! on its epoll instance (`EPIOCSPARAMS`, Linux 6.9+), since interrupt mode
//! sleeps in `epoll_wait`, not in `recv`. That works only for
//! traffic that came through a NAPI-driven device: the packets of loopback
//! (and of veth without GRO/XDP) carry no NAPI id, and then the option does
//! nothing. [`SocketSource::busy_poll`] reports which case holds, from
//! `SO_INCOMING_NAPI_ID`, once a packet has arrived.
//!
//! # The peer's CPU
//!
//! `SO_INCOMING_CPU` names the CPU that processed the last incoming packet.
//! Over loopback and veth that is the sender's CPU; [`Hints::peer_cpu`](super::Hints::peer_cpu)
//! reports it (sampled every few messages) so hybrid waits do not spin
//! against a peer on their own CPU.

use super::{Peek, Rechecked, Source};
use crate::{Fail, Result};
use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// Refresh the peer's CPU every this many messages.
const PEER_SAMPLE: u64 = 16;
use super::NO_CPU;

/// Options for [`SocketSource::new`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// Ask the kernel to busy-poll the device queue for this long inside
    /// blocking receives (`SO_BUSY_POLL`); `None` leaves the socket alone.
    pub busy_poll_us: Option<u32>,
}

/// What kernel busy polling does for this socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyPoll {
    /// Not requested.
    Off,
    /// Requested and the traffic carries a NAPI id: the kernel busy-polls.
    Active { us: u32, napi_id: u32 },
    /// Requested, but the socket's packets carry no NAPI id (loopback, veth
    /// without NAPI): the option has no effect.
    NoNapiId { us: u32 },
    /// Requested, but nothing has arrived yet to tell.
    Unknown { us: u32 },
    /// The kernel refused the option (errno).
    Refused { errno: i32 },
}

impl std::fmt::Display for BusyPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusyPoll::Off => write!(f, "off"),
            BusyPoll::Active { us, napi_id } => write!(f, "{us}us (napi id {napi_id})"),
            BusyPoll::NoNapiId { us } => {
                write!(f, "{us}us requested, no effect: packets carry no NAPI id")
            }
            BusyPoll::Unknown { us } => write!(f, "{us}us requested, no packet yet"),
            BusyPoll::Refused { errno } => write!(
                f,
                "refused: {}",
                rustix::io::Errno::from_raw_os_error(*errno)
            ),
        }
    }
}

/// One message taken from a [`SocketSource`]; the bytes are in
/// [`SocketSource::message`] until the next take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Messages taken before this one.
    pub seq: u64,
}

/// A connected stream socket, read in messages of a fixed size.
pub struct SocketSource {
    sock: OwnedFd,
    ep: OwnedFd,
    msg_size: usize,
    /// Received bytes not yet handed out; a whole message is `buf[..msg_size]`.
    buf: Vec<u8>,
    have: usize,
    /// The message at the front of `buf` was handed out and is dropped at
    /// the next take.
    held: bool,
    taken: u64,
    peer_cpu: Cell<u32>,
    busy: BusyPoll,
    /// The peek handle, built once: dispatch-mode waits compare it with
    /// the one they registered on every wait ([`Source::peek`]).
    peek: Arc<SocketPeek>,
    /// `peek` as the dispatcher's handle (the same allocation).
    handle: Arc<dyn Peek>,
}

/// The socket's peek handle (module docs): a zero-timeout `poll` for
/// `POLLIN` on a dup of the socket.
///
/// Why a dup: the handle outlives the source, and a number the source
/// closed may be reused by any later `open`, which the handle would then
/// peek. Its own number cannot be reused while it lives. When the source
/// is dropped, the number is pointed at an empty epoll instance (see
/// `Drop for SocketSource`), so the handle stops holding the connection
/// open and reports false from then on.
pub(crate) struct SocketPeek {
    fd: OwnedFd,
}

impl SocketPeek {
    /// A handle on a dup of `sock` (see the type docs for why a dup).
    pub(crate) fn new(sock: BorrowedFd<'_>) -> Result<Arc<SocketPeek>> {
        Ok(Arc::new(SocketPeek {
            fd: rustix::io::fcntl_dupfd_cloexec(sock, 0)
                .map_err(|e| Fail::os("dup socket for the peek handle", e))?,
        }))
    }

    /// The owner is closing `sock`, which is registered with its own epoll
    /// instance `ep`: stop holding the connection open (see
    /// `Drop for SocketSource`).
    pub(crate) fn retire(&self, ep: BorrowedFd<'_>, sock: BorrowedFd<'_>) {
        // The handle's dup would keep the connection open after `sock`
        // closes, for as long as a dispatcher holds the handle. Point the
        // handle's number at the owner's epoll instance instead, emptied
        // first: `dup3` swaps the file behind a number atomically, so a
        // concurrent peek polls either the socket or an instance with
        // nothing in it (never readable), and the number stays the
        // handle's. Neither call can fail on these two open fds short of
        // a kernel bug; if one did, the handle would keep the connection
        // open until it is dropped, no worse than that.
        let _ = rustix::event::epoll::delete(ep, sock);
        // SAFETY: both numbers are open, `ep` borrowed from the owner and
        // the target owned by the handle, which keeps owning it: dup3
        // closes nothing anyone else holds and leaves no number dangling.
        unsafe { libc::dup3(ep.as_raw_fd(), self.fd.as_raw_fd(), libc::O_CLOEXEC) };
    }
}

impl Peek for SocketPeek {
    fn ready(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            // Data (maybe not a whole message: a stale true the owner's
            // take resolves by reading it), or an end of file, hang-up or
            // error, which the owner's take reports.
            Ok(n) => n != 0,
            // Not expected from a zero-timeout poll of one fd; let the
            // owner look rather than risk a lost completion.
            Err(_) => true,
        }
    }

    fn kernel_ready_fd(&self) -> Option<BorrowedFd<'_>> {
        // The dup `ready` polls: POLLIN there is EPOLLIN on it, and it
        // keeps its number while the handle lives (the type docs).
        Some(self.fd.as_fd())
    }
}

fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: i32,
    opt: i32,
    v: i32,
) -> std::result::Result<(), i32> {
    // SAFETY: a plain int option on a socket we own, with its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, opt: i32) -> Option<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: an int-sized option read into a live int with its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// The CPU that processed `fd`'s last incoming packet (`SO_INCOMING_CPU`),
/// if it has received one.
pub fn incoming_cpu(fd: BorrowedFd<'_>) -> Option<u32> {
    let c = rustix::net::sockopt::socket_incoming_cpu(fd).ok()?;
    (c != u32::MAX).then_some(c)
}

impl SocketSource {
    /// Wrap a connected stream socket. It is made non-blocking, given
    /// `TCP_NODELAY` when it is TCP, and registered with a private epoll
    /// instance.
    pub fn new(sock: OwnedFd, msg_size: usize, opts: SocketOptions) -> Result<SocketSource> {
        if msg_size == 0 {
            return Err(Fail::invalid(
                "socket source message size must be at least 1",
            ));
        }
        rustix::io::ioctl_fionbio(&sock, true).map_err(|e| Fail::os("set O_NONBLOCK", e))?;
        // Ping-pong traffic of small messages must not wait for Nagle; not a
        // TCP socket (a unix stream) just refuses, which is fine.
        let _ = rustix::net::sockopt::set_tcp_nodelay(&sock, true);
        let busy = match opts.busy_poll_us {
            None => BusyPoll::Off,
            Some(us) => {
                match setsockopt_int(
                    sock.as_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_BUSY_POLL,
                    us as i32,
                ) {
                    Ok(()) => {
                        // Preferring busy polling over interrupts is a hint;
                        // older kernels lack it.
                        // SO_PREFER_BUSY_POLL (69) is not in every libc.
                        let _ = setsockopt_int(sock.as_fd(), libc::SOL_SOCKET, 69, 1);
                        BusyPoll::Unknown { us }
                    }
                    Err(errno) => BusyPoll::Refused { errno },
                }
            }
        };
        let ep = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
            .map_err(|e| Fail::os("epoll_create", e))?;
        if let Some(us) = opts.busy_poll_us {
            // Where the kernel lacks per-epoll busy polling this fails with
            // ENOTTY/EINVAL and the socket option alone remains.
            let p = libc::epoll_params {
                busy_poll_usecs: us,
                busy_poll_budget: 8,
                prefer_busy_poll: 1,
                __pad: 0,
            };
            // SAFETY: EPIOCSPARAMS reads one epoll_params from a live struct.
            let _ = unsafe { libc::ioctl(ep.as_raw_fd(), libc::EPIOCSPARAMS, &p) };
        }
        rustix::event::epoll::add(
            &ep,
            &sock,
            rustix::event::epoll::EventData::new_u64(0),
            rustix::event::epoll::EventFlags::IN | rustix::event::epoll::EventFlags::RDHUP,
        )
        .map_err(|e| Fail::os("epoll_ctl add socket", e))?;
        let peek = SocketPeek::new(sock.as_fd())?;
        Ok(SocketSource {
            sock,
            ep,
            msg_size,
            buf: vec![0; msg_size * 64],
            have: 0,
            held: false,
            taken: 0,
            peer_cpu: Cell::new(NO_CPU),
            busy,
            handle: peek.clone(),
            peek,
        })
    }

    /// The socket, for sending and for options.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The message taken last.
    pub fn message(&self) -> &[u8] {
        &self.buf[..self.msg_size]
    }

    /// Send all of `data`, waiting for buffer space if the socket is full.
    pub fn send(&self, data: &[u8]) -> Result<()> {
        let mut off = 0;
        while off < data.len() {
            match rustix::net::send(&self.sock, &data[off..], rustix::net::SendFlags::NOSIGNAL) {
                Ok(n) => off += n,
                Err(rustix::io::Errno::AGAIN) => {
                    let mut p = [rustix::event::PollFd::new(
                        &self.sock,
                        rustix::event::PollFlags::OUT,
                    )];
                    match rustix::event::poll(&mut p, None) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(Fail::os("poll socket for send", e)),
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::PIPE) | Err(rustix::io::Errno::CONNRESET) => {
                    return Err(Fail::closed("socket peer is gone"));
                }
                Err(e) => return Err(Fail::os("send", e)),
            }
        }
        Ok(())
    }

    /// What kernel busy polling does for this socket (see the module docs).
    pub fn busy_poll(&self) -> BusyPoll {
        match self.busy {
            BusyPoll::Unknown { us } if self.taken > 0 => {
                match getsockopt_int(
                    self.sock.as_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_INCOMING_NAPI_ID,
                ) {
                    Some(id) if id > 0 => BusyPoll::Active {
                        us,
                        napi_id: id as u32,
                    },
                    _ => BusyPoll::NoNapiId { us },
                }
            }
            b => b,
        }
    }

    /// Read what the socket has, without blocking, until a whole message is
    /// buffered. `Ok(false)`: not a whole message yet.
    fn fill(&mut self) -> Result<bool> {
        while self.have < self.msg_size {
            if self.have == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            match rustix::net::recv(
                &self.sock,
                &mut self.buf[self.have..],
                rustix::net::RecvFlags::DONTWAIT,
            ) {
                Ok((0, _)) => return Err(Fail::closed("socket peer closed the connection")),
                Ok((n, _)) => self.have += n,
                Err(rustix::io::Errno::AGAIN) => return Ok(false),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::CONNRESET) => {
                    return Err(Fail::closed("socket connection reset"));
                }
                Err(e) => return Err(Fail::os("recv", e)),
            }
        }
        Ok(true)
    }
}

impl Source for SocketSource {
    type Completion = Message;

    fn name(&self) -> &'static str {
        "socket"
    }

    fn ready(&self) -> bool {
        let have = self.have - if self.held { self.msg_size } else { 0 };
        if have >= self.msg_size {
            return true;
        }
        // The one syscall of the peek: how many bytes wait in the socket,
        // without taking them (see the module docs).
        let want = self.msg_size - have;
        let mut scratch = [0u8; 256];
        let n = want.min(scratch.len());
        match rustix::net::recv(
            &self.sock,
            &mut scratch[..n],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            // 0 bytes = EOF: ready, so try_take reports the close.
            Ok((got, _)) => got == 0 || got >= n,
            Err(rustix::io::Errno::AGAIN) => false,
            Err(_) => true,
        }
    }

    fn try_take(&mut self) -> Result<Option<Message>> {
        if self.held {
            // Drop the message handed out last; keep what followed it.
            self.buf.copy_within(self.msg_size..self.have, 0);
            self.have -= self.msg_size;
            self.held = false;
        }
        if !self.fill()? {
            return Ok(None);
        }
        self.held = true;
        let m = Message { seq: self.taken };
        self.taken += 1;
        if self.taken % PEER_SAMPLE == 1 {
            self.peer_cpu
                .set(incoming_cpu(self.sock.as_fd()).unwrap_or(NO_CPU));
        }
        Ok(Some(m))
    }

    fn arm(&mut self) -> Result<()> {
        // Level-triggered epoll needs no arming (module docs).
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        if timeout.is_some() {
            // A timed sleep (a pre-wake's, µs long) through ppoll on the
            // epoll fd, which is readable while the socket is: ppoll takes
            // the timeout in ns, where epoll_wait (without epoll_pwait2)
            // rounds it up to a whole ms, which made every pre-wake sleep
            // past its completion (measured: all 8,576 woken by the
            // socket, wake p50 as interrupt mode's).
            return super::wait_readable(self.ep.as_fd(), timeout, false, "ppoll socket").map(drop);
        }
        let mut evs = [std::mem::MaybeUninit::<rustix::event::epoll::Event>::uninit(); 1];
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        match rustix::event::epoll::wait(&self.ep, &mut evs, ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(Fail::os("epoll_wait socket", e)),
        }
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ep.as_fd())
    }

    fn hints(&self) -> super::Hints {
        super::Hints::producer_on(self.peer_cpu.get())
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(&self.handle)
    }
}

impl Drop for SocketSource {
    fn drop(&mut self) {
        self.peek.retire(self.ep.as_fd(), self.sock.as_fd());
    }
}
