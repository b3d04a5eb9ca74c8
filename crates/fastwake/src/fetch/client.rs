//! The client: fetch an object by key over one of three paths, the one the
//! [`Chooser`] picks or the one the caller names.
//!
//! - **READ**: the key's address is cached (from an earlier fetch): one
//!   READ of its slot, checked by its versions and checksum.
//! - **READ-2**: READ the key's window of buckets, then its slot.
//! - **RPC**: SEND the key; the RPC thread answers with a SEND of the
//!   object, its address (for the cache) and the load word.
//!
//! Every path returns the same bytes or a clear error: a torn READ is
//! READ again (at most [`ClientConfig::retries`] times, then the fetch
//! goes by RPC, which reads the table under the server's lock); a cached
//! address whose slot moved is dropped and the key looked up again; a
//! missing key is `Ok(false)` on every path. Every fetch ends within
//! [`ClientConfig::timeout`] of its start (`ETIMEDOUT` past it), whatever
//! the server does; a failed work completion (the server's QP is gone) is
//! `EIO` at once.
//!
//! The load word comes with every RPC reply, and on the READ paths with
//! one fetch in [`LOAD_EVERY`]: an unsignaled 8-byte READ of the table's
//! first word, posted before the fetch's own READ (RC completes them in
//! order, so the fetch's completion says both are done).

use super::chooser::{Chooser, Load, Path, Policy, UNKNOWN_SIZE, Why, class_of};
use super::server::Remote;
use super::table::{self, Lookup, Object, WINDOW_BYTES};
use super::wire::{REPLY_HEAD, REQUEST, Reply, Request, Status};
use crate::source::verbs::{CqConfig, Device, Endpoint, Mr, RcQp, VerbsCq, Wc};
use crate::{Fail, Result, WaitMode, Waiter};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receive buffers for replies.
const RECV_SLOTS: usize = 4;
/// Work request ids of receives carry this bit.
const RECV_BIT: u64 = 1 << 63;
/// One READ-path fetch in this many also READs the load word.
pub const LOAD_EVERY: u64 = 8;

/// How a [`Client`] fetches.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// The path: fixed or adaptive (see [`Policy`]).
    pub policy: Policy,
    /// How the client waits for its completions.
    pub mode: WaitMode,
    /// Longest a fetch may take, retries included.
    pub timeout: Duration,
    /// READs of a torn object or bucket before the fetch goes by RPC.
    pub retries: u32,
    /// Addresses cached at most (0: none, so never the one-READ path).
    pub cache: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            policy: Policy::default(),
            mode: WaitMode::Hybrid {
                budget: crate::wait::DEFAULT_BUDGET,
            },
            timeout: Duration::from_secs(1),
            retries: 8,
            cache: 1 << 16,
        }
    }
}

impl ClientConfig {
    /// One line per bad parameter.
    pub fn validate(&self) -> Result<()> {
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(60) {
            return Err(Fail::invalid(format!(
                "fetch client: timeout {:?}: expected more than 0 and at most 60s",
                self.timeout
            )));
        }
        Ok(())
    }
}

/// What a client did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClientStats {
    /// Fetches per path that returned (found or not).
    pub fetches: [u64; 3],
    /// Of those, keys not found.
    pub missing: u64,
    /// READs of a torn object or bucket, READ again.
    pub torn: u64,
    /// Cached addresses whose slot had moved (removed, another length).
    pub moved: u64,
    /// Fetches that went by RPC after `retries` torn READs.
    pub fallbacks: u64,
    /// Fetches that timed out.
    pub timeouts: u64,
    /// Late completions and replies (of fetches that timed out) skipped.
    pub late: u64,
    /// READs of the load word.
    pub load_reads: u64,
}

/// Offsets in the client's memory.
struct Layout {
    reply: usize,
    req: usize,
    read: usize,
    load: usize,
    bytes: usize,
}

impl Layout {
    fn new(max_object: usize) -> Layout {
        let reply = REPLY_HEAD + max_object.div_ceil(8) * 8;
        let req = RECV_SLOTS * reply;
        let read = req + REQUEST.div_ceil(8) * 8;
        let load = read + table::slot_bytes(max_object).max(WINDOW_BYTES);
        Layout {
            reply,
            req,
            read,
            load,
            bytes: load + 8,
        }
    }
}

