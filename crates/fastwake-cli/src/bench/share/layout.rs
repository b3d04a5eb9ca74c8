//! Where the client and the server ends run.

use fastwake::{Fail, Result};

/// Where things run.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) client_cpu: u32,
    pub(super) server_cpus: Vec<u32>,
}

impl Layout {
    pub(super) fn new(cores: usize) -> Result<Layout> {
        let n = fastwake::cpu::online() as usize;
        if cores == 0 || cores >= n {
            return Err(Fail::invalid(format!(
                "--cores must be between 1 and {} on this host ({n} CPUs; one is kept for the client)",
                n.saturating_sub(1)
            )));
        }
        Ok(Layout {
            client_cpu: 0,
            server_cpus: ((n - cores) as u32..n as u32).collect(),
        })
    }
}
