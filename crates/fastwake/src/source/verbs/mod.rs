//! RDMA verbs completion source: a CQ plus its completion channel.
//!
//! libibverbs is loaded at run time ([`loader`]), so everything here builds
//! and runs on hosts without rdma-core; there the first call returns one
//! [`crate::Fail`] line ("no RDMA verbs: cannot load libibverbs.so.1 …" or
//! "no RDMA device found …").
//!
//! Layout (control path vs data path, as in rdma-core):
//! - the `fastwake-verbs-sys` crate: the hand-written `#[repr(C)]` verbs
//!   structs (ABI of libibverbs.so.1; checked against the installed header
//!   by its `tests/verbs_abi.rs`), shared with the preload shim.
//! - [`loader`]: dlopen + versioned dlsym of the control-path entry points.
//! - [`device`]: open a device, PD, port 1, GID choice.
//! - [`cq`]: [`VerbsCq`], the [`crate::Source`]: peek = `poll_cq` into a
//!   stash, arm = `req_notify_cq`, sleep = channel fd + `ibv_get_cq_event`
//!   with batched acks; the completion vector comes from
//!   [`crate::affinity`].
//! - [`caller`]: [`CallerCq`], a CQ and channel the *caller* created and
//!   keeps, as a source (the C ABI's `fw_verbs_cq`), and [`vector_for_cpu`]
//!   for a CQ the caller creates.
//! - [`shared`]: [`SharedCq`], one CQ and channel for the QPs of one
//!   core, demultiplexed into an inbox per QP ([`crate::source::demux`]),
//!   so a dispatcher polls one CQ whatever the number of connections.
//! - [`qp`]: RC QPs and registered memory, for SEND/RECV ping-pong.
//! - [`odp`]: a device's On-Demand-Paging capabilities and the ODP guard's
//!   policy.

pub mod caller;
pub mod cq;
pub mod device;
pub mod loader;
pub mod monitor;
pub mod odp;
pub mod qp;
pub mod shared;

/// The libibverbs ABI, from its own crate (see [`fastwake_verbs_sys`]).
use fastwake_verbs_sys as sys;

pub use caller::{CallerCq, vector_for_cpu};
pub use cq::{CqConfig, CqStats, Vector, VerbsCq, Wc};
pub use device::{Device, device_names};
pub use monitor::{Stall, StallStats, set_stall_threshold, stall_threshold};
pub use qp::{Endpoint, Mr, RcQp};
pub use shared::{CqRef, Route, SharedCq};