/// A fetch client (see the module docs).
pub struct Client {
    // Dropped first: a CQ with a QP on it cannot be destroyed.
    qp: RcQp,
    cq: VerbsCq,
    mr: Mr,
    lay: Layout,
    waiter: Waiter,
    chooser: Chooser,
    cfg: ClientConfig,
    remote: Remote,
    cache: HashMap<u64, (u64, usize)>,
    scratch: Vec<u8>,
    next_wr: u64,
    next_id: u64,
    read_fetches: u64,
    load: Load,
    stats: ClientStats,
}

/// How a READ-path attempt ended.
enum Attempt {
    Done(bool),
    /// Torn too often: go by RPC.
    Fallback,
}

impl Client {
    /// A client of the server described by `remote`, not yet connected.
    pub fn new(dev: &Arc<Device>, cfg: ClientConfig, remote: Remote) -> Result<Client> {
        cfg.validate()?;
        let cq = VerbsCq::new(
            dev,
            CqConfig {
                entries: 256,
                ..CqConfig::default()
            },
        )?;
        let qp = RcQp::new(&cq, &cq, 64, 64)?;
        let lay = Layout::new(remote.max_object as usize);
        let mr = Mr::new(dev, lay.bytes)?;
        Ok(Client {
            qp,
            cq,
            mr,
            lay,
            waiter: Waiter::new(cfg.mode),
            chooser: Chooser::new(cfg.policy),
            cfg,
            remote,
            cache: HashMap::new(),
            scratch: Vec::new(),
            next_wr: 1,
            next_id: 1,
            read_fetches: 0,
            load: Load::default(),
            stats: ClientStats::default(),
        })
    }

    /// This client's QP endpoint (for [`super::Server::accept`]).
    pub fn endpoint(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// Connect to the server's QP and post the reply buffers.
    pub fn connect(&self, server: &Endpoint) -> Result<()> {
        self.qp.connect(server)?;
        for s in 0..RECV_SLOTS {
            self.qp.post_recv(
                RECV_BIT | s as u64,
                &self.mr,
                s * self.lay.reply,
                self.lay.reply,
            )?;
        }
        Ok(())
    }

    /// Fetch `key` into `out` by the policy's path: `Ok(true)` with the
    /// object in `out`, `Ok(false)` when the key is not in the table.
    pub fn fetch_into(&mut self, key: u64, out: &mut Vec<u8>) -> Result<bool> {
        self.fetch_by(key, None, out).map(|(found, _)| found)
    }

    /// [`Client::fetch_into`], returning a copy (`None`: not found).
    pub fn fetch(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.fetch_into(key, &mut out)?.then_some(out))
    }

    /// Fetch `key` by `path` (`None`: as the policy says), returning whether
    /// it was found and the path taken (READ without a cached address
    /// goes as READ-2). Only fetches the policy chose teach the chooser.
    pub fn fetch_by(
        &mut self,
        key: u64,
        path: Option<Path>,
        out: &mut Vec<u8>,
    ) -> Result<(bool, Path)> {
        let start = crate::cpu::monotonic_ns();
        let cpu0 = crate::cpu::thread_cpu_time();
        let deadline = Instant::now() + self.cfg.timeout;
        let cached = self.cache.get(&key).copied();
        let class = cached.map_or(UNKNOWN_SIZE, |(_, len)| class_of(len));
        let (p, why) = match path {
            Some(Path::Read) if cached.is_none() => (Path::Read2, Why::Fixed),
            Some(p) => (p, Why::Fixed),
            None => self.chooser.choose(class, cached.is_some(), self.load),
        };
        let r = match p {
            Path::Read => {
                let (off, len) = cached.expect("READ only with a cached address");
                self.read1(key, off, len, deadline, out)
            }
            Path::Read2 => self.read2(key, deadline, out),
            Path::Rpc => self.rpc(key, deadline, out),
        };
        let found = match r {
            Ok(f) => f,
            Err(e) => {
                if e.is_timeout() || e.errno() == libc::ETIMEDOUT {
                    self.stats.timeouts += 1;
                }
                return Err(e);
            }
        };
        self.stats.fetches[p as usize] += 1;
        self.stats.missing += u64::from(!found);
        if path.is_none() {
            let lat = crate::cpu::monotonic_ns().saturating_sub(start) as f64;
            let cpu = crate::cpu::thread_cpu_time()
                .saturating_sub(cpu0)
                .as_nanos() as f64;
            self.chooser.record(class, p, why, self.load, lat, cpu);
        }
        Ok((found, p))
    }

