//! Fetching remote objects by key over RDMA: one READ, two dependent READs
//! or an RPC, chosen per request from what each path costs now.

pub mod chooser;

pub use chooser::{Chooser, Load, Path, Policy, Why};
