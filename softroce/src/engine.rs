//! The progress engine: one background thread per device instance.
//!
//! It owns the receive side of the device's UDP socket, verifies and strips
//! the ICRC, demultiplexes on BTH.DestQP, feeds [`QpCore::handle_packet`],
//! runs the core timers and drains every touched QP: packets to the socket
//! (ICRC appended), completions to the CQs (waking completion channels),
//! async events to the owning context. Posting threads drain their own QP
//! directly after `post_send` (lowest latency) — except small messages on a
//! QP with packets outstanding, which are left to this thread's next batch
//! (`SOFTROCE_DEFER`) — and wake this thread only when they armed a timer
//! earlier than the one it sleeps on. While packets arrive, the thread polls
//! its socket for `SOFTROCE_SPIN_US` before blocking. An application thread
//! whose CQ poll finds nothing receives the next batch itself when this
//! thread is not receiving ([`receive_inline`], `SOFTROCE_INLINE_RX`): on a
//! host with few cores the thread that would spin does the NIC's work.
//!
//! All signals are blocked in the engine thread (perftest uses SIGALRM).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crate::config;
use crate::device::{gid_to_ipv4, Device, MrInfo};
use crate::proto::{self, AtomicOp, Instant, LocalAccessError, MemoryAccess, QpCore, RemoteAccess, RemoteAccessError};
use crate::udp::{Ip, RecvMeta, MAX_DGRAM, MAX_GSO_BYTES, MAX_GSO_SEGS, MAX_PACKET, ROCE_PORT};
use crate::verbs::context::AsyncQueue;
use crate::verbs::cq::{CqInner, Wc};
use crate::wire::icrc;

/// Nanoseconds since the first call (the driver's epoch for the core's virtual time).
pub fn now() -> Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    Instant::from_nanos(e.elapsed().as_nanos() as u64)
}

/// Per-QP state shared by the verbs layer and the engine.
pub struct QpShared {
    pub qpn: u32,
    pub pd: u32,
    pub core: Mutex<QpCore>,
    /// The shared receive queue the QP takes receive WQEs from, if any.
    pub srq: Option<Arc<crate::verbs::srq::SrqInner>>,
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub async_q: Arc<AsyncQueue>,
    /// The application's `ibv_qp *` (element of async events).
    pub ibv_ptr: AtomicUsize,
    /// Queued on the engine's dirty list (deferred packets to send).
    pub dirty: AtomicBool,
}

/// Memory of one PD, through the device's MR table (what the core sees).
pub struct PdMemory<'a> {
    pub dev: &'a Device,
    pub pd: u32,
    /// The QP's SRQ (serves `take_srq_recv`).
    pub srq: Option<&'a crate::verbs::srq::SrqInner>,
}

// Every access translates and copies while holding the MR table's read lock,
// so `ibv_dereg_mr` (write lock) returns only after in-flight copies into or
// out of that region have finished — as a NIC's deregistration waits for DMA.
impl PdMemory<'_> {
    /// Host address of `[addr, addr+len)` in MR `m`'s IOVA space.
    fn translate(m: &MrInfo, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(m.iova)?;
        let end = off.checked_add(len)?;
        if end > m.len as u64 {
            return None;
        }
        Some(m.addr + off as usize)
    }

    /// Runs `f` on the host address of a checked local range, under the read lock.
    fn with_local<R>(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        write: bool,
        f: impl FnOnce(usize) -> R,
    ) -> Result<R, LocalAccessError> {
        let mrs = self.dev.mrs.read().unwrap();
        let m = mrs
            .get(&lkey)
            .filter(|m| m.pd == self.pd)
            .ok_or(LocalAccessError::InvalidKey)?;
        if write && m.access & proto::mem::access::LOCAL_WRITE == 0 {
            return Err(LocalAccessError::Permission);
        }
        let p = Self::translate(m, addr, len).ok_or(LocalAccessError::OutOfBounds)?;
        Ok(f(p))
    }

    /// Runs `f` on the host address of a checked remote range, under the read lock.
    fn with_remote<R>(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        what: RemoteAccess,
        f: impl FnOnce(usize) -> R,
    ) -> Result<R, RemoteAccessError> {
        let mrs = self.dev.mrs.read().unwrap();
        let m = mrs
            .get(&rkey)
            .filter(|m| m.pd == self.pd)
            .ok_or(RemoteAccessError::InvalidKey)?;
        let need = match what {
            RemoteAccess::Write => proto::mem::access::REMOTE_WRITE,
            RemoteAccess::Read => proto::mem::access::REMOTE_READ,
            RemoteAccess::Atomic => proto::mem::access::REMOTE_ATOMIC,
        };
        if m.access & need == 0 {
            return Err(RemoteAccessError::Permission);
        }
        let p = Self::translate(m, va, len).ok_or(RemoteAccessError::OutOfBounds)?;
        Ok(f(p))
    }
}