    fn remember(&mut self, key: u64, off: u64, len: usize) {
        if self.cfg.cache == 0 {
            return;
        }
        if self.cache.len() >= self.cfg.cache && !self.cache.contains_key(&key) {
            // Full: forget an arbitrary entry (the next fetch of that key
            // goes without its address, as its first did).
            if let Some(&k) = self.cache.keys().next() {
                self.cache.remove(&k);
            }
        }
        self.cache.insert(key, (off, len));
    }

    /// One READ of a cached slot; its end as READ-2's or the RPC's when the
    /// slot moved or stayed torn.
    fn read1(
        &mut self,
        key: u64,
        off: u64,
        len: usize,
        deadline: Instant,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        for _ in 0..=self.cfg.retries {
            self.read_remote(off, table::slot_bytes(len), true, deadline, key)?;
            match table::object(&self.scratch, key, len) {
                Object::Whole(d, _) => {
                    out.clear();
                    out.extend_from_slice(d);
                    return Ok(true);
                }
                Object::Moved => {
                    self.stats.moved += 1;
                    self.cache.remove(&key);
                    return self.read2(key, deadline, out);
                }
                Object::Torn => self.stats.torn += 1,
            }
        }
        self.stats.fallbacks += 1;
        self.rpc(key, deadline, out)
    }

    /// READ the key's buckets, then its slot.
    fn read2(&mut self, key: u64, deadline: Instant, out: &mut Vec<u8>) -> Result<bool> {
        match self.read2_attempts(key, deadline, out)? {
            Attempt::Done(found) => Ok(found),
            Attempt::Fallback => {
                self.stats.fallbacks += 1;
                self.rpc(key, deadline, out)
            }
        }
    }

    fn read2_attempts(
        &mut self,
        key: u64,
        deadline: Instant,
        out: &mut Vec<u8>,
    ) -> Result<Attempt> {
        let buckets = self.remote.buckets as usize;
        let window = table::bucket_at(table::home(key, buckets)) as u64;
        for _ in 0..=self.cfg.retries {
            self.read_remote(window, WINDOW_BYTES, true, deadline, key)?;
            let (off, len) = match table::lookup(&self.scratch, key) {
                Lookup::Missing => {
                    self.cache.remove(&key);
                    return Ok(Attempt::Done(false));
                }
                Lookup::Torn => {
                    self.stats.torn += 1;
                    continue;
                }
                Lookup::Found { off, len } => (off, len),
            };
            if len > self.remote.max_object as usize {
                return Err(Fail::new(
                    libc::EPROTO,
                    format!(
                        "fetch: key {key}'s bucket says {len} bytes, over the server's {}-byte max object",
                        self.remote.max_object
                    ),
                ));
            }
            self.read_remote(off, table::slot_bytes(len), false, deadline, key)?;
            match table::object(&self.scratch, key, len) {
                Object::Whole(d, _) => {
                    out.clear();
                    out.extend_from_slice(d);
                    self.remember(key, off, len);
                    return Ok(Attempt::Done(true));
                }
                // Moved between the two READs: look it up again.
                Object::Moved | Object::Torn => self.stats.torn += 1,
            }
        }
        Ok(Attempt::Fallback)
    }

    /// READ `len` bytes at `off` of the table into `scratch` (a copy, so
    /// a late READ of an earlier, timed-out fetch cannot change it while
    /// it is checked); `with_load`: a fetch's first READ, which brings the
    /// load word along one time in [`LOAD_EVERY`].
    fn read_remote(
        &mut self,
        off: u64,
        len: usize,
        with_load: bool,
        deadline: Instant,
        key: u64,
    ) -> Result<()> {
        let (addr, rkey) = (self.remote.addr, self.remote.rkey);
        let load = with_load && {
            self.read_fetches += 1;
            self.read_fetches.is_multiple_of(LOAD_EVERY)
        };
        if load {
            let wr = self.wr();
            self.qp
                .post_read_op(wr, &self.mr, self.lay.load, 8, (addr, rkey), false)?;
            self.stats.load_reads += 1;
        }
        let wr = self.wr();
        self.qp
            .post_read_op(wr, &self.mr, self.lay.read, len, (addr + off, rkey), true)?;
        self.await_wr(wr, deadline, key, "READ")?;
        let at = self.lay.read;
        self.scratch.clear();
        self.scratch
            .extend_from_slice(&self.mr.bytes()[at..at + len]);
        if load {
            let at = self.lay.load;
            let w = u64::from_le_bytes(self.mr.bytes()[at..at + 8].try_into().expect("8 bytes"));
            self.load = Load::unpack(w);
        }
        Ok(())
    }

