//! The TCP exchange of the two-process verbs ping-pong: perftest's own
//! (`ib_send_lat` without `-R`/rdma_cm, perftest 5.70 and later), so a
//! fastwake end can face `ib_send_lat` as well as another fastwake end.
//!
//! Every step is one exchange of fixed-size messages in lockstep: the
//! client writes first and then reads, the server reads first and then
//! writes (perftest's `ctx_xchg_data` / `ctx_hand_shake`):
//!
//! | step | bytes each way | content |
//! |---|---|---|
//! | version | 16 | `"6.06"` NUL-padded (perftest: its `VERSION`); fastwake adds `"fastwake N"` after the NUL, where perftest's `atof` does not look |
//! | fastwake params (fastwake peers only) | 4 + len | length-prefixed text: the run parameters both ends must agree on, and who the end is |
//! | cycle buffer, cache line | 4, 4 | big-endian ints (perftest's `check_sys_data`; unused here) |
//! | MTU | 2 | `"3\0"`: an `IBV_MTU_*` number as text; both use the smaller |
//! | keys, once per QP | 108 (59 without GID) | `KEY_PRINT_FMT_GID`: `lid:out_reads:qpn:psn:rkey:vaddr:gid0:…:gid15:srqn:` in hex, NUL-terminated |
//! | sync | as keys | the same keys again (perftest's hand shakes before and after connecting, and before each size) |
//! | close | keys, then `"done\0"` | perftest's `ctx_close_connection` |
//!
//! Errors are one line naming the peer and the step; every read has a
//! timeout, so a silent peer cannot hang an end.

use fastwake::{Fail, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// perftest's default TCP port (`DEF_PORT`).
pub const DEFAULT_PORT: u16 = 18515;
/// The perftest version this end announces. Below 6.28, so a newer
/// perftest skips its parameter negotiation (`negotiate_params`), which
/// this end does not speak; at least 5.70, which perftest requires.
pub const PERFTEST_VERSION: &str = "6.06";
/// The oldest perftest that speaks this exchange (`check_version_compatibility`).
pub const PERFTEST_OLDEST: f64 = 5.70;
/// fastwake's own protocol revision, after the NUL of the version message.
pub const FASTWAKE_PROTO: u32 = 1;
const VERSION_LEN: usize = 16;
/// perftest's `KEY_MSG_SIZE_GID` and `KEY_MSG_SIZE`.
pub const KEY_LEN_GID: usize = 108;
pub const KEY_LEN: usize = 59;
/// How long any one read of the exchange may wait.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client tries to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Who the peer is, from its version message.
#[derive(Debug, Clone, PartialEq)]
pub enum Peer {
    /// Another fastwake end (its protocol revision).
    Fastwake(u32),
    /// perftest (`ib_send_lat`), its version.
    Perftest(String),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Fastwake(_) => write!(f, "fastwake"),
            Peer::Perftest(v) => write!(f, "perftest {v}"),
        }
    }
}

/// perftest's `struct pingpong_dest` as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    pub lid: u16,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
}

impl Dest {
    /// The message perftest's `ethernet_write_keys` sends: with the GID
    /// (`gid`: perftest has a GID index, always on RoCE) or without.
    pub fn encode(&self, gid: bool) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        if gid {
            for b in self.gid {
                s.push_str(&format!("{b:02x}:"));
            }
            s.push_str(&format!("{:08x}:", self.srqn));
        } else {
            s.push_str(&format!("{:08x}", self.srqn));
        }
        let mut v = s.into_bytes();
        v.resize(if gid { KEY_LEN_GID } else { KEY_LEN }, 0);
        v
    }

    /// Parse a keys message (`gid`: with the GID part).
    pub fn decode(msg: &[u8], gid: bool) -> std::result::Result<Dest, String> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| "not text".to_string())?;
        let f: Vec<&str> = text.split(':').collect();
        let want = if gid { 23 } else { 7 };
        if f.len() < want || f[..want].iter().any(|x| x.is_empty()) {
            return Err(format!("{} fields, expected {want}", f.len()));
        }
        let hex = |i: usize| {
            u64::from_str_radix(f[i], 16).map_err(|_| format!("field {i} '{}' is not hex", f[i]))
        };
        let mut d = Dest {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u32,
            qpn: hex(2)? as u32,
            psn: hex(3)? as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            ..Dest::default()
        };
        if gid {
            for i in 0..16 {
                d.gid[i] = hex(6 + i)? as u8;
            }
            d.srqn = hex(22)? as u32;
        } else {
            d.srqn = hex(6)? as u32;
        }
        Ok(d)
    }

    /// True for an IPv4-mapped GID (perftest's `ipv6_addr_v4mapped`).
    pub fn v4_mapped(&self) -> bool {
        self.gid[..10] == [0; 10] && self.gid[10..12] == [0xff, 0xff]
    }
}