impl MemoryAccess for PdMemory<'_> {
    fn local_check(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<(), LocalAccessError> {
        if len == 0 {
            return Ok(());
        }
        self.with_local(lkey, addr, len, write, |_| ())
    }
    fn local_read(&self, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), LocalAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        self.with_local(lkey, addr, buf.len() as u64, false, |p| {
            // SAFETY: p..p+len lies inside a registered MR, which the application
            // keeps mapped while it is registered (verbs contract); the read lock
            // keeps it registered during the copy.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), buf.len()) }
        })
    }
    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), LocalAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        self.with_local(lkey, addr, data.len() as u64, true, |p| {
            // SAFETY: as in local_read; the MR has LOCAL_WRITE.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len()) }
        })
    }
    fn remote_check(&self, rkey: u32, va: u64, len: u64, what: RemoteAccess) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        if what == RemoteAccess::Atomic && !va.is_multiple_of(8) {
            return Err(RemoteAccessError::Misaligned);
        }
        self.with_remote(rkey, va, len, what, |_| ())
    }
    fn remote_write(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), RemoteAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        self.with_remote(rkey, va, data.len() as u64, RemoteAccess::Write, |p| {
            // SAFETY: inside a registered MR with REMOTE_WRITE (kept registered by the lock).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len()) }
        })
    }
    fn remote_read(&self, rkey: u32, va: u64, buf: &mut [u8]) -> Result<(), RemoteAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        self.with_remote(rkey, va, buf.len() as u64, RemoteAccess::Read, |p| {
            // SAFETY: inside a registered MR with REMOTE_READ (kept registered by the lock).
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), buf.len()) }
        })
    }
    fn remote_atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        if !va.is_multiple_of(8) {
            return Err(RemoteAccessError::Misaligned);
        }
        self.with_remote(rkey, va, 8, RemoteAccess::Atomic, |p| {
            if p % 8 != 0 {
                return Err(RemoteAccessError::Misaligned);
            }
            // SAFETY: p is 8-byte aligned and inside an MR with REMOTE_ATOMIC; an
            // AtomicU64 view makes the update atomic w.r.t. every other atomic
            // (engine threads, CPU atomics of the application) on the same word.
            let a = unsafe { &*(p as *const std::sync::atomic::AtomicU64) };
            let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(op.apply(v)));
            Ok(r.unwrap_or_else(|v| v))
        })?
    }
    fn take_srq_recv(&mut self) -> Option<proto::RecvWr> {
        self.srq?.take()
    }
}

pub struct Engine {
    dev: Weak<Device>,
    qps: RwLock<HashMap<u32, Arc<QpShared>>>,
    wake_fd: i32,
    /// Deadline (ns) the engine sleeps until; u64::MAX when it waits for input only.
    sleep_until: AtomicU64,
    /// Earliest timer armed by another thread since the engine last looked (ns).
    noted: AtomicU64,
    /// A full timer scan is due (the QP set changed).
    rescan: AtomicBool,
    /// QPs with work left for the engine (deferred small messages).
    dirty: Mutex<Vec<Arc<QpShared>>>,
    /// `dirty` is not empty (checked without the lock by a spinning engine).
    has_dirty: AtomicBool,
    /// The receive side of the socket: whoever holds it (the engine, or an
    /// application thread whose CQ poll found nothing, see [`receive_inline`])
    /// receives and handles the next datagrams.
    rx: Mutex<Rx>,
    /// When a datagram last arrived (ns of [`now`]), for the engine's spin.
    last_rx: AtomicU64,
}

