//! fastwake: interrupt-mode I/O with polling-class latency on stock Linux.
//!
//! Microsecond I/O completes faster than Linux wakes a sleeping thread. fastwake
//! separates *where completions come from* ([`source`]) from *how a thread waits
//! for them* ([`wait`]), so every wait mode (poll, interrupt, hybrid, dispatch
//! and adaptive) works on every completion source.
//!
//! The one rule every blocking wait must follow — arm the notification, look
//! again, only then sleep — lives in exactly one place,
//! [`source::block_until_ready`], and the type system makes it the only way to
//! put a source to sleep (see [`source::Rechecked`]).
//!
//! Layout (one concept per module):
//! - [`source`]: the completion-source contract and its implementations
//!   ([`source::channel`]: the shared-memory ring with a doorbell, which
//!   also dates its rings so sleepers measure their wake-up;
//!   [`source::verbs`]: an RDMA CQ with its completion channel;
//!   [`source::socket`]: a stream socket; [`source::uring`]: an io_uring
//!   CQ ring; [`source::ring`]: a ring the caller owns and reaps, such as
//!   a liburing CQ, waited on until it is non-empty).
//! - [`wait`]: wait modes and the [`wait::Waiter`] that applies them.
//! - [`dispatch`]: the per-core dispatcher with direct hand-off, for tasks
//!   and for ordinary threads ([`WaitMode::Dispatch`]).
//! - [`adaptive`]: the controller behind [`WaitMode::Adaptive`] (learned
//!   spin budget, CPU cap, pressure sampler).
//! - [`cpu`]: CPU placement helpers (pinning, current CPU).
//! - [`affinity`]: completion-vector / IRQ placement for RDMA CQs.
//! - [`fetch`]: objects by key over RDMA by one READ, two dependent READs
//!   or an RPC, the path chosen per fetch from what each costs now.
//! - [`grammar`]: the value forms (durations, CPU shares) every front end
//!   parses options with.
//! - [`stall`]: the verbs completion-latency monitor's tables and judgement
//!   (stalls, episodes, likely causes), fed by the preload shim.
//! - [`preload_stats`]: the shared-memory layout of the preload shim's live
//!   counters (written by the shim, read by `fastwake stats`).
//! - [`Fail`]: the error type.
//!
//! Examples (`cargo run --release --example NAME`): `pingpong` (any wait
//! mode over two channels), `tasks_echo` (the task runtime), `dispatch_threads`
//! (threads in dispatch mode), `hops` (a round trip split by direction).
//! Not yet: wake-up measurement on sources other than the channel.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
pub mod affinity;
pub mod cpu;
pub mod dispatch;
mod error;
pub mod fetch;
mod fork;
pub mod grammar;
pub mod lanes;
pub mod preload_stats;
pub mod slice;
pub mod source;
pub mod stall;
mod sync;
pub mod wait;

pub use error::{Fail, Result};
pub use source::Source;
pub use wait::{WaitMode, Waiter};