    /// SEND the key, wait for the reply.
    fn rpc(&mut self, key: u64, deadline: Instant, out: &mut Vec<u8>) -> Result<bool> {
        let id = self.next_id;
        self.next_id += 1;
        let at = self.lay.req;
        Request { key, id }.encode(&mut self.mr.bytes_mut()[at..at + REQUEST]);
        let wr = self.wr();
        self.qp
            .post_send_op(wr, &self.mr, at, REQUEST, None, true)?;
        loop {
            let wc = self.next_wc(deadline, key, "RPC")?;
            if wc.wr_id & RECV_BIT == 0 {
                // The request's own send completion, or a late one.
                continue;
            }
            let slot = (wc.wr_id & !RECV_BIT) as usize;
            let at = slot * self.lay.reply;
            let msg = &self.mr.bytes()[at..at + wc.byte_len as usize];
            let reply = Reply::decode(msg);
            let mut data = None;
            if let Some(r) = reply
                && r.id == id
                && r.status == Status::Found
            {
                out.clear();
                out.extend_from_slice(&msg[REPLY_HEAD..REPLY_HEAD + r.len as usize]);
                data = Some((r.off, r.len as usize));
            }
            self.qp.post_recv(wc.wr_id, &self.mr, at, self.lay.reply)?;
            let Some(r) = reply else {
                return Err(Fail::new(
                    libc::EPROTO,
                    format!("fetch: a {}-byte message that is no reply", wc.byte_len),
                ));
            };
            if r.id != id {
                self.stats.late += 1;
                continue;
            }
            self.load = Load::unpack(r.load);
            return match r.status {
                Status::Found => {
                    let (off, len) = data.expect("copied above");
                    self.remember(key, off, len);
                    Ok(true)
                }
                Status::Missing => {
                    self.cache.remove(&key);
                    Ok(false)
                }
                Status::Bad => Err(Fail::new(
                    libc::EPROTO,
                    "fetch: the server did not understand the request",
                )),
            };
        }
    }

    fn wr(&mut self) -> u64 {
        self.next_wr = (self.next_wr + 1) & !RECV_BIT;
        self.next_wr
    }

    /// The next completion before `deadline`; a failed one is an error.
    fn next_wc(&mut self, deadline: Instant, key: u64, what: &str) -> Result<Wc> {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = if left.is_zero() {
            None
        } else {
            self.waiter.wait_timeout(&mut self.cq, left)?
        };
        let Some(wc) = got else {
            return Err(Fail::new(
                libc::ETIMEDOUT,
                format!(
                    "fetch: no answer to the {what} of key {key} within {:?}",
                    self.cfg.timeout
                ),
            ));
        };
        if wc.status != fastwake_verbs_sys::IBV_WC_SUCCESS {
            return Err(Fail::new(
                libc::EIO,
                format!(
                    "fetch: the {what} of key {key} failed (work completion status {}): the server is gone or the connection broke",
                    wc.status
                ),
            ));
        }
        Ok(wc)
    }

    /// Wait for work request `want`'s completion, skipping late ones.
    fn await_wr(&mut self, want: u64, deadline: Instant, key: u64, what: &str) -> Result<()> {
        loop {
            let wc = self.next_wc(deadline, key, what)?;
            if wc.wr_id == want {
                return Ok(());
            }
            if wc.wr_id & RECV_BIT != 0 {
                // A reply to an RPC that timed out.
                let at = (wc.wr_id & !RECV_BIT) as usize * self.lay.reply;
                self.qp.post_recv(wc.wr_id, &self.mr, at, self.lay.reply)?;
                self.stats.late += 1;
            }
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The chooser (its estimates and counters).
    pub fn chooser(&self) -> &Chooser {
        &self.chooser
    }

    /// The load word last seen.
    pub fn load(&self) -> Load {
        self.load
    }

    /// Is `key`'s address cached?
    pub fn cached(&self, key: u64) -> bool {
        self.cache.contains_key(&key)
    }

    /// The chooser's lines and the client's counters.
    pub fn explain(&self) -> String {
        let s = &self.stats;
        format!(
            "{}\n  client: torn {} moved {} fallbacks {} timeouts {} late {} load-reads {}; load busy {}‰ delayed {}‰ depth {}",
            self.chooser.explain(),
            s.torn,
            s.moved,
            s.fallbacks,
            s.timeouts,
            s.late,
            s.load_reads,
            self.load.busy,
            self.load.delayed,
            self.load.depth
        )
    }
}