/// The version message this end sends.
pub fn version_message() -> [u8; VERSION_LEN] {
    let mut m = [0u8; VERSION_LEN];
    let text = format!("{PERFTEST_VERSION}\0fastwake {FASTWAKE_PROTO}");
    m[..text.len()].copy_from_slice(text.as_bytes());
    m
}

/// Who sent version message `m`; `Err` with a description of the bytes
/// when it is not a version message at all.
pub fn parse_version(m: &[u8]) -> std::result::Result<Peer, String> {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    let v = &m[..end];
    let looks = !v.is_empty()
        && v[0].is_ascii_digit()
        && v.iter().all(|&b| b.is_ascii_digit() || b == b'.')
        && std::str::from_utf8(v).is_ok_and(|s| s.parse::<f64>().is_ok());
    if !looks {
        let shown: String = m
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        return Err(format!(
            "its first bytes are \"{}\"",
            shown.trim_end_matches('.')
        ));
    }
    let version = String::from_utf8_lossy(v).into_owned();
    let rest = &m[(end + 1).min(m.len())..];
    let rest_end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let tail = String::from_utf8_lossy(&rest[..rest_end]);
    if let Some(n) = tail.strip_prefix("fastwake ") {
        let n = n
            .trim()
            .parse()
            .map_err(|_| format!("fastwake protocol '{n}'"))?;
        return Ok(Peer::Fastwake(n));
    }
    Ok(Peer::Perftest(version))
}

/// One end of the exchange: a connected socket and which side it is.
pub struct Conn<S: Read + Write> {
    sock: S,
    /// The client writes first in every exchange.
    pub client: bool,
    /// The peer, for messages (`10.0.2.15:18515`).
    pub peer_name: String,
}

impl Conn<TcpStream> {
    /// Connect to `host:port` as the client.
    pub fn connect(host: &str, port: u16) -> Result<Conn<TcpStream>> {
        let name = format!("{host}:{port}");
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .map_err(|e| Fail::new(libc::EHOSTUNREACH, format!("cannot resolve {host}: {e}")))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                Ok(s) => return Conn::new(s, true, name),
                Err(e) => last = Some(e),
            }
        }
        let why = last.map_or("no address".to_string(), |e| e.to_string());
        Err(Fail::new(
            libc::ECONNREFUSED,
            format!(
                "cannot connect to {name}: {why} (start the server first: `fastwake bench pingpong --source verbs` or `ib_send_lat` there)"
            ),
        ))
    }

    /// Listen on `port` and accept one client. `on_listen` runs once the
    /// socket listens (to say so).
    pub fn accept(port: u16, on_listen: impl FnOnce()) -> Result<Conn<TcpStream>> {
        let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
            Fail::new(
                libc::EADDRINUSE,
                format!("cannot listen on TCP port {port}: {e}"),
            )
        })?;
        on_listen();
        let (s, addr) = l
            .accept()
            .map_err(|e| Fail::new(libc::EIO, format!("accept on TCP port {port}: {e}")))?;
        Conn::new(s, false, addr.to_string())
    }

    fn new(s: TcpStream, client: bool, peer_name: String) -> Result<Conn<TcpStream>> {
        s.set_read_timeout(Some(READ_TIMEOUT))?;
        s.set_write_timeout(Some(READ_TIMEOUT))?;
        let _ = s.set_nodelay(true);
        Ok(Conn {
            sock: s,
            client,
            peer_name,
        })
    }
}

