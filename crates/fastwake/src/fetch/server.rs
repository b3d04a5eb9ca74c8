//! The server: a [`Table`] in memory clients may READ, and one RPC thread
//! that answers lookups, waiting for requests through fastwake's engine
//! ([`Waiter`], in the configured mode) and publishing its load.
//!
//! Every connection is an RC QP whose receives land on the server's one
//! receive CQ, so the one RPC thread serves every client; replies go out
//! as SENDs from a ring of buffers per connection, reaped from the one
//! send CQ by the same thread.
//!
//! **The load word** (offset 0 of the table; also in every reply): every
//! [`LOAD_PERIOD`] the RPC thread publishes its busy share of the last
//! [`WINDOW`] periods
//! (time spent serving requests plus time it wanted its CPU and waited for
//! it, from its own `schedstat`), the waiting part alone, and the deepest
//! queue of requests it found at once. A CPU hog on the RPC thread's core
//! shows as waiting for the CPU whether the thread polls or sleeps.

use super::table::Table;
use super::wire::{REPLY_HEAD, REQUEST, Reply, Request, Status};
use crate::fetch::chooser::Load;
use crate::source::verbs::qp::IBV_ACCESS_REMOTE_READ;
use crate::source::verbs::{CqConfig, Device, Endpoint, Mr, RcQp, VerbsCq};
use crate::{Fail, Result, Source, WaitMode, Waiter};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Receive buffers (and reply buffers) per connection.
pub const SLOTS: usize = 16;
/// How often the RPC thread publishes its load. Short, because the first
/// requests a new hog delays must already be answered with a word that
/// says so (a period that has passed is published before the answer); a
/// period costs one read of the thread's schedstat (~0.3 % of a CPU at
/// this rate).
pub const LOAD_PERIOD: Duration = Duration::from_millis(5);
/// Longest the RPC thread waits before it looks at its stop flag.
const SLICE: Duration = Duration::from_millis(10);

/// How to make a [`Server`].
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Buckets of the index (each key lives in one of
    /// [`super::table::WINDOW`] from its hash).
    pub buckets: usize,
    /// Bytes for objects (each takes its length rounded up to 8, plus 40).
    pub capacity: usize,
    /// The largest object (clients size their receive buffers by it).
    pub max_object: usize,
    /// How the RPC thread waits for requests.
    pub mode: WaitMode,
    /// Pin the RPC thread to this CPU.
    pub cpu: Option<u32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            buckets: 4096,
            capacity: 16 << 20,
            max_object: 64 << 10,
            mode: WaitMode::Adaptive(crate::adaptive::Config::default()),
            cpu: None,
        }
    }
}

impl ServerConfig {
    /// One line per bad parameter.
    pub fn validate(&self) -> Result<()> {
        if self.buckets == 0 || self.buckets > 1 << 24 {
            return Err(Fail::invalid(format!(
                "fetch server: {} buckets: expected 1 to 16777216",
                self.buckets
            )));
        }
        if self.max_object == 0 || self.max_object > 1 << 30 {
            return Err(Fail::invalid(format!(
                "fetch server: max object {} bytes: expected 1 byte to 1 GiB",
                self.max_object
            )));
        }
        if self.capacity < super::table::slot_bytes(self.max_object) {
            return Err(Fail::invalid(format!(
                "fetch server: capacity {} bytes holds no object of the max size ({} bytes)",
                self.capacity, self.max_object
            )));
        }
        Ok(())
    }
}

/// What a client needs of the server besides its QP's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Address of the table.
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Buckets of the index.
    pub buckets: u32,
    /// The largest object.
    pub max_object: u32,
}

/// What the RPC thread did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests received.
    pub requests: u64,
    /// Of those, for keys not in the table.
    pub missing: u64,
    /// Messages that were not requests.
    pub bad: u64,
    /// Requests dropped while silenced ([`Server::set_silent`]).
    pub dropped: u64,
    /// The load word last published.
    pub load: u64,
    /// Load words published.
    pub published: u64,
}

struct Conn {
    qp: RcQp,
    /// Only the RPC thread uses it; the lock makes the connection `Sync`.
    recv: Mutex<Mr>,
    reply: Mutex<Replies>,
}

struct Replies {
    mr: Mr,
    free: Vec<usize>,
}

struct Cqs {
    recv: VerbsCq,
    send: VerbsCq,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    missing: AtomicU64,
    bad: AtomicU64,
    dropped: AtomicU64,
    load: AtomicU64,
    published: AtomicU64,
}

