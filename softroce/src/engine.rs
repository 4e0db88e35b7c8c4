//! The progress engine: one background thread per device instance.
//!
//! It owns the receive side of the device's UDP socket, verifies and strips
//! the ICRC, demultiplexes on BTH.DestQP, feeds [`QpCore::handle_packet`],
//! runs the core timers and drains every touched QP: packets to the socket
//! (ICRC appended), completions to the CQs (waking completion channels),
//! async events to the owning context. Posting threads drain their own QP
//! directly after `post_send` (lowest latency) and wake this thread only
//! when they armed a timer earlier than the one it sleeps on.
//!
//! All signals are blocked in the engine thread (perftest uses SIGALRM).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crate::config;
use crate::device::{gid_to_ipv4, Device, MrInfo};
use crate::proto::{self, AtomicOp, Instant, LocalAccessError, MemoryAccess, QpCore, RemoteAccess, RemoteAccessError};
use crate::udp::{MAX_DGRAM, ROCE_PORT};
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
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub async_q: Arc<AsyncQueue>,
    /// The application's `ibv_qp *` (element of async events).
    pub ibv_ptr: AtomicUsize,
    /// Set when the QP should be drained by the engine (e.g. timers changed).
    pub dirty: AtomicBool,
}

/// Memory of one PD, through the device's MR table (what the core sees).
pub struct PdMemory<'a> {
    pub dev: &'a Device,
    pub pd: u32,
}

impl PdMemory<'_> {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        self.dev
            .mrs
            .read()
            .unwrap()
            .get(&key)
            .copied()
            .filter(|m| m.pd == self.pd)
    }

    /// Host address of `[addr, addr+len)` in MR `m`'s IOVA space.
    fn translate(m: &MrInfo, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(m.iova)?;
        let end = off.checked_add(len)?;
        if end > m.len as u64 {
            return None;
        }
        Some(m.addr + off as usize)
    }

    fn local(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<usize, LocalAccessError> {
        let m = self.lookup(lkey).ok_or(LocalAccessError::InvalidKey)?;
        if write && m.access & proto::mem::access::LOCAL_WRITE == 0 {
            return Err(LocalAccessError::Permission);
        }
        Self::translate(&m, addr, len).ok_or(LocalAccessError::OutOfBounds)
    }

    fn remote(&self, rkey: u32, va: u64, len: u64, what: RemoteAccess) -> Result<usize, RemoteAccessError> {
        let m = self.lookup(rkey).ok_or(RemoteAccessError::InvalidKey)?;
        let need = match what {
            RemoteAccess::Write => proto::mem::access::REMOTE_WRITE,
            RemoteAccess::Read => proto::mem::access::REMOTE_READ,
            RemoteAccess::Atomic => proto::mem::access::REMOTE_ATOMIC,
        };
        if m.access & need == 0 {
            return Err(RemoteAccessError::Permission);
        }
        Self::translate(&m, va, len).ok_or(RemoteAccessError::OutOfBounds)
    }
}

impl MemoryAccess for PdMemory<'_> {
    fn local_check(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<(), LocalAccessError> {
        if len == 0 {
            return Ok(());
        }
        self.local(lkey, addr, len, write).map(|_| ())
    }
    fn local_read(&self, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), LocalAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        let p = self.local(lkey, addr, buf.len() as u64, false)?;
        // SAFETY: p..p+len lies inside a registered MR, which the application
        // keeps mapped while it is registered (verbs contract).
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), LocalAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        let p = self.local(lkey, addr, data.len() as u64, true)?;
        // SAFETY: as in local_read; the MR has LOCAL_WRITE.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len()) };
        Ok(())
    }
    fn remote_check(&self, rkey: u32, va: u64, len: u64, what: RemoteAccess) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        if what == RemoteAccess::Atomic && va % 8 != 0 {
            return Err(RemoteAccessError::Misaligned);
        }
        self.remote(rkey, va, len, what).map(|_| ())
    }
    fn remote_write(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), RemoteAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        let p = self.remote(rkey, va, data.len() as u64, RemoteAccess::Write)?;
        // SAFETY: inside a registered MR with REMOTE_WRITE.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len()) };
        Ok(())
    }
    fn remote_read(&self, rkey: u32, va: u64, buf: &mut [u8]) -> Result<(), RemoteAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        let p = self.remote(rkey, va, buf.len() as u64, RemoteAccess::Read)?;
        // SAFETY: inside a registered MR with REMOTE_READ.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn remote_atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        if va % 8 != 0 {
            return Err(RemoteAccessError::Misaligned);
        }
        let p = self.remote(rkey, va, 8, RemoteAccess::Atomic)?;
        if p % 8 != 0 {
            return Err(RemoteAccessError::Misaligned);
        }
        // SAFETY: p is 8-byte aligned and inside an MR with REMOTE_ATOMIC; an
        // AtomicU64 view makes the update atomic w.r.t. every other atomic
        // (engine threads, CPU atomics of the application) on the same word.
        let a = unsafe { &*(p as *const std::sync::atomic::AtomicU64) };
        let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(op.apply(v)));
        Ok(r.unwrap_or_else(|v| v))
    }
}

pub struct Engine {
    dev: Weak<Device>,
    qps: RwLock<HashMap<u32, Arc<QpShared>>>,
    wake_fd: i32,
    /// Deadline (ns) the engine sleeps until; u64::MAX when it waits for input only.
    sleep_until: AtomicU64,
}