impl<S: Read + Write> Conn<S> {
    /// Wrap an already connected stream (tests).
    #[cfg(test)]
    pub fn from_stream(sock: S, client: bool, peer_name: &str) -> Conn<S> {
        Conn {
            sock,
            client,
            peer_name: peer_name.to_string(),
        }
    }

    fn fail(&self, step: &str, why: impl std::fmt::Display) -> Fail {
        Fail::new(
            libc::EPROTO,
            format!("exchange with {} ({step}): {why}", self.peer_name),
        )
    }

    fn read_n(&mut self, n: usize, step: &str) -> Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.sock.read(&mut b[got..]) {
                Ok(0) => {
                    return Err(self.fail(
                        step,
                        format!("the peer closed the connection after {got} of {n} bytes"),
                    ));
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(self.fail(
                        step,
                        format!("no answer within {} s", READ_TIMEOUT.as_secs()),
                    ));
                }
                Err(e) => return Err(self.fail(step, e)),
            }
        }
        Ok(b)
    }

    fn write(&mut self, m: &[u8], step: &str) -> Result<()> {
        self.sock
            .write_all(m)
            .and_then(|_| self.sock.flush())
            .map_err(|e| self.fail(step, e))
    }

    /// One lockstep exchange of `mine` against `theirs_len` bytes.
    fn xchg(&mut self, mine: &[u8], theirs_len: usize, step: &str) -> Result<Vec<u8>> {
        if self.client {
            self.write(mine, step)?;
            self.read_n(theirs_len, step)
        } else {
            let r = self.read_n(theirs_len, step)?;
            self.write(mine, step)?;
            Ok(r)
        }
    }

    /// The version step: who the peer is. Refuses a peer that is neither,
    /// a perftest older than 5.70 and another fastwake protocol.
    pub fn versions(&mut self) -> Result<Peer> {
        let r = self.xchg(&version_message(), VERSION_LEN, "version")?;
        let peer = parse_version(&r).map_err(|why| {
            self.fail(
                "version",
                format!("the peer speaks neither perftest's nor fastwake's protocol ({why})"),
            )
        })?;
        match &peer {
            Peer::Fastwake(n) if *n != FASTWAKE_PROTO => Err(self.fail(
                "version",
                format!(
                    "the peer speaks fastwake protocol {n}, this end {FASTWAKE_PROTO}: run the same fastwake version on both ends"
                ),
            )),
            Peer::Perftest(v) if v.parse::<f64>().unwrap_or(0.0) < PERFTEST_OLDEST - 1e-9 => {
                Err(self.fail(
                    "version",
                    format!("perftest {v} is older than {PERFTEST_OLDEST:.2}, which this exchange needs"),
                ))
            }
            _ => Ok(peer),
        }
    }

    /// A length-prefixed blob (fastwake peers only).
    pub fn blob(&mut self, mine: &[u8], step: &str) -> Result<Vec<u8>> {
        let mut m = (mine.len() as u32).to_be_bytes().to_vec();
        m.extend_from_slice(mine);
        let read_blob = |c: &mut Self| -> Result<Vec<u8>> {
            let l = c.read_n(4, step)?;
            let n = u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize;
            if n > 16 << 20 {
                return Err(c.fail(step, format!("a {n}-byte message")));
            }
            c.read_n(n, step)
        };
        if self.client {
            self.write(&m, step)?;
            read_blob(self)
        } else {
            let r = read_blob(self)?;
            self.write(&m, step)?;
            Ok(r)
        }
    }

    /// perftest's `check_sys_data`: cycle buffer and cache line size.
    pub fn sys_data(&mut self) -> Result<()> {
        self.xchg(&4096i32.to_be_bytes(), 4, "cycle buffer")?;
        self.xchg(&64i32.to_be_bytes(), 4, "cache line size")?;
        Ok(())
    }

    /// perftest's `check_mtu`: both send their `IBV_MTU_*` as text and use
    /// the smaller (a peer's value outside 1..=5 is ignored, as perftest
    /// does).
    pub fn mtu(&mut self, mine: u32) -> Result<u32> {
        let mut m = [0u8; 2];
        m[0] = b'0' + mine.min(9) as u8;
        let r = self.xchg(&m, 2, "mtu")?;
        let theirs = (r[0] as char).to_digit(10).unwrap_or(0);
        Ok(if (1..=5).contains(&theirs) && theirs < mine {
            theirs
        } else {
            mine
        })
    }

    /// perftest's `ctx_hand_shake`: exchange keys.
    pub fn keys(&mut self, mine: &Dest, gid: bool, step: &str) -> Result<Dest> {
        let len = if gid { KEY_LEN_GID } else { KEY_LEN };
        let r = self.xchg(&mine.encode(gid), len, step)?;
        Dest::decode(&r, gid).map_err(|why| self.fail(step, format!("bad keys message: {why}")))
    }

    /// perftest's `ctx_close_connection`: a last hand shake, then "done"
    /// both ways (perftest writes its "done" without reading ours; reading
    /// it here lets the connection end without a reset).
    pub fn close(&mut self, mine: &Dest, gid: bool) -> Result<()> {
        self.keys(mine, gid, "close")?;
        self.write(b"done\0", "close")?;
        let _ = self.read_n(5, "close");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_in_perftests_format() {
        let d = Dest {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0,
            vaddr: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15],
            srqn: 0,
        };
        let m = d.encode(true);
        assert_eq!(m.len(), KEY_LEN_GID);
        assert_eq!(
            std::str::from_utf8(&m[..107]).unwrap(),
            "0000:0001:000011:abcdef:00000000:0000000000000000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f:00000000:"
        );
        assert_eq!(m[107], 0);
        assert_eq!(Dest::decode(&m, true).unwrap(), d);
        assert!(d.v4_mapped());
        let m = d.encode(false);
        assert_eq!(m.len(), KEY_LEN);
        assert_eq!(
            std::str::from_utf8(&m[..58]).unwrap(),
            "0000:0001:000011:abcdef:00000000:0000000000000000:00000000"
        );
        let back = Dest::decode(&m, false).unwrap();
        assert_eq!((back.qpn, back.psn, back.gid), (0x11, 0xabcdef, [0; 16]));
    }

    #[test]
    fn versions_are_told_apart() {
        assert_eq!(
            parse_version(&version_message()),
            Ok(Peer::Fastwake(FASTWAKE_PROTO))
        );
        let mut p = [0u8; 16];
        p[..4].copy_from_slice(b"6.06");
        assert_eq!(parse_version(&p), Ok(Peer::Perftest("6.06".into())));
        let e = parse_version(b"SSH-2.0-OpenSSH_").unwrap_err();
        assert!(e.contains("SSH-2.0-OpenSSH_"), "{e}");
        assert!(parse_version(&[0u8; 16]).is_err());
        // What perftest's atof reads of ours: the number before the NUL.
        let m = version_message();
        let n = m.iter().position(|&b| b == 0).unwrap();
        assert_eq!(std::str::from_utf8(&m[..n]).unwrap(), PERFTEST_VERSION);
    }

    #[test]
    fn bad_keys_are_one_line() {
        let e = Dest::decode(b"hello\0", true).unwrap_err();
        assert!(e.contains("expected 23"), "{e}");
        let mut m = Dest::default().encode(true);
        m[0] = b'z';
        assert!(Dest::decode(&m, true).unwrap_err().contains("not hex"));
    }
}
