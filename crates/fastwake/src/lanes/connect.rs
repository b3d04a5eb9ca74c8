//! Opening an endpoint's connections and pairing them at the listener.
//!
//! Every connection starts with a [`Hello`] of [`HELLO_LEN`] bytes: the
//! magic `fwlane01`, the endpoint's id (u32, little-endian, random per
//! endpoint) and the lane (0 latency, 1 bulk, 2 shared), then three zero
//! bytes. A [`Listener`] holds a lane until the other lane of the same id
//! arrives, and then returns the endpoint.

use super::endpoint::Endpoint;
use super::{Config, Layout};
use crate::{Fail, Result};
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

/// Bytes of a [`Hello`] on the wire.
pub const HELLO_LEN: usize = 16;
const MAGIC: &[u8; 8] = b"fwlane01";
/// How long a listener waits for a new connection's hello: a peer that
/// connects and says nothing must not hold `accept` for ever.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Unpaired lanes a listener keeps at most (a peer that opens latency
/// lanes and never their bulk lanes must not grow it without bound).
const MAX_PENDING: usize = 64;

/// Which lane a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The latency lane of a two-lane endpoint.
    Latency,
    /// The bulk lane of a two-lane endpoint.
    Bulk,
    /// The one connection of a shared endpoint.
    Shared,
}

/// The first bytes of every connection (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The endpoint the connection belongs to.
    pub id: u32,
    /// Which of its lanes it is.
    pub role: Role,
}

impl Hello {
    /// The bytes on the wire.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12] = match self.role {
            Role::Latency => 0,
            Role::Bulk => 1,
            Role::Shared => 2,
        };
        b
    }

    /// Parse the bytes on the wire; one line on what is wrong.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello> {
        if &b[..8] != MAGIC {
            return Err(Fail::new(
                libc::EPROTO,
                "lanes handshake: the peer is not a fastwake lanes endpoint (bad magic)",
            ));
        }
        let role = match b[12] {
            0 => Role::Latency,
            1 => Role::Bulk,
            2 => Role::Shared,
            r => {
                return Err(Fail::new(
                    libc::EPROTO,
                    format!("lanes handshake: unknown lane {r}"),
                ));
            }
        };
        Ok(Hello {
            id: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            role,
        })
    }
}

/// An I/O error as one line naming what was being done.
fn io(what: &str, e: std::io::Error) -> Fail {
    Fail::new(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("{what}: {e}"),
    )
}

fn new_id() -> u32 {
    // Distinct per endpoint with overwhelming odds: the standard library's
    // per-process random keys, a counter and the clock.
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    RandomState::new().hash_one((n, crate::cpu::monotonic_ns(), std::process::id())) as u32
}

fn open(addr: SocketAddr, hello: Hello) -> Result<OwnedFd> {
    let mut s =
        TcpStream::connect(addr).map_err(|e| io(&format!("lanes: connect to {addr}"), e))?;
    s.set_nodelay(true)?;
    s.write_all(&hello.encode())?;
    Ok(OwnedFd::from(s))
}

/// Open an endpoint to the [`Listener`] at `addr`: two connections
/// (latency, then bulk) for [`Layout::Lanes`], one for [`Layout::Shared`].
pub fn connect(addr: SocketAddr, config: Config) -> Result<Endpoint> {
    config.validate()?;
    let id = new_id();
    let socks = match config.layout {
        Layout::Lanes => vec![
            open(
                addr,
                Hello {
                    id,
                    role: Role::Latency,
                },
            )?,
            open(
                addr,
                Hello {
                    id,
                    role: Role::Bulk,
                },
            )?,
        ],
        Layout::Shared => vec![open(
            addr,
            Hello {
                id,
                role: Role::Shared,
            },
        )?],
    };
    Endpoint::new(config, socks)
}

/// Accepts endpoints: pairs the lanes of each by its hello. The layout of
/// an accepted endpoint is the connecting side's; everything else comes
/// from the listener's [`Config`].
pub struct Listener {
    inner: TcpListener,
    config: Config,
    pending: Mutex<HashMap<u32, (Role, OwnedFd)>>,
}

impl Listener {
    /// Listen on `addr` (port 0: any free port, see
    /// [`Listener::local_addr`]).
    pub fn bind(addr: SocketAddr, config: Config) -> Result<Listener> {
        config.validate()?;
        let inner =
            TcpListener::bind(addr).map_err(|e| io(&format!("lanes: listen on {addr}"), e))?;
        Ok(Listener {
            inner,
            config,
            pending: Mutex::new(HashMap::new()),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.inner.local_addr()?)
    }

    /// Accept connections until one completes an endpoint. A connection
    /// whose hello is missing or wrong is closed and reported (one line);
    /// call again to go on accepting.
    pub fn accept(&self) -> Result<Endpoint> {
        loop {
            let (mut s, _) = self.inner.accept()?;
            s.set_read_timeout(Some(HELLO_TIMEOUT))?;
            let mut b = [0u8; HELLO_LEN];
            s.read_exact(&mut b)
                .map_err(|e| io("lanes handshake: no hello from the peer", e))?;
            s.set_read_timeout(None)?;
            let hello = Hello::decode(&b)?;
            let fd = OwnedFd::from(s);
            let mut config = self.config;
            let socks = match hello.role {
                Role::Shared => {
                    config.layout = Layout::Shared;
                    vec![fd]
                }
                role => {
                    let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                    match pending.remove(&hello.id) {
                        Some((other, ofd)) if other != role => {
                            config.layout = Layout::Lanes;
                            if role == Role::Latency {
                                vec![fd, ofd]
                            } else {
                                vec![ofd, fd]
                            }
                        }
                        Some(_) => {
                            return Err(Fail::new(
                                libc::EPROTO,
                                format!(
                                    "lanes handshake: endpoint {:#x} opened its {role:?} lane twice",
                                    hello.id
                                ),
                            ));
                        }
                        None => {
                            if pending.len() >= MAX_PENDING {
                                return Err(Fail::new(
                                    libc::EAGAIN,
                                    format!(
                                        "lanes: {MAX_PENDING} endpoints wait for their second lane; refusing more"
                                    ),
                                ));
                            }
                            pending.insert(hello.id, (role, fd));
                            continue;
                        }
                    }
                }
            };
            return Endpoint::new(config, socks);
        }
    }
}
