//! fastwake: interrupt-mode I/O with polling-class latency on stock Linux.
//!
//! Microsecond I/O completes faster than Linux wakes a sleeping thread. fastwake
//! separates *where completions come from* ([`source`]) from *how a thread waits
//! for them* ([`wait`]), so every wait mode (poll, interrupt, hybrid, and later
//! dispatch and adaptive) works on every completion source.
//!
//! The one rule every blocking wait must follow — arm the notification, look
//! again, only then sleep — lives in exactly one place,
//! [`source::block_until_ready`], and the type system makes it the only way to
//! put a source to sleep (see [`source::Rechecked`]).
//!
//! Layout (one concept per module):
//! - [`source`]: the completion-source contract and its implementations
//!   ([`source::channel`]: the shared-memory ring with a doorbell;
//!   [`source::verbs`]: an RDMA CQ with its completion channel).
//! - [`wait`]: wait modes and the [`wait::Waiter`] that applies them.
//! - [`dispatch`]: the per-core dispatcher with direct hand-off, for tasks
//!   and for ordinary threads ([`WaitMode::Dispatch`]).
//! - [`adaptive`]: the controller behind [`WaitMode::Adaptive`] (learned
//!   spin budget, CPU cap, pressure sampler).
//! - [`cpu`]: CPU placement helpers (pinning, current CPU).
//! - [`affinity`]: completion-vector / IRQ placement for RDMA CQs.
//! - [`Fail`]: the error type.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
pub mod affinity;
pub mod cpu;
pub mod dispatch;
mod error;
pub mod source;
mod sync;
pub mod wait;

pub use error::{Fail, Result};
pub use source::Source;
pub use wait::{WaitMode, Waiter};