impl Engine {
    pub fn new(dev: Weak<Device>) -> Engine {
        // SAFETY: plain eventfd(2) call; a failure leaves -1 and the engine polls periodically.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        Engine {
            dev,
            qps: RwLock::new(HashMap::new()),
            wake_fd,
            sleep_until: AtomicU64::new(u64::MAX),
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
            .spawn(move || run(dev));
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
    }

    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.write().unwrap().remove(&qpn)
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
            if d.as_nanos() < self.sleep_until.load(Ordering::Acquire) {
                self.kick();
            }
        }
    }
}

/// Drains one QP: transmits every due packet, delivers completions and events.
/// Called with the QP's core locked by the caller.
pub fn drain_locked(dev: &Device, qp: &QpShared, core: &mut QpCore, now: Instant, buf: &mut Vec<u8>) {
    let mut mem = PdMemory { dev, pd: qp.pd };
    while let Some(meta) = core.poll_transmit(now, &mut mem, buf) {
        let Some(dst) = gid_to_ipv4(&meta.dgid) else {
            continue; // IPv6 GIDs are not routable by this device
        };
        buf.truncate(meta.len);
        append_icrc(buf, dev.addr, dst);
        let _ = dev.sock.send_to(buf, dst);
    }
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
            solicited: false,
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

/// Appends the ICRC for a datagram `src:4791 -> dst:4791` carrying `buf`
/// (BTH..pad), as the kernel will send it: IPv4, DF, ID 0.
pub fn append_icrc(buf: &mut Vec<u8>, src: Ipv4Addr, dst: Ipv4Addr) {
    let ip = icrc::Ipv4Fields::new(src.octets(), dst.octets(), 0);
    let crc = icrc::icrc_ipv4(&ip, ROCE_PORT, ROCE_PORT, buf);
    buf.extend_from_slice(&crc.to_le_bytes());
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

fn run(dev: Arc<Device>) {
    let eng = &dev.engine;
    const BATCH: usize = 32;
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; MAX_DGRAM]).collect();
    let mut lens = [0usize; BATCH];
    let mut srcs = [SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0); BATCH];
    let mut txbuf: Vec<u8> = Vec::with_capacity(MAX_DGRAM);
    let loss = config::loss();
    let mut rng = Rng(config::seed() | 1);
    let check = config::icrc_check();
    let debug = config::debug();
    let mut touched: Vec<Arc<QpShared>> = Vec::new();
    let mut bad_icrc: u64 = 0;
    loop {
        // 1. Timers: find the earliest deadline, fire expired ones.
        let t = now();
        let mut next = u64::MAX;
        let qps: Vec<Arc<QpShared>> = eng.qps.read().unwrap().values().cloned().collect();
        for qp in &qps {
            let mut core = qp.core.lock().unwrap();
            let mut due = qp.dirty.swap(false, Ordering::AcqRel);
            if let Some(d) = core.poll_timeout() {
                if d <= t {
                    core.handle_timeout(t);
                    due = true;
                }
            }
            if due {
                drain_locked(&dev, qp, &mut core, t, &mut txbuf);
            }
            if let Some(d) = core.poll_timeout() {
                next = next.min(d.as_nanos());
            }
        }
        drop(qps);
        eng.sleep_until.store(next, Ordering::Release);
        // 2. Wait for packets, a kick, or the deadline.
        let timeout_ms: i32 = if next == u64::MAX {
            100
        } else {
            let now_ns = now().as_nanos();
            if next <= now_ns {
                0
            } else {
                (((next - now_ns) + 999_999) / 1_000_000).min(100) as i32
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: dev.sock.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: eng.wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a live array of two pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        eng.sleep_until.store(0, Ordering::Release);
        if fds[1].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64.
            unsafe { libc::read(eng.wake_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
        // 3. Receive everything queued, in batches.
        loop {
            let n = match dev.sock.recv_batch(&mut bufs, &mut lens, &mut srcs) {
                Ok(n) => n,
                Err(_) => 0,
            };
            if n == 0 {
                break;
            }
            let t = now();
            for i in 0..n {
                if loss > 0.0 && rng.next_f64() < loss {
                    continue;
                }
                let len = lens[i];
                if len < 12 + 4 || *srcs[i].ip() == Ipv4Addr::UNSPECIFIED {
                    continue;
                }
                let pkt = &bufs[i][..len];
                let body = if check {
                    let ip = icrc::Ipv4Fields::new(srcs[i].ip().octets(), dev.addr.octets(), 0);
                    match icrc::verify_ipv4(&ip, srcs[i].port(), ROCE_PORT, pkt) {
                        Some(b) => b,
                        None => {
                            bad_icrc += 1;
                            if debug {
                                eprintln!("softroce: bad ICRC from {} ({bad_icrc} so far)", srcs[i]);
                            }
                            continue;
                        }
                    }
                } else {
                    &pkt[..len - icrc::ICRC_LEN]
                };
                let qpn = u32::from_be_bytes([0, body[5], body[6], body[7]]);
                let Some(qp) = eng.qp(qpn) else { continue };
                {
                    let mut core = qp.core.lock().unwrap();
                    let mut mem = PdMemory { dev: &dev, pd: qp.pd };
                    core.handle_packet(t, body, &mut mem);
                }
                if !touched.iter().any(|q| q.qpn == qpn) {
                    touched.push(qp);
                }
            }
            // Drain after each batch: ACKs coalesce across the batch.
            let t = now();
            for qp in touched.drain(..) {
                let mut core = qp.core.lock().unwrap();
                drain_locked(&dev, &qp, &mut core, t, &mut txbuf);
            }
            if n < BATCH {
                break;
            }
        }
    }
}
