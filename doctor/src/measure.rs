//! The pair's data test through the plugin's own API, called as NCCL's proxy calls it: `init`,
//! `listen`, `connect`/`accept` re-entered until ready, `regMr`, `isend`/`irecv`, `test` until
//! done. One send and one receive comm each way; 4 MiB messages for bandwidth (a fixed count,
//! agreed over the doctors' own TCP connection, so no receive is left posted), 8-byte
//! ping-pong for latency.

use ferroce::api::{self, CommContext, ListenHandle, RecvHandle, SendHandle};
use ferroce::transport::{MemHandle, Request};
use std::cell::Cell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Bandwidth message size.
pub const BW_BYTES: usize = 4 << 20;
/// Latency message size.
pub const LAT_BYTES: usize = 8;
/// Messages in flight during the bandwidth phase (NCCL's NCCL_STEPS).
pub const DEPTH: usize = 8;

type Result<T> = std::result::Result<T, String>;

fn plugin<T>(what: &str, r: ferroce::error::Result<T>) -> Result<T> {
    r.map_err(|e| format!("{what}: {}", e.message))
}

/// A registered host buffer.
struct Buffer {
    data: Vec<u8>,
    mh: Option<Box<MemHandle>>,
}

impl Buffer {
    fn new(comm: *mut std::ffi::c_void, len: usize) -> Result<Buffer> {
        let data = vec![0x5au8; len];
        // SAFETY: `comm` is a live SendHandle or RecvHandle of ours (the callers pass one).
        let device = unsafe { api::comm_device(comm) };
        let mh = plugin(
            "regMr",
            api::reg_mr(
                device,
                data.as_ptr() as usize,
                len,
                ferroce::transport::MemKind::Host,
                None,
            ),
        )?;
        Ok(Buffer { data, mh: Some(mh) })
    }

    fn addr(&self) -> usize {
        self.data.as_ptr() as usize
    }

    fn mh(&self) -> &MemHandle {
        self.mh.as_deref().expect("registered until drop")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(mh) = self.mh.take() {
            if let Err(e) = api::dereg_mr(mh) {
                eprintln!("ferroce-doctor: deregMr: {}", e.message);
            }
        }
    }
}

/// Both directions between this process and the other doctor.
pub struct Link {
    // Field order is drop order: buffers before comms, comms before the context.
    send_buf: Buffer,
    recv_buf: Buffer,
    send: Box<SendHandle>,
    recv: Box<RecvHandle>,
    _listen: Box<ListenHandle>,
    /// Moved forward at every completion: a phase fails only when nothing completes for
    /// `timeout`, however long it runs.
    deadline: Cell<Instant>,
    timeout: Duration,
    _ctx: PluginContext,
}

/// The plugin context; `finalize` when dropped (after the comms: it is `Link`'s last field).
struct PluginContext(Option<Box<CommContext>>);

impl Drop for PluginContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            if let Err(e) = api::finalize(ctx) {
                eprintln!("ferroce-doctor: finalize: {}", e.message);
            }
        }
    }
}

fn comm_ptr<T>(c: &T) -> *mut std::ffi::c_void {
    c as *const T as *mut std::ffi::c_void
}