/// Receive-side state: datagram buffers and what a batch needs.
struct Rx {
    bufs: Vec<Vec<u8>>,
    meta: [RecvMeta; RX_BATCH],
    tx: Tx,
    rng: Rng,
    touched: Vec<Arc<QpShared>>,
    bad_icrc: u64,
}

/// Datagrams per `recvmmsg`.
const RX_BATCH: usize = 32;

impl Engine {
    pub fn new(dev: Weak<Device>) -> Engine {
        // SAFETY: plain eventfd(2) call; a failure leaves -1 and the engine polls periodically.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        Engine {
            dev,
            qps: RwLock::new(HashMap::new()),
            wake_fd,
            sleep_until: AtomicU64::new(u64::MAX),
            noted: AtomicU64::new(u64::MAX),
            rescan: AtomicBool::new(true),
            dirty: Mutex::new(Vec::new()),
            has_dirty: AtomicBool::new(false),
            rx: Mutex::new(Rx {
                bufs: (0..RX_BATCH).map(|_| vec![0u8; MAX_DGRAM]).collect(),
                meta: [RecvMeta::default(); RX_BATCH],
                tx: Tx::new(),
                rng: Rng(config::seed() | 1),
                touched: Vec::new(),
                bad_icrc: 0,
            }),
            last_rx: AtomicU64::new(0),
        }
    }

    pub fn start(&self) -> std::io::Result<()> {
        let dev = self.dev.upgrade().ok_or(std::io::ErrorKind::Other)?;
        // Block every signal while spawning so the thread starts with all blocked.
        // SAFETY: sigset manipulation on local, initialised sets.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sigset pointers.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        }
        let r = std::thread::Builder::new()
            .name(format!("softroce{}", dev.index))
            .spawn(move || supervise(dev));
        // SAFETY: restores the caller's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        r.map(|_| ())
    }

    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qps.read().unwrap().contains_key(&qpn)
    }

    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.qps.read().unwrap().values().any(|q| q.pd == pd)
    }

    pub fn add_qp(&self, qp: Arc<QpShared>) {
        self.qps.write().unwrap().insert(qp.qpn, qp);
        self.rescan.store(true, Ordering::Release);
    }

    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        let r = self.qps.write().unwrap().remove(&qpn);
        self.rescan.store(true, Ordering::Release);
        r
    }

    /// Leaves `qp`'s due packets to the engine's next loop (no wake-up: the
    /// caller knows an answer or a timer will come).
    pub fn defer(&self, qp: &Arc<QpShared>) {
        if !qp.dirty.swap(true, Ordering::AcqRel) {
            self.dirty.lock().unwrap_or_else(|e| e.into_inner()).push(qp.clone());
            self.has_dirty.store(true, Ordering::Release);
        }
    }

    pub fn qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.read().unwrap().get(&qpn).cloned()
    }

    /// Wakes the engine thread.
    pub fn kick(&self) {
        if self.wake_fd >= 0 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// Wakes the engine if `deadline` is earlier than what it sleeps on.
    pub fn note_deadline(&self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            self.noted.fetch_min(d.as_nanos(), Ordering::SeqCst);
            if d.as_nanos() < self.sleep_until.load(Ordering::SeqCst) {
                self.kick();
            }
        }
    }
}

/// Per-thread transmit state: a scratch packet buffer and the GSO batch
/// being built (consecutive equal-size packets to one destination).
pub struct Tx {
    scratch: Vec<u8>,
    batch: Vec<u8>,
    dst: Ipv4Addr,
    ip: Ip,
    seg: usize,
    count: usize,
    /// A shorter packet ended the batch (GSO: only the last segment may be short).
    closed: bool,
}

