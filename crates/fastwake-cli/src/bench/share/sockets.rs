//! `--source socket|unix`: connections over loopback TCP or AF_UNIX stream
//! socketpairs, both ends a library [`SocketSource`] (so dispatchers and
//! task runtimes serve the server end from their kernel ready list; the
//! client busy-polls its end with `try_take`, one `recv` each). A message
//! is the 8-byte tag followed by the payload.
//!
//! Also the file-descriptor budget: each connection holds six (per end,
//! the socket, the source's epoll instance and its peek handle's dup).

use super::conn::{ClientLink, ServerEnd, Wire};
use fastwake::source::Source;
use fastwake::source::socket::{Message, SocketOptions, SocketSource};
use fastwake::{Fail, Result};
use rustix::event::epoll;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;

/// Descriptors one connection holds (module docs).
pub(super) const FDS_PER_CONN: u64 = 6;

/// Descriptors kept free for everything else (listener, dispatchers' and
/// runtimes' epoll sets, the standard ones).
const FDS_SPARE: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// Loopback TCP: what a server's connections are.
    Tcp,
    /// AF_UNIX stream socketpairs: the same socket API without the TCP
    /// stack.
    Unix,
}

/// Socket connections of one family, messages of `msg` bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sockets {
    pub(super) family: Family,
    /// Tag + payload.
    pub(super) msg: usize,
}

impl Sockets {
    pub(super) fn new(family: Family, payload: usize) -> Sockets {
        Sockets {
            family,
            msg: 8 + payload,
        }
    }

    /// Two connected stream sockets, (client, server).
    fn pair(&self, listener: Option<&TcpListener>) -> Result<(OwnedFd, OwnedFd)> {
        match (self.family, listener) {
            (Family::Tcp, Some(l)) => {
                let c =
                    TcpStream::connect(l.local_addr().map_err(Fail::from)?).map_err(Fail::from)?;
                let (s, _) = l.accept().map_err(Fail::from)?;
                Ok((c.into(), s.into()))
            }
            _ => rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
            .map_err(|e| Fail::os("socketpair", e)),
        }
    }
}

pub(super) struct SocketServer {
    src: SocketSource,
}

pub(super) struct SocketClient {
    src: SocketSource,
    out: Vec<u8>,
}

impl Wire for Sockets {
    type Server = SocketServer;
    type Client = SocketClient;

    fn name(&self) -> &'static str {
        match self.family {
            Family::Tcp => "socket",
            Family::Unix => "unix",
        }
    }

    fn connect(&self, n: usize) -> Result<Vec<(SocketClient, SocketServer)>> {
        let listener = match self.family {
            Family::Tcp => Some(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Fail::from)?),
            Family::Unix => None,
        };
        (0..n)
            .map(|_| {
                let (c, s) = self.pair(listener.as_ref())?;
                let end = |fd| SocketSource::new(fd, self.msg, SocketOptions::default());
                Ok((
                    SocketClient {
                        src: end(c)?,
                        out: vec![0; self.msg],
                    },
                    SocketServer { src: end(s)? },
                ))
            })
            .collect()
    }
}

impl ClientLink for SocketClient {
    fn send(&mut self, tag: u64, payload: &[u8]) -> Result<()> {
        self.out[..8].copy_from_slice(&tag.to_le_bytes());
        let n = payload.len().min(self.out.len() - 8);
        self.out[8..8 + n].copy_from_slice(&payload[..n]);
        self.src.send(&self.out)
    }

    fn poll(&mut self) -> Result<Option<u64>> {
        Ok(self
            .src
            .try_take()?
            .map(|_| u64::from_le_bytes(self.src.message()[..8].try_into().expect("8 bytes"))))
    }
}

impl ServerEnd for SocketServer {
    type Src = SocketSource;

    #[inline]
    fn source(&mut self) -> &mut SocketSource {
        &mut self.src
    }

    fn echo(&mut self, _m: Message) -> Result<()> {
        self.src.send(self.src.message())
    }

    /// A hand-written epoll server: one level-triggered set of the core's
    /// sockets, busy-polled with `epoll_wait(0)`, each reported socket
    /// drained. Peeking every socket one by one instead would cost one
    /// syscall per connection per pass.
    fn event_loop(mut ends: Vec<SocketServer>) -> Result<()> {
        let ep =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Fail::os("epoll_create", e))?;
        for (j, e) in ends.iter().enumerate() {
            epoll::add(
                &ep,
                e.src.socket(),
                epoll::EventData::new_u64(j as u64),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )
            .map_err(|e| Fail::os("epoll_ctl add", e))?;
        }
        let mut open = ends.len();
        let mut events = vec![MaybeUninit::<epoll::Event>::uninit(); ends.len().clamp(1, 1024)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while open > 0 {
            let got = match epoll::wait(&ep, &mut events, Some(&zero)) {
                Ok((got, _)) => got,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Fail::os("epoll_wait", e)),
            };
            for ev in got.iter() {
                let e = &mut ends[ev.data.u64() as usize];
                loop {
                    match e.src.try_take() {
                        Ok(Some(m)) => e.echo(m)?,
                        Ok(None) => break,
                        Err(err) if err.is_closed() => {
                            // Off the set, or its end of file reports
                            // on every pass.
                            let _ = epoll::delete(&ep, e.src.socket());
                            open -= 1;
                            break;
                        }
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        Ok(())
    }
}

/// How many socket connections the file-descriptor limit allows, after
/// raising the soft limit to the hard one if `want` connections need it.
/// `note`: one line saying what was done or why not, if anything was.
pub(super) fn fit(want: usize) -> (usize, Option<String>) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let need = want as u64 * FDS_PER_CONN + FDS_SPARE;
    let lim = getrlimit(Resource::Nofile);
    let Some(soft) = lim.current else {
        return (want, None);
    };
    if soft >= need {
        return (want, None);
    }
    let hard = lim.maximum;
    let target = hard.unwrap_or(need);
    let raised = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: hard,
        },
    )
    .is_ok();
    let now = if raised { target } else { soft };
    let fits = (now.saturating_sub(FDS_SPARE) / FDS_PER_CONN) as usize;
    if fits >= want {
        return (
            want,
            Some(format!(
                "raised the soft file-descriptor limit (RLIMIT_NOFILE) from {soft} to {now} for {want} socket connections ({FDS_PER_CONN} descriptors each)"
            )),
        );
    }
    let why = if raised {
        format!("its hard limit is {now}")
    } else {
        format!("the soft limit {soft} could not be raised")
    };
    (
        fits,
        Some(format!(
            "the file-descriptor limit (RLIMIT_NOFILE) allows {fits} socket connections, not {want} ({FDS_PER_CONN} descriptors each and {FDS_SPARE} spare): {why}"
        )),
    )
}
