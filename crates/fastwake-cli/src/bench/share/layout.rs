//! Where the client threads and the server ends run.

use fastwake::{Fail, Result};

/// Where things run: the client threads on the first CPUs, one each, the
/// server ends on the last K.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) client_cpus: Vec<u32>,
    pub(super) server_cpus: Vec<u32>,
}

impl Layout {
    pub(super) fn new(cores: usize, clients: usize) -> Result<Layout> {
        let n = fastwake::cpu::online() as usize;
        if clients == 0 || clients >= n {
            return Err(Fail::invalid(format!(
                "--clients must be between 1 and {} on this host ({n} CPUs; one is kept for the server)",
                n.saturating_sub(1)
            )));
        }
        if cores == 0 || cores + clients > n {
            return Err(Fail::invalid(format!(
                "--cores must be between 1 and {} on this host ({n} CPUs, {clients} kept for the client threads)",
                n - clients
            )));
        }
        Ok(Layout {
            client_cpus: (0..clients as u32).collect(),
            server_cpus: ((n - cores) as u32..n as u32).collect(),
        })
    }

    /// The first client thread's CPU (the one that measures, and where a
    /// `threads:cross` dispatcher runs).
    pub(super) fn client_cpu(&self) -> u32 {
        self.client_cpus[0]
    }
}