impl Default for Tx {
    fn default() -> Self {
        Self::new()
    }
}

impl Tx {
    pub fn new() -> Tx {
        Tx {
            scratch: Vec::with_capacity(MAX_PACKET),
            batch: Vec::new(),
            dst: Ipv4Addr::UNSPECIFIED,
            ip: Ip::default(),
            seg: 0,
            count: 0,
            closed: false,
        }
    }

    /// Queues the packet in `scratch[..len]` for `dst`, appending its ICRC
    /// computed for the IP ID it will carry (its index in the GSO batch).
    fn push(&mut self, dev: &Device, len: usize, dst: Ipv4Addr, ip: Ip) {
        let l = len + icrc::ICRC_LEN;
        if self.count > 0
            && (!dev.sock.gso()
                || dst != self.dst
                || ip != self.ip
                || l > self.seg
                || self.closed
                // A lone longer packet (e.g. a WRITE First with its RETH) goes
                // alone, so the equal-size packets after it share one batch.
                || (self.count == 1 && l < self.seg)
                || self.count == MAX_GSO_SEGS
                || self.batch.len() + l > MAX_GSO_BYTES)
        {
            self.flush(dev);
        }
        if self.batch.capacity() == 0 {
            self.batch.reserve(MAX_GSO_BYTES + MAX_PACKET);
        }
        let fields = icrc::Ipv4Fields::new(dev.addr.octets(), dst.octets(), self.count as u16);
        let crc = icrc::icrc_ipv4(&fields, ROCE_PORT, ROCE_PORT, &self.scratch[..len]);
        self.batch.extend_from_slice(&self.scratch[..len]);
        self.batch.extend_from_slice(&crc.to_le_bytes());
        if self.count == 0 {
            self.dst = dst;
            self.ip = ip;
            self.seg = l;
        } else if l < self.seg {
            self.closed = true;
        }
        self.count += 1;
    }

    /// Sends the pending batch (one datagram, or one GSO datagram).
    pub fn flush(&mut self, dev: &Device) {
        if self.count == 0 {
            return;
        }
        let seg = (self.count > 1).then_some(self.seg);
        let r = dev.sock.send(&self.batch, seg, self.dst, self.ip);
        if let Err(e) = r {
            // A lost packet: RC retransmission recovers.
            if config::debug() {
                eprintln!("softroce: send to {} failed: {e}", self.dst);
            }
        }
        self.batch.clear();
        self.count = 0;
        self.closed = false;
    }
}

