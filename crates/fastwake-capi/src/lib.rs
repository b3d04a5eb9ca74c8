//! The C ABI of fastwake (`include/fastwake.h`).
//!
//! Demikernel's conventions: functions return 0 or a positive errno, objects
//! are opaque boxes, and a one-line cause is kept per thread for
//! `fw_last_error`. No panic may cross the boundary: every entry point runs
//! inside [`guard`](boundary::guard), which turns a panic into `EIO`.

#![allow(non_camel_case_types)]
// the C names are the ABI
// The Rust side of a C ABI: its docs are for its maintainers (`cargo doc
// --document-private-items`), so they may link private items.
#![allow(rustdoc::private_intra_doc_links)]

mod boundary;
mod channel;
mod dispatcher;
mod fetch;
mod lanes;
mod ring;
mod shared_cq;
mod slice;
mod socket;
mod verbs;
mod waiter;

#[cfg(test)]
mod abi_sizes;

pub use boundary::fw_last_error;
pub use channel::*;
pub use dispatcher::*;
pub use fetch::*;
pub use lanes::*;
pub use ring::*;
pub use shared_cq::*;
pub use slice::*;
pub use socket::*;
pub use verbs::*;
pub use waiter::*;

/// ABI version; bump on any incompatible change to the header.
pub const FW_ABI_VERSION: u32 = 1;

#[unsafe(no_mangle)]
pub extern "C" fn fw_abi_version() -> u32 {
    FW_ABI_VERSION
}
