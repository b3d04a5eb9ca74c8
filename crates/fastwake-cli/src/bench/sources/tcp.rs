//! Ping-pong over a TCP connection (loopback or veth), each end a
//! [`SocketSource`] waited on in the case's mode.

use super::net::{self, Net, Veth};
use crate::bench::harness::End;
use fastwake::source::socket::{BusyPoll, SocketOptions, SocketSource};
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::sync::Arc;

pub struct TcpEnd {
    src: SocketSource,
    waiter: Waiter,
    payload: Vec<u8>,
    received: u64,
    _net: Option<Arc<Veth>>,
}

impl End for TcpEnd {
    fn wait_stats(&self) -> Option<fastwake::wait::WaitStats> {
        Some(self.waiter.stats())
    }

    fn send(&mut self) -> Result<()> {
        self.src.send(&self.payload)
    }

    fn recv(&mut self) -> Result<()> {
        let m = self.waiter.wait(&mut self.src)?;
        // A lost or duplicated message would show as a sequence gap, a torn
        // one as a wrong byte: fail instead of skewing a figure.
        if m.seq != self.received || self.src.message() != self.payload.as_slice() {
            return Err(Fail::new(
                libc::EPROTO,
                format!("tcp delivered message {} out of order or torn", m.seq),
            ));
        }
        self.received += 1;
        Ok(())
    }
}

/// A connected pair of ends waiting in `mode`, plus what busy polling does
/// (known after one warm-up exchange).
pub fn pair(
    mode: WaitMode,
    size: usize,
    net: Net,
    busy_poll_us: Option<u32>,
) -> Result<(TcpEnd, TcpEnd, BusyPoll)> {
    let link = net::connect(net)?;
    let opts = SocketOptions { busy_poll_us };
    let size = size.max(1);
    let mk = |fd, keep| -> Result<TcpEnd> {
        Ok(TcpEnd {
            src: SocketSource::new(fd, size, opts)?,
            waiter: Waiter::new(mode),
            payload: vec![0x5a; size],
            received: 0,
            _net: keep,
        })
    };
    let mut a = mk(link.a, link.keep.clone())?;
    let mut b = mk(link.b, link.keep)?;
    // One exchange so the sockets have seen traffic (busy-poll report,
    // peer CPU); the sequence checks count it like any other message.
    a.send()?;
    b.recv()?;
    b.send()?;
    a.recv()?;
    let busy = a.src.busy_poll();
    Ok((a, b, busy))
}