/// Drains one QP: queues every due packet on `tx` (the caller flushes),
/// delivers completions and events. Called with the QP's core locked.
pub fn drain_locked(dev: &Device, qp: &QpShared, core: &mut QpCore, now: Instant, tx: &mut Tx) {
    let mut mem = PdMemory {
        dev,
        pd: qp.pd,
        srq: qp.srq.as_deref(),
    };
    loop {
        let mut scratch = std::mem::take(&mut tx.scratch);
        let meta = core.poll_transmit(now, &mut mem, &mut scratch);
        tx.scratch = scratch;
        let Some(meta) = meta else { break };
        let Some(dst) = gid_to_ipv4(&meta.dgid) else {
            continue; // IPv6 GIDs are not routable by this device
        };
        let ip = Ip {
            ttl: meta.hop_limit,
            tos: meta.traffic_class,
        };
        tx.push(dev, meta.len.min(tx.scratch.len()), dst, ip);
    }
    // Packets (ACKs above all) leave before the application can see the
    // completions: a peer that exits right after its last completion must
    // not take our final ACK with it.
    tx.flush(dev);
    let mut send = [Wc::default(); 16];
    let mut recv = [Wc::default(); 16];
    let (mut ns, mut nr) = (0, 0);
    while let Some(c) = core.poll_completion() {
        let wc = Wc {
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            vendor_err: 0,
            byte_len: c.byte_len,
            imm_data: c.imm_data.unwrap_or(0),
            qp_num: c.qp_num,
            src_qp: c.src_qp,
            wc_flags: c.wc_flags,
            solicited: c.solicited,
            ts: now.as_nanos(),
        };
        match c.queue {
            proto::WcQueue::Send => {
                send[ns] = wc;
                ns += 1;
                if ns == send.len() {
                    qp.send_cq.push_many(&send[..ns]);
                    ns = 0;
                }
            }
            proto::WcQueue::Recv => {
                recv[nr] = wc;
                nr += 1;
                if nr == recv.len() {
                    qp.recv_cq.push_many(&recv[..nr]);
                    nr = 0;
                }
            }
        }
    }
    qp.send_cq.push_many(&send[..ns]);
    qp.recv_cq.push_many(&recv[..nr]);
    while let Some(ev) = core.poll_event() {
        let ty = match ev.ibv_event_type() {
            1 => rdma_sys::ibv_event_type::IBV_EVENT_QP_FATAL,
            2 => rdma_sys::ibv_event_type::IBV_EVENT_QP_REQ_ERR,
            3 => rdma_sys::ibv_event_type::IBV_EVENT_QP_ACCESS_ERR,
            4 => rdma_sys::ibv_event_type::IBV_EVENT_COMM_EST,
            5 => rdma_sys::ibv_event_type::IBV_EVENT_SQ_DRAINED,
            _ => rdma_sys::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED,
        };
        qp.async_q.push(ty, qp.ibv_ptr.load(Ordering::Relaxed));
    }
}

/// Runs `f` with this thread's transmit state and flushes it afterwards
/// (for verbs called by application threads).
pub fn with_tx<R>(dev: &Device, f: impl FnOnce(&mut Tx) -> R) -> R {
    thread_local! {
        static TX: std::cell::RefCell<Tx> = std::cell::RefCell::new(Tx::new());
    }
    TX.with(|t| match t.try_borrow_mut() {
        Ok(mut tx) => {
            let r = f(&mut tx);
            tx.flush(dev);
            r
        }
        Err(_) => {
            let mut tx = Tx::new();
            let r = f(&mut tx);
            tx.flush(dev);
            r
        }
    })
}

struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Runs the engine loop; a panic (a bug: nothing in it should panic on
/// packet data) is reported and the loop restarted, so the device keeps
/// working for its other QPs. Poisoned QP locks are taken over as they are.
fn supervise(dev: Arc<Device>) {
    loop {
        let d = dev.clone();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(d))).is_ok() {
            return;
        }
        eprintln!("softroce: {} progress engine panicked; restarting it", dev.name);
    }
}