struct Shared {
    cfg: ServerConfig,
    dev: Arc<Device>,
    table: Mutex<Table>,
    // Connections (QPs) before the CQs they use: dropped first.
    conns: RwLock<Vec<Arc<Conn>>>,
    cqs: Mutex<Cqs>,
    /// A connection is being made: the RPC thread lets go of the CQs.
    accepting: AtomicBool,
    stop: AtomicBool,
    silent: AtomicBool,
    rpc_cpu: AtomicU32,
    /// The RPC thread's id (0 until it runs).
    rpc_tid: AtomicI32,
    counters: Counters,
    /// The RPC thread's fatal error, if it stopped on one.
    failed: Mutex<Option<Fail>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fetch server (see the module docs).
pub struct Server {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// A server on `dev` with an empty table; its RPC thread runs from now.
    pub fn new(dev: &Arc<Device>, cfg: ServerConfig) -> Result<Server> {
        cfg.validate()?;
        let bytes = Table::bytes(cfg.buckets, cfg.capacity);
        let mr = Mr::with_access(
            dev,
            bytes,
            fastwake_verbs_sys::IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
        )?;
        let table = Table::new(mr, cfg.buckets)?;
        let cq = |entries: usize| {
            VerbsCq::new(
                dev,
                CqConfig {
                    entries: entries as u32,
                    ..CqConfig::default()
                },
            )
        };
        let cqs = Cqs {
            recv: cq(1024)?,
            send: cq(1024)?,
        };
        let shared = Arc::new(Shared {
            cfg,
            dev: Arc::clone(dev),
            table: Mutex::new(table),
            conns: RwLock::new(Vec::new()),
            cqs: Mutex::new(cqs),
            accepting: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            silent: AtomicBool::new(false),
            rpc_cpu: AtomicU32::new(u32::MAX),
            rpc_tid: AtomicI32::new(0),
            counters: Counters::default(),
            failed: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("fw-fetch-rpc".into())
            .spawn(move || {
                if let Err(e) = rpc_thread(&s) {
                    *lock(&s.failed) = Some(e);
                }
            })
            .map_err(|e| Fail::new(libc::EAGAIN, format!("fetch server: spawn: {e}")))?;
        Ok(Server {
            shared,
            thread: Some(thread),
        })
    }

    /// Insert or rewrite `key`'s object (at most the max object size).
    pub fn put(&self, key: u64, data: &[u8]) -> Result<()> {
        if data.len() > self.shared.cfg.max_object {
            return Err(Fail::invalid(format!(
                "fetch: a {}-byte object exceeds the {}-byte max object",
                data.len(),
                self.shared.cfg.max_object
            )));
        }
        lock(&self.shared.table).put(key, data)
    }

    /// Remove `key`; false when it was not there.
    pub fn remove(&self, key: u64) -> bool {
        lock(&self.shared.table).remove(key)
    }

    /// A copy of `key`'s object, as the table holds it now.
    pub fn get(&self, key: u64) -> Option<Vec<u8>> {
        lock(&self.shared.table)
            .get(key)
            .map(|(_, d, _)| d.to_vec())
    }

    /// What a client needs to READ the table.
    pub fn remote(&self) -> Remote {
        let t = lock(&self.shared.table);
        Remote {
            addr: t.mr().addr(0),
            rkey: t.mr().rkey(),
            buckets: t.buckets() as u32,
            max_object: self.shared.cfg.max_object as u32,
        }
    }

    /// A connection for a client whose QP is `client`: returns the
    /// server's QP endpoint, to give the client.
    pub fn accept(&self, client: &Endpoint) -> Result<Endpoint> {
        let sh = &self.shared;
        sh.accepting.store(true, Ordering::Release);
        let made = (|| {
            let cqs = lock(&sh.cqs);
            let qp = RcQp::new(&cqs.send, &cqs.recv, SLOTS as u32 * 2, 64)?;
            let recv = Mr::new(&sh.dev, SLOTS * REQUEST)?;
            let reply = Mr::new(&sh.dev, SLOTS * (REPLY_HEAD + sh.cfg.max_object))?;
            qp.connect(client)?;
            qp.allow_remote(IBV_ACCESS_REMOTE_READ)?;
            let mut conns = sh.conns.write().unwrap_or_else(|p| p.into_inner());
            let idx = conns.len() as u64;
            for s in 0..SLOTS {
                qp.post_recv(idx << 32 | s as u64, &recv, s * REQUEST, REQUEST)?;
            }
            let ep = qp.endpoint();
            conns.push(Arc::new(Conn {
                qp,
                recv: Mutex::new(recv),
                reply: Mutex::new(Replies {
                    mr: reply,
                    free: (0..SLOTS).collect(),
                }),
            }));
            Ok(ep)
        })();
        sh.accepting.store(false, Ordering::Release);
        made
    }

    /// Silenced, the RPC thread takes requests and answers none (a server
    /// that stopped answering, for tests of the clients' bound).
    pub fn set_silent(&self, on: bool) {
        self.shared.silent.store(on, Ordering::Relaxed);
    }

    /// The CPU the RPC thread runs on (once it has started).
    pub fn rpc_cpu(&self) -> Option<u32> {
        for _ in 0..1000 {
            match self.shared.rpc_cpu.load(Ordering::Acquire) {
                u32::MAX => std::thread::sleep(Duration::from_millis(1)),
                c => return Some(c),
            }
        }
        None
    }

    /// The RPC thread's id (its CPU time is in
    /// `/proc/self/task/TID/schedstat`), once it has started.
    pub fn rpc_tid(&self) -> Option<i32> {
        self.rpc_cpu()?;
        Some(self.shared.rpc_tid.load(Ordering::Acquire)).filter(|&t| t > 0)
    }

    /// The RPC thread's counters.
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        ServerStats {
            requests: c.requests.load(Ordering::Relaxed),
            missing: c.missing.load(Ordering::Relaxed),
            bad: c.bad.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            load: c.load.load(Ordering::Relaxed),
            published: c.published.load(Ordering::Relaxed),
        }
    }

    /// The error the RPC thread stopped on, if it did.
    pub fn failed(&self) -> Option<Fail> {
        lock(&self.shared.failed).clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The run-queue delay of the calling thread so far (ns), from schedstat.
fn run_queue_delay_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Periods the load word is computed over: the word changes every period
/// and says what the last `WINDOW` held, so a hog that just arrived shows
/// at the next period (it takes most of it), while one stray ms in an
/// emulated guest (a vCPU not run) does not flip the word by itself.
pub const WINDOW: usize = 4;

/// One period's figures: (ns, serving ns, waiting-for-CPU ns, depth).
type Period = (u64, u64, u64, u16);

/// Busy share of the RPC thread over the last [`WINDOW`] periods.
struct LoadMeter {
    start_ns: u64,
    delay0: Option<u64>,
    serving_ns: u64,
    depth: u16,
    seq: u16,
    past: std::collections::VecDeque<Period>,
}

impl LoadMeter {
    fn new(now: u64) -> LoadMeter {
        LoadMeter {
            start_ns: now,
            delay0: run_queue_delay_ns(),
            serving_ns: 0,
            depth: 0,
            seq: 0,
            past: std::collections::VecDeque::with_capacity(WINDOW),
        }
    }

    /// The word to publish, when a period has passed.
    fn due(&mut self, now: u64) -> Option<u64> {
        let dt = now.saturating_sub(self.start_ns);
        if dt < LOAD_PERIOD.as_nanos() as u64 {
            return None;
        }
        let delay1 = run_queue_delay_ns();
        let delayed = match (self.delay0, delay1) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        };
        if self.past.len() == WINDOW {
            self.past.pop_front();
        }
        self.past
            .push_back((dt, self.serving_ns, delayed, self.depth));
        let sum = |f: fn(&Period) -> u64| self.past.iter().map(f).sum::<u64>();
        let (t, serving, waiting) = (sum(|p| p.0), sum(|p| p.1), sum(|p| p.2));
        let permille = |ns: u64| ((ns as f64 / t.max(1) as f64) * 1000.0).min(1000.0) as u16;
        let load = Load {
            busy: permille(serving + waiting),
            delayed: permille(waiting),
            depth: self.past.iter().map(|p| p.3).max().unwrap_or(0),
        };
        self.seq = self.seq.wrapping_add(1);
        (self.start_ns, self.delay0, self.serving_ns, self.depth) = (now, delay1, 0, 0);
        Some(load.pack(self.seq))
    }
}

fn rpc_thread(sh: &Shared) -> Result<()> {
    if let Some(cpu) = sh.cfg.cpu {
        crate::cpu::pin(cpu)?;
    }
    sh.rpc_tid.store(
        rustix::thread::gettid().as_raw_nonzero().get(),
        Ordering::Release,
    );
    sh.rpc_cpu
        .store(crate::cpu::current().unwrap_or(0), Ordering::Release);
    let mut waiter = Waiter::new(sh.cfg.mode);
    let mut meter = LoadMeter::new(crate::cpu::monotonic_ns());
    let mut load = 0u64;
    // Publish the load word when a period has passed.
    let publish = |meter: &mut LoadMeter, load: &mut u64| {
        if let Some(w) = meter.due(crate::cpu::monotonic_ns()) {
            *load = w;
            lock(&sh.table).set_load(w);
            sh.counters.load.store(w, Ordering::Relaxed);
            sh.counters.published.fetch_add(1, Ordering::Relaxed);
        }
    };
    while !sh.stop.load(Ordering::Acquire) {
        if sh.accepting.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let mut cqs = lock(&sh.cqs);
        let Cqs { recv, send } = &mut *cqs;
        let got = waiter.wait_timeout(recv, SLICE)?;
        if let Some(wc) = got {
            // Before answering: a thread that was kept off its CPU for
            // periods answers with the word that says so, not with the one
            // from before (its first replies under a new hog would teach
            // the clients that RPC is slow on an idle server).
            publish(&mut meter, &mut load);
            let t0 = crate::cpu::monotonic_ns();
            let mut depth = 1u16;
            serve(sh, &wc, load, send)?;
            while let Some(wc) = recv.try_take()? {
                depth = depth.saturating_add(1);
                serve(sh, &wc, load, send)?;
            }
            reap(sh, send)?;
            meter.depth = meter.depth.max(depth);
            meter.serving_ns += crate::cpu::monotonic_ns().saturating_sub(t0);
        }
        drop(cqs);
        publish(&mut meter, &mut load);
    }
    Ok(())
}

/// Free the reply buffers whose SENDs completed.
fn reap(sh: &Shared, send: &mut VerbsCq) -> Result<()> {
    while let Some(wc) = send.try_take()? {
        let conns = sh.conns.read().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = conns.get((wc.wr_id >> 32) as usize) {
            lock(&c.reply).free.push((wc.wr_id & 0xffff_ffff) as usize);
        }
        // A failed reply (the client is gone) only costs that client.
    }
    Ok(())
}

/// Answer one received request.
fn serve(sh: &Shared, wc: &crate::source::verbs::Wc, load: u64, send: &mut VerbsCq) -> Result<()> {
    if wc.status != fastwake_verbs_sys::IBV_WC_SUCCESS {
        // A receive flushed from a connection that went away.
        return Ok(());
    }
    let idx = (wc.wr_id >> 32) as usize;
    let slot = (wc.wr_id & 0xffff_ffff) as usize;
    let Some(conn) = sh
        .conns
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(idx)
        .cloned()
    else {
        return Ok(());
    };
    let at = slot * REQUEST;
    let recv = lock(&conn.recv);
    let req = Request::decode(&recv.bytes()[at..at + (wc.byte_len as usize).min(REQUEST)]);
    conn.qp.post_recv(wc.wr_id, &recv, at, REQUEST)?;
    drop(recv);
    let c = &sh.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    if sh.silent.load(Ordering::Relaxed) {
        c.dropped.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    let mut replies = lock(&conn.reply);
    let r = loop {
        if let Some(r) = replies.free.pop() {
            break r;
        }
        // Every reply buffer is in flight: take send completions.
        drop(replies);
        reap(sh, send)?;
        std::hint::spin_loop();
        replies = lock(&conn.reply);
    };
    let size = REPLY_HEAD + sh.cfg.max_object;
    let buf = &mut replies.mr.bytes_mut()[r * size..(r + 1) * size];
    let mut reply = Reply {
        status: Status::Bad,
        len: 0,
        id: 0,
        load,
        off: 0,
        ver: 0,
    };
    if let Some(req) = req {
        reply.id = req.id;
        let t = lock(&sh.table);
        match t.get(req.key) {
            Some((off, data, ver)) => {
                buf[REPLY_HEAD..REPLY_HEAD + data.len()].copy_from_slice(data);
                reply.status = Status::Found;
                reply.len = data.len() as u32;
                reply.off = off as u64;
                reply.ver = ver;
            }
            None => {
                reply.status = Status::Missing;
                c.missing.fetch_add(1, Ordering::Relaxed);
            }
        }
    } else {
        c.bad.fetch_add(1, Ordering::Relaxed);
    }
    reply.encode(buf);
    let len = REPLY_HEAD + reply.len as usize;
    conn.qp.post_send_op(
        (idx as u64) << 32 | r as u64,
        &replies.mr,
        r * size,
        len,
        None,
        true,
    )?;
    Ok(())
}
