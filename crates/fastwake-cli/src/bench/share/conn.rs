//! What a connection is to the benchmark: a server end (a source to wait
//! on, and a way to answer what it delivered), a client end (send a tagged
//! request, look for the reply without blocking), and a `Wire` that makes
//! N pairs of them. The servers, the client and the measurement loop are
//! generic over these, so each source is compiled into its own copy and
//! the channel's path is the code it was before sockets came.
//!
//! The channel's implementation is here; the sockets' is in
//! [`super::sockets`].

use fastwake::Result;
use fastwake::source::Source;
use fastwake::source::channel::{self, Config as ChanConfig, Receiver, Sender};

/// The server's end of one connection.
pub(super) trait ServerEnd: Send + 'static {
    type Src: Source + Send;

    /// The source the server waits on.
    fn source(&mut self) -> &mut Self::Src;

    /// Answer the request just taken with the same tag and payload.
    fn echo(&mut self, m: <Self::Src as Source>::Completion) -> Result<()>;

    /// `evloop`: one thread serving `ends` by busy-polling them all, until
    /// every one is closed.
    fn event_loop(ends: Vec<Self>) -> Result<()>
    where
        Self: Sized;
}

/// The client's end of one connection.
pub(super) trait ClientLink: Send {
    fn send(&mut self, tag: u64, payload: &[u8]) -> Result<()>;

    /// The tag of the reply that has come, if one has (never blocks).
    fn poll(&mut self) -> Result<Option<u64>>;
}

/// Makes the connections of one slice.
pub(super) trait Wire: Clone + Send + 'static {
    type Server: ServerEnd;
    type Client: ClientLink;

    /// The `source` field of the rows.
    fn name(&self) -> &'static str;

    /// `n` connected pairs, client end first.
    fn connect(&self, n: usize) -> Result<Vec<(Self::Client, Self::Server)>>;
}

/// A pair of shared-memory channels (request, response).
#[derive(Clone, Copy)]
pub(super) struct Channels(pub(super) ChanConfig);

pub(super) struct ChannelServer {
    rx: Receiver,
    tx: Sender,
}

pub(super) struct ChannelClient {
    tx: Sender,
    rx: Receiver,
}

impl Wire for Channels {
    type Server = ChannelServer;
    type Client = ChannelClient;

    fn name(&self) -> &'static str {
        "channel"
    }

    fn connect(&self, n: usize) -> Result<Vec<(ChannelClient, ChannelServer)>> {
        (0..n)
            .map(|_| {
                let (req_tx, req_rx) = channel::channel(self.0)?;
                let (resp_tx, resp_rx) = channel::channel(self.0)?;
                Ok((
                    ChannelClient {
                        tx: req_tx,
                        rx: resp_rx,
                    },
                    ChannelServer {
                        rx: req_rx,
                        tx: resp_tx,
                    },
                ))
            })
            .collect()
    }
}

impl ClientLink for ChannelClient {
    #[inline]
    fn send(&mut self, tag: u64, payload: &[u8]) -> Result<()> {
        self.tx.send(tag, payload)
    }

    #[inline]
    fn poll(&mut self) -> Result<Option<u64>> {
        if !self.rx.ready() {
            return Ok(None);
        }
        Ok(self.rx.try_take()?.map(|m| m.tag))
    }
}

impl ServerEnd for ChannelServer {
    type Src = Receiver;

    #[inline]
    fn source(&mut self) -> &mut Receiver {
        &mut self.rx
    }

    fn echo(&mut self, m: channel::Msg) -> Result<()> {
        let (rx, tx) = (&mut self.rx, &mut self.tx);
        let payload_len = m.len as usize;
        let mut buf = [0u8; 64];
        let n = payload_len.min(buf.len());
        buf[..n].copy_from_slice(&rx.payload()[..n]);
        if payload_len > buf.len() {
            let p = rx.payload().to_vec();
            return tx.send(m.tag, &p);
        }
        tx.send(m.tag, &buf[..n])
    }

    fn event_loop(mut ends: Vec<ChannelServer>) -> Result<()> {
        let mut n: u32 = 0;
        while !ends.is_empty() {
            n = n.wrapping_add(1);
            let mut closed = None;
            for (j, e) in ends.iter_mut().enumerate() {
                // A close shows only through try_take.
                if !e.rx.ready() && !n.is_multiple_of(1024) {
                    continue;
                }
                match e.rx.try_take() {
                    Ok(Some(m)) => e.echo(m)?,
                    Ok(None) => {}
                    Err(e) if e.is_closed() => closed = Some(j),
                    Err(e) => return Err(e),
                }
            }
            if let Some(j) = closed {
                ends.swap_remove(j);
            }
        }
        Ok(())
    }
}
