//! Fetching remote objects by key over RDMA: one READ, two dependent READs
//! or an RPC, chosen per request from what each path costs now.
//!
//! The best way to fetch remote data changes with the object's size, with
//! the load on the server's CPU and with the NIC's: two dependent READs
//! beat a SEND/SEND RPC for small objects on one NIC and lose above a
//! size that differs per NIC, and under a loaded server CPU one RPC is
//! much slower than even two READs. So the client measures and chooses.
//!
//! - [`server`]: a [`Server`] keeps a [`table`] of objects in memory its
//!   clients may READ (an index of buckets with key, address, length and
//!   version, and the objects) and one RPC thread that answers lookups,
//!   waiting through fastwake's engine, and publishes its load.
//! - [`client`]: a [`Client`] fetches by key by READ (address cached),
//!   READ-2 (buckets, then object) or RPC; every path returns the same
//!   bytes, a torn READ is never returned, a missing key is not-found on
//!   every path, and every fetch ends within its timeout.
//! - [`chooser`]: the pure decision of which path, per size class, from
//!   the fetches' own costs and the server's load word.
//! - [`wire`]: the RPC's messages.
//!
//! [`pair`] makes a server and a connected client in one process (tests,
//! the Soft-RoCE guest, `fastwake bench fetch`); more clients of a server
//! come from [`connect`]. Two processes exchange [`Client::endpoint`],
//! [`Server::accept`]'s answer and [`Server::remote`] out of band.

pub mod chooser;
pub mod client;
pub mod server;
pub mod table;
pub mod wire;

pub use chooser::{Chooser, Load, Path, Policy, Why};
pub use client::{Client, ClientConfig, ClientStats};
pub use server::{Remote, Server, ServerConfig, ServerStats};

use crate::Result;
use crate::source::verbs::Device;
use std::sync::Arc;

/// A client of `server` (on `dev`, in this process), connected.
pub fn connect(server: &Server, dev: &Arc<Device>, cfg: ClientConfig) -> Result<Client> {
    let client = Client::new(dev, cfg, server.remote())?;
    let ep = server.accept(&client.endpoint())?;
    client.connect(&ep)?;
    Ok(client)
}

/// A server and one connected client on `dev`, in this process.
pub fn pair(
    dev: &Arc<Device>,
    server: ServerConfig,
    client: ClientConfig,
) -> Result<(Server, Client)> {
    let s = Server::new(dev, server)?;
    let c = connect(&s, dev, client)?;
    Ok((s, c))
}