impl Link {
    /// Listens on plugin device `dev`, trades handles through `exchange`, then connects and
    /// accepts together until both are ready or `timeout` passes.
    pub fn open(dev: i32, timeout: Duration, exchange: &mut dyn FnMut([u8; 128]) -> Result<[u8; 128]>) -> Result<Link> {
        let deadline = Instant::now() + timeout;
        let ctx = PluginContext(Some(plugin("init", api::init(None, -1, false))?));
        let ctx_ref: &CommContext = ctx.0.as_deref().expect("just set");
        let ndev = plugin("devices", api::devices())?;
        if dev < 0 || dev >= ndev {
            return Err(format!("--dev {dev}: the plugin has devices 0..{ndev}"));
        }
        let mut mine = [0u8; 128];
        let mut listen = plugin("listen", api::listen(ctx_ref, dev, &mut mine))?;
        let mut theirs = exchange(mine)?;
        let (mut send, mut recv) = (None, None);
        while send.is_none() || recv.is_none() {
            if send.is_none() {
                send = plugin("connect", api::connect(ctx_ref, dev, &mut theirs))?;
            }
            if recv.is_none() {
                recv = plugin("accept", api::accept(&mut listen))?;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the plugin's connection was not set up within {timeout:?} (connect {}, accept {})",
                    if send.is_some() { "done" } else { "pending" },
                    if recv.is_some() { "done" } else { "pending" }
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let (send, recv) = (send.expect("loop ends when set"), recv.expect("loop ends when set"));
        let send_buf = Buffer::new(comm_ptr(&*send), BW_BYTES)?;
        let recv_buf = Buffer::new(comm_ptr(&*recv), BW_BYTES)?;
        Ok(Link {
            send_buf,
            recv_buf,
            send,
            recv,
            _listen: listen,
            deadline: Cell::new(Instant::now() + timeout),
            timeout,
            _ctx: ctx,
        })
    }

    /// Something completed (or a phase starts): the next `timeout` is allowed from now.
    pub fn progressed(&self) {
        self.deadline.set(Instant::now() + self.timeout);
    }

    fn stalled(&self, what: &str) -> Result<()> {
        if Instant::now() > self.deadline.get() {
            return Err(format!(
                "{what} made no progress for {:?} (the peer stopped, or the network drops RDMA traffic)",
                self.timeout
            ));
        }
        Ok(())
    }

    fn isend(&self, size: usize) -> Result<Option<*mut Request>> {
        // SAFETY: this thread is the comm's only user; the buffer stays registered and alive
        // until the request completes (each phase waits for all its requests).
        plugin("isend", unsafe {
            api::isend(&self.send, self.send_buf.addr(), size, 0, self.send_buf.mh())
        })
    }

    fn irecv(&self, size: usize) -> Result<Option<*mut Request>> {
        let mh = self.recv_buf.mh();
        // SAFETY: as isend.
        plugin("irecv", unsafe {
            api::irecv(&self.recv, &[self.recv_buf.addr()], &[size], &[0], &[mh], false)
        })
    }

    /// `Some(size)` once `req` is done.
    fn test(&self, req: *mut Request) -> Result<Option<usize>> {
        let mut size = 0i32;
        // SAFETY: req came from this link's isend/irecv and has not completed; size has room for 1.
        let done = plugin("test", unsafe { api::test(req, &mut size) })?;
        if done {
            self.progressed();
        }
        Ok(done.then_some(size.max(0) as usize))
    }

    fn wait(&self, req: *mut Request, what: &str) -> Result<usize> {
        loop {
            if let Some(size) = self.test(req)? {
                return Ok(size);
            }
            self.stalled(what)?;
        }
    }

    /// Posts until the plugin takes the request (it returns none while its queue is full or,
    /// for a send, until the receiver's CTS arrived).
    fn post(&self, what: &str, f: impl Fn() -> Result<Option<*mut Request>>) -> Result<*mut Request> {
        loop {
            if let Some(r) = f()? {
                return Ok(r);
            }
            self.stalled(what)?;
        }
    }

    /// Sends `count` 4 MiB messages, `DEPTH` in flight; returns the seconds from the first
    /// post to the last completion.
    pub fn send_messages(&self, count: usize) -> Result<f64> {
        let start = Instant::now();
        let mut inflight = VecDeque::new();
        let mut posted = 0;
        while posted < count || !inflight.is_empty() {
            while posted < count && inflight.len() < DEPTH {
                match self.isend(BW_BYTES)? {
                    Some(r) => {
                        inflight.push_back(r);
                        posted += 1;
                    }
                    None => break,
                }
            }
            if let Some(&front) = inflight.front() {
                if self.test(front)?.is_some() {
                    inflight.pop_front();
                }
            }
            self.stalled("the bandwidth test")?;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Receives `count` messages into 4 MiB buffers, `DEPTH` posted; returns the bytes.
    pub fn recv_messages(&self, count: usize) -> Result<u64> {
        let mut inflight = VecDeque::new();
        let (mut posted, mut bytes) = (0, 0u64);
        while posted < count || !inflight.is_empty() {
            while posted < count && inflight.len() < DEPTH {
                match self.irecv(BW_BYTES)? {
                    Some(r) => {
                        inflight.push_back(r);
                        posted += 1;
                    }
                    None => break,
                }
            }
            if let Some(&front) = inflight.front() {
                if let Some(size) = self.test(front)? {
                    bytes += size as u64;
                    inflight.pop_front();
                }
            }
            self.stalled("the bandwidth test")?;
        }
        Ok(bytes)
    }

    /// 8-byte ping-pongs for `duration`, then a 0-byte message that ends the peer's echo loop.
    /// Returns every round trip in seconds.
    pub fn ping(&self, duration: Duration) -> Result<Vec<f64>> {
        let end = Instant::now() + duration;
        let mut rtts = Vec::new();
        while Instant::now() < end {
            let t0 = Instant::now();
            let r = self.post("the latency test", || self.irecv(LAT_BYTES))?;
            let s = self.post("the latency test", || self.isend(LAT_BYTES))?;
            self.wait(s, "the latency test")?;
            self.wait(r, "the latency test")?;
            rtts.push(t0.elapsed().as_secs_f64());
        }
        let s = self.post("the latency test's end", || self.isend(0))?;
        self.wait(s, "the latency test's end")?;
        Ok(rtts)
    }

    /// Echoes 8-byte messages until a 0-byte one arrives; returns how many were echoed.
    pub fn echo(&self) -> Result<usize> {
        let mut echoed = 0;
        loop {
            let r = self.post("the latency test", || self.irecv(LAT_BYTES))?;
            if self.wait(r, "the latency test")? == 0 {
                return Ok(echoed);
            }
            let s = self.post("the latency test", || self.isend(LAT_BYTES))?;
            self.wait(s, "the latency test")?;
            echoed += 1;
        }
    }
}