/// Locks a QP core even if a panicking thread poisoned the mutex.
pub fn lock_core(qp: &QpShared) -> std::sync::MutexGuard<'_, QpCore> {
    qp.core.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(dev: Arc<Device>) {
    let eng = &dev.engine;
    let mut tx = Tx::new();
    let spin = config::spin_us() * 1000;
    let engine_rx = config::engine_rx();
    // Earliest known timer (ns). It may be stale-early (a timer was disarmed
    // since), which only costs a scan; it is never late: every QP event that
    // can arm a timer is seen here (own draining) or noted (other threads).
    let mut next = u64::MAX;
    loop {
        // 1. Deferred work, then timers: scan every QP only when the earliest
        // known deadline passed or the QP set changed.
        let t = now();
        if let Some(d) = drain_deferred(&dev, t, &mut tx) {
            next = next.min(d.as_nanos());
        }
        next = next.min(eng.noted.swap(u64::MAX, Ordering::AcqRel));
        if eng.rescan.swap(false, Ordering::AcqRel) || t.as_nanos() >= next {
            next = u64::MAX;
            let qps: Vec<Arc<QpShared>> = eng.qps.read().unwrap().values().cloned().collect();
            for qp in &qps {
                let mut core = lock_core(qp);
                let mut due = false;
                if let Some(d) = core.poll_timeout() {
                    if d <= t {
                        core.handle_timeout(t);
                        due = true;
                    }
                }
                if due {
                    drain_locked(&dev, qp, &mut core, t, &mut tx);
                }
                if let Some(d) = core.poll_timeout() {
                    next = next.min(d.as_nanos());
                }
            }
        }
        tx.flush(&dev);
        // Publish the deadline we will sleep on, then look at `noted` again:
        // a posting thread stores `noted` before it reads `sleep_until`, so
        // (SeqCst on both sides) either it kicks us or we see its deadline.
        eng.sleep_until.store(next, Ordering::SeqCst);
        let late = eng.noted.load(Ordering::SeqCst);
        if late < next {
            next = late;
            eng.sleep_until.store(next, Ordering::SeqCst);
        }
        // 2. Wait for packets, a kick, or the deadline (at most 10 ms, as a
        // safety net).
        let timeout_ms: i32 = if next == u64::MAX {
            10
        } else {
            let now_ns = now().as_nanos();
            if next <= now_ns {
                0
            } else {
                (next - now_ns).div_ceil(1_000_000).min(10) as i32
            }
        };
        let mut fds = [
            libc::pollfd {
                // poll(2) skips a negative fd: without engine receiving, the
                // socket is left to the polling application threads.
                fd: if engine_rx { dev.sock.fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: eng.wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // While traffic is flowing, poll without sleeping for up to `spin`
        // (yielding between polls) before blocking: a blocked thread's wake-up
        // costs tens of microseconds on a busy host.
        let mut ready = 0;
        if spin != 0 && now().as_nanos().saturating_sub(eng.last_rx.load(Ordering::Relaxed)) < spin * 4 {
            let until = now().as_nanos() + spin;
            while now().as_nanos() < until && !eng.has_dirty.load(Ordering::Acquire) {
                // SAFETY: fds is a live array of two pollfds.
                ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
                if ready != 0 {
                    break;
                }
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        if ready == 0 {
            // SAFETY: fds is a live array of two pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        }
        eng.sleep_until.store(0, Ordering::Release);
        if fds[1].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64.
            unsafe { libc::read(eng.wake_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
        // 3. Receive everything queued, in batches.
        if engine_rx {
            // An application thread receiving right now (receive_inline) holds
            // it for one batch at most: do not sleep on the lock (a futex
            // wake-up costs more than the batch), look at the socket again.
            let rx = match eng.rx.try_lock() {
                Ok(rx) => Some(rx),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            match rx {
                Some(mut rx) => {
                    if let (_, Some(d)) = receive(&dev, &mut rx, usize::MAX, true) {
                        next = next.min(d.as_nanos());
                    }
                }
                // SAFETY: sched_yield has no preconditions.
                None => unsafe {
                    libc::sched_yield();
                },
            }
        }
    }
}

/// Receives and handles queued datagrams, at most `max_batches` batches
/// (stops early when the socket has no more); returns how many datagrams it
/// handled and the earliest timer the handled QPs armed. Only the engine's own
/// receiving (`by_engine`) counts as traffic for its spin before blocking: when
/// pollers take the datagrams, the engine has nothing to spin for.
fn receive(dev: &Device, rx: &mut Rx, max_batches: usize, by_engine: bool) -> (usize, Option<Instant>) {
    let eng = &dev.engine;
    let loss = config::loss();
    let check = config::icrc_check();
    let debug = config::debug();
    let mut next: Option<Instant> = None;
    let mut landed_write = false;
    let mut handled = 0;
    for _ in 0..max_batches {
        let Rx {
            bufs,
            meta,
            tx,
            rng,
            touched,
            bad_icrc,
        } = &mut *rx;
        let n = dev.sock.recv_batch(bufs, meta).unwrap_or_default();
        if n == 0 {
            break;
        }
        handled += n;
        let t = now();
        if by_engine {
            eng.last_rx.store(t.as_nanos(), Ordering::Relaxed);
        }
        for i in 0..n {
            let m = meta[i];
            if m.src.ip().is_unspecified() || m.seg == 0 {
                continue;
            }
            let coalesced = m.len > m.seg;
            for (j, pkt) in bufs[i][..m.len].chunks(m.seg).enumerate() {
                if loss > 0.0 && rng.next_f64() < loss {
                    continue;
                }
                if pkt.len() < 12 + icrc::ICRC_LEN {
                    continue;
                }
                let body = if check {
                    // Segment j of a GSO send carries IP ID j; packets GRO
                    // merged from separate sends carry 0.
                    let v = |id: u16| {
                        let ip = icrc::Ipv4Fields::new(m.src.ip().octets(), dev.addr.octets(), id);
                        icrc::verify_ipv4(&ip, m.src.port(), ROCE_PORT, pkt)
                    };
                    match v(j as u16).or_else(|| if coalesced && j > 0 { v(0) } else { None }) {
                        Some(b) => b,
                        None => {
                            *bad_icrc += 1;
                            if debug {
                                eprintln!("softroce: bad ICRC from {} ({} so far)", m.src, bad_icrc);
                            }
                            continue;
                        }
                    }
                } else {
                    &pkt[..pkt.len() - icrc::ICRC_LEN]
                };
                // The end of an inbound RDMA WRITE: memory an application may be
                // watching changed (completions ring on their own).
                landed_write |= matches!(body[0], 0x08 | 0x0A);
                let qpn = u32::from_be_bytes([0, body[5], body[6], body[7]]);
                let Some(qp) = eng.qp(qpn) else { continue };
                {
                    let mut core = lock_core(&qp);
                    let mut mem = PdMemory {
                        dev,
                        pd: qp.pd,
                        srq: qp.srq.as_deref(),
                    };
                    core.handle_packet(t, body, &mut mem);
                }
                if !touched.iter().any(|q| q.qpn == qpn) {
                    touched.push(qp);
                }
            }
        }
        // Drain after each batch: ACKs coalesce across the batch.
        let t = now();
        for qp in touched.drain(..) {
            let mut core = lock_core(&qp);
            drain_locked(dev, &qp, &mut core, t, tx);
            if let Some(d) = core.poll_timeout() {
                next = earliest(next, Some(d));
            }
        }
        tx.flush(dev);
        if std::mem::take(&mut landed_write) {
            crate::activity::ring();
        }
        if n < RX_BATCH {
            break;
        }
    }
    (handled, next)
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// Sends what posting threads left for the engine (deferred small messages);
/// returns the earliest timer those QPs armed.
fn drain_deferred(dev: &Device, t: Instant, tx: &mut Tx) -> Option<Instant> {
    let eng = &dev.engine;
    if !eng.has_dirty.load(Ordering::Acquire) || !eng.has_dirty.swap(false, Ordering::AcqRel) {
        return None;
    }
    let dirty = std::mem::take(&mut *eng.dirty.lock().unwrap_or_else(|e| e.into_inner()));
    let mut next: Option<Instant> = None;
    for qp in &dirty {
        let mut core = lock_core(qp);
        qp.dirty.store(false, Ordering::Release);
        drain_locked(dev, qp, &mut core, t, tx);
        if let Some(d) = core.poll_timeout() {
            next = earliest(next, Some(d));
        }
    }
    next
}

/// For an application thread whose CQ poll found nothing: if no other thread
/// is receiving, receive and handle one batch of queued datagrams here (the
/// NIC's work done by a thread that would otherwise spin, instead of by the
/// engine thread competing with it for a CPU). Returns whether it did.
pub fn receive_inline(dev: &Device) -> bool {
    let Ok(mut rx) = dev.engine.rx.try_lock() else {
        return false;
    };
    let (handled, next) = receive(dev, &mut rx, 1, false);
    // Deferred sends wait for "the next answer"; when this thread took that
    // answer off the socket, the engine may not look soon: send them here.
    let next = earliest(next, drain_deferred(dev, now(), &mut rx.tx));
    drop(rx);
    // Timers armed here must reach the engine, which sleeps on its own list.
    dev.engine.note_deadline(next);
    handled > 0
}
