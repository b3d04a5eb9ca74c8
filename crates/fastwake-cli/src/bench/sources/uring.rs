//! Ping-pong over a TCP connection (loopback or veth) where each end
//! receives through io_uring: one `recv` SQE always in flight, completions
//! taken from a [`UringSource`] in the case's mode. Sends are plain `send`
//! calls, so the completion queue holds only receive completions.

use super::net::{self, Net, Veth};
use crate::bench::harness::End;
use fastwake::source::uring::{UringSource, UringWake};
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

const RECV: u64 = 1;

pub struct UringEnd {
    src: UringSource,
    sock: OwnedFd,
    waiter: Waiter,
    payload: Vec<u8>,
    msg: usize,
    /// Receive buffer; the in-flight SQE points into it, so it is boxed
    /// (stable when the end moves) and outlives the SQE (see Drop).
    buf: Box<[u8]>,
    have: usize,
    in_flight: bool,
    _net: Option<Arc<Veth>>,
}

impl UringEnd {
    fn post_recv(&mut self) -> Result<()> {
        let free = &mut self.buf[self.have..];
        if free.is_empty() {
            // A zero-length recv would complete with 0, read as EOF.
            return Err(Fail::new(libc::ENOBUFS, "uring: receive buffer full"));
        }
        // SAFETY: the buffer region stays valid and untouched until the
        // CQE for this request is taken (one recv in flight at a time; Drop
        // waits for it).
        unsafe {
            self.src.recv(
                self.sock.as_fd(),
                free.as_mut_ptr(),
                free.len() as u32,
                RECV,
            )?
        };
        self.in_flight = true;
        Ok(())
    }
}

impl End for UringEnd {
    fn wait_stats(&self) -> Option<fastwake::wait::WaitStats> {
        Some(self.waiter.stats())
    }

    fn send(&mut self) -> Result<()> {
        let mut off = 0;
        while off < self.payload.len() {
            match rustix::net::send(
                &self.sock,
                &self.payload[off..],
                rustix::net::SendFlags::NOSIGNAL,
            ) {
                Ok(n) => off += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Fail::os("send", e)),
            }
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<()> {
        while self.have < self.msg {
            let cqe = self.waiter.wait(&mut self.src)?;
            self.in_flight = false;
            let res = cqe.result();
            match res {
                0 => return Err(Fail::closed("uring: peer closed the connection")),
                r if r == -libc::EINTR || r == -libc::EAGAIN => {}
                r if r < 0 => {
                    return Err(Fail::new(
                        -r,
                        format!("io_uring recv: {}", std::io::Error::from_raw_os_error(-r)),
                    ));
                }
                r => self.have += r as usize,
            }
            if self.have < self.msg {
                self.post_recv()?;
            }
        }
        if self.buf[..self.msg] != self.payload[..] {
            return Err(Fail::new(libc::EPROTO, "uring: torn message"));
        }
        self.buf.copy_within(self.msg..self.have, 0);
        self.have -= self.msg;
        self.post_recv()
    }
}

impl Drop for UringEnd {
    fn drop(&mut self) {
        // The kernel may still write into `buf` for the in-flight recv: end
        // it (shutdown completes it) and take its CQE before freeing.
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        let mut w = Waiter::new(WaitMode::Interrupt);
        while self.in_flight {
            match w.wait_timeout(&mut self.src, Duration::from_secs(1)) {
                Ok(Some(c)) if c.user_data() == RECV => self.in_flight = false,
                Ok(Some(_)) => {}
                // Leak rather than free memory the kernel may still use.
                _ => {
                    std::mem::forget(std::mem::take(&mut self.buf));
                    break;
                }
            }
        }
    }
}

/// A connected pair of ends waiting in `mode`.
pub fn pair(
    mode: WaitMode,
    size: usize,
    net: Net,
    wake: UringWake,
) -> Result<(UringEnd, UringEnd)> {
    let link = net::connect(net)?;
    let msg = size.max(1);
    let mk = |fd: OwnedFd, keep| -> Result<UringEnd> {
        let mut src = UringSource::new(8, wake)?;
        src.watch_peer(fd.as_fd())?;
        let mut e = UringEnd {
            src,
            sock: fd,
            waiter: Waiter::new(mode),
            payload: vec![0x5a; msg],
            msg,
            buf: vec![0; msg * 64].into_boxed_slice(),
            have: 0,
            in_flight: false,
            _net: keep,
        };
        e.post_recv()?;
        Ok(e)
    };
    let a = mk(link.a, link.keep.clone())?;
    let b = mk(link.b, link.keep)?;
    Ok((a, b))
}
