//! The network path under the tcp and uring ping-pong sources: loopback, or
//! a veth pair between two network namespaces the benchmark creates and
//! removes itself.
//!
//! The veth addresses exist only inside those two namespaces, so no packet
//! can leave the machine. Sockets are created by short-lived threads that
//! first enter a namespace (a socket belongs to its creator's namespace for
//! life); the namespaces are deleted when the last end using them drops.

use fastwake::{Fail, Result};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};

/// Which path the two ends talk over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    Loopback,
    Veth,
}

impl std::str::FromStr for Net {
    type Err = Fail;
    fn from_str(s: &str) -> Result<Net> {
        match s {
            "loopback" | "lo" => Ok(Net::Loopback),
            "veth" => Ok(Net::Veth),
            _ => Err(Fail::invalid(format!(
                "unknown --net '{s}': expected loopback or veth"
            ))),
        }
    }
}

/// Server address inside namespace A (link-scoped to the veth pair).
const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);

/// Two namespaces joined by a veth pair; removed on drop.
pub struct Veth {
    ns_a: String,
    ns_b: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Fail::unsupported(format!("veth needs iproute2's 'ip' command: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(Fail::new(
        libc::EPERM,
        format!(
            "'ip {}' failed (veth needs root): {}",
            args.join(" "),
            err.lines().next().unwrap_or("?").trim()
        ),
    ))
}

/// Remove namespaces left by an earlier run that was killed before its
/// cleanup ran (their pid no longer exists).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("fastwake-a-")
            .or_else(|| name.strip_prefix("fastwake-b-"));
        if let Some(pid) = pid
            && pid.parse::<u32>().is_ok()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Veth {
    fn create() -> Result<Veth> {
        remove_stale();
        let pid = std::process::id();
        let v = Veth {
            ns_a: format!("fastwake-a-{pid}"),
            ns_b: format!("fastwake-b-{pid}"),
        };
        let (if_a, if_b) = (format!("fwa{pid}"), format!("fwb{pid}"));
        // From here on, Drop cleans up whatever was made.
        ip(&["netns", "add", &v.ns_a])?;
        ip(&["netns", "add", &v.ns_b])?;
        ip(&["link", "add", &if_a, "type", "veth", "peer", "name", &if_b])?;
        ip(&["link", "set", &if_a, "netns", &v.ns_a])?;
        ip(&["link", "set", &if_b, "netns", &v.ns_b])?;
        let a = format!("{ADDR_A}/30");
        let b = format!("{ADDR_B}/30");
        ip(&["-n", &v.ns_a, "addr", "add", &a, "dev", &if_a])?;
        ip(&["-n", &v.ns_b, "addr", "add", &b, "dev", &if_b])?;
        ip(&["-n", &v.ns_a, "link", "set", &if_a, "up"])?;
        ip(&["-n", &v.ns_b, "link", "set", &if_b, "up"])?;
        Ok(v)
    }

    /// The shared instance, created on first use, removed when the last
    /// user drops it.
    fn shared() -> Result<Arc<Veth>> {
        static CURRENT: Mutex<Weak<Veth>> = Mutex::new(Weak::new());
        let mut cur = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = cur.upgrade() {
            return Ok(v);
        }
        let v = Arc::new(Veth::create()?);
        *cur = Arc::downgrade(&v);
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting a namespace destroys its end of the veth, and with it the
        // other end. Failures here (already gone) need no report.
        let _ = ip(&["netns", "del", &self.ns_a]);
        let _ = ip(&["netns", "del", &self.ns_b]);
    }
}

/// Run `f` on a thread that first enters network namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || -> Result<T> {
        let fd = std::fs::File::open(&path).map_err(Fail::from)?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&fd),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| Fail::os(&format!("setns {path}"), e))?;
        f().map_err(Fail::from)
    })
    .join()
    .map_err(|_| Fail::new(libc::EIO, "netns helper thread panicked"))?
}

/// A connected TCP pair over `net`, plus what keeps the path alive.
pub struct Link {
    pub a: OwnedFd,
    pub b: OwnedFd,
    pub keep: Option<Arc<Veth>>,
}

pub fn connect(net: Net) -> Result<Link> {
    match net {
        Net::Loopback => {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Fail::from)?;
            let addr = l.local_addr().map_err(Fail::from)?;
            let b = TcpStream::connect(addr).map_err(Fail::from)?;
            let (a, _) = l.accept().map_err(Fail::from)?;
            Ok(Link {
                a: a.into(),
                b: b.into(),
                keep: None,
            })
        }
        Net::Veth => {
            let v = Veth::shared()?;
            let l = in_netns(&v.ns_a, || TcpListener::bind((ADDR_A, 0)))?;
            let addr: SocketAddr = l.local_addr().map_err(Fail::from)?;
            let b = in_netns(&v.ns_b, move || TcpStream::connect(addr))?;
            let (a, _) = l.accept().map_err(Fail::from)?;
            Ok(Link {
                a: a.into(),
                b: b.into(),
                keep: Some(v),
            })
        }
    }
}
