//! Connections and the data path (spec §7.2–§7.8, §8.4–§8.10).
//!
//! `api.rs` calls exactly these entry points; every ABI version drives the same code.
//!
//! * [`listen`] / [`connect`] / [`ListenComm::accept`]: non-blocking setup over a TCP side
//!   channel ([`sidechannel`]) with a versioned handshake ([`handshake`]).
//! * [`reg_mr`] / [`dereg_mr`]: a process-wide, refcounted MR cache per device ([`mr_cache`]);
//!   they need no comm, so the service thread never touches a comm the progress thread uses.
//! * [`SendComm::isend`], [`RecvComm::irecv`], [`RecvComm::iflush`], [`test`]: the receiver-driven
//!   CTS FIFO design ([`fifo`], [`split`], [`request`]).
//! * Close = drop of the boxed comm; safe with requests in flight.
//!
//! Errors: unreachable or failed peer → `ErrorKind::Remote`; OS / verbs failure → `System`;
//! NCCL misuse → `Internal`. Completion errors are WARNed once per comm ([`errors`]).
//!
//! Connection setup (connector → listener, one TCP connection per comm, kept open afterwards
//! as the liveness probe): `ConnectReq` (sender devices, QPs, CTS FIFO address/rkeys, tc/sl,
//! split flag) → `ConnectResp` (receiver devices, QPs, completion-record address/rkeys, echoed
//! tc/sl; the receiver's QPs are already RTS) → `Ready` (the sender's QPs are RTS). Both ends
//! give up after `FERROCE_CONNECT_TIMEOUT_SEC`. QP *i* lives on member device *i mod ndevs*,
//! `NCCL_IB_QPS_PER_CONNECTION × max(ndevs local, remote)` QPs in all; the receiver adopts
//! the sender's QP count and split mode.
//!
//! Limits: 32 receives in flight per recv comm (NCCL_NET_MAX_REQUESTS) holding at most 64 CTS
//! entries in all (the FIFO ring: NCCL_STEPS 8 × maxRecvs 8), 32 flushes besides (an error
//! beyond: iflush cannot say "retry later"); 64 isends in
//! flight per send comm; beyond these irecv/isend return "retry later" (spec §7.6). Grouped
//! receives of up to 8 buffers of ≤ 4 GiB each.
//!
//! Per-message path: no allocation, no lock; syscalls only inside the provider's post/poll and
//! one rate-limited `recv(MSG_PEEK)` on the side channel while a request waits for the peer.

pub mod clock;
pub mod conn;
pub mod driver;
pub mod errors;
pub mod handshake;
pub mod mr_cache;
pub mod proto;
pub mod recv;
pub mod ring_memory;
pub mod send;
pub mod sidechannel;
pub mod stats;

use crate::api::CommContext;
use crate::config;
use crate::device::{NetDevice, VirtualDevice};
use crate::error::Error;
use crate::ibv::mr::MemoryRegion;
use crate::ibv::qp::QpCaps;
use crate::ibv::{sys, QueuePair};
use conn::{Conn, LocalDev, RegBuf};
use handshake::{EndpointRepr, HandleRepr, Message, FLAG_SPLIT};
use parking_lot::Mutex;
use proto::limits::MAX_DEVS;
use proto::{fifo, request, split};
use sidechannel::{Channel, ChannelError, Connector};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use proto::request::Request;

type Result<T> = std::result::Result<T, Error>;

/// Memory type of a registration (`NCCL_PTR_HOST` / `NCCL_PTR_CUDA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Cuda,
}

// Queue and CQ sizes, from what can be outstanding at once (no CQ can overflow, even when a
// failed QP flushes every WR it holds: softroce and the verbs spec give a flushed WR a
// completion whether it was signaled or not, and an overrun CQ is a device-fatal event).

/// Send WRs per sender data QP: its credits (bound: WRs not yet retired ≤ send::SQ_DEPTH).
const SENDER_SEND_WR: u32 = proto::send::SQ_DEPTH as u32;
/// CQ entries per sender data QP: ≤ one per unretired WR (send::SQ_DEPTH); nothing else
/// completes on the sender's CQ.
const SENDER_CQE_PER_QP: usize = proto::send::SQ_DEPTH;
/// Send WRs per receiver QP: CTS writes (bound: unretired ≤ recv::CTS_DEPTH, only on the first
/// QP of each device).
const RECEIVER_SEND_WR: u32 = proto::recv::CTS_DEPTH as u32;
/// Receive WRs per receiver QP: one per receive in flight that uses the QP (≤ RECVS_IN_FLIGHT;
/// a receive's WRs complete before test() reports it).
const RECEIVER_RECV_WR: u32 = request::RECVS_IN_FLIGHT as u32;
/// CQ entries per receiver QP: its receive WRs (nothing else of the QP is signaled but the
/// CTS writes, counted per device below).
const RECEIVER_CQE_PER_QP: usize = request::RECVS_IN_FLIGHT;
/// CQ entries per receiver device besides the per-QP ones: the CTS writes of its one CTS QP
/// (≤ recv::CTS_DEPTH unretired). Flush reads complete elsewhere (FLUSH_CQE), so the receive
/// CQ of a device holds m·RECVS_IN_FLIGHT + CTS_DEPTH for its m QPs.
const RECEIVER_CQE_CTS: usize = proto::recv::CTS_DEPTH;
/// Send WRs of a flush loopback QP (made by a comm's first iflush, one per local device): one
/// RDMA read per flush in flight (bound: ≤ request::FLUSHES_IN_FLIGHT, enforced by iflush,
/// which fails beyond; a read's WR is outstanding until its completion is polled, which
/// test() does before it reclaims the flush; a failed comm reclaims nothing and posts nothing).
const FLUSH_SEND_WR: u32 = request::FLUSHES_IN_FLIGHT as u32;
/// Entries of a flush QP's own CQ: one per outstanding read (≤ FLUSH_SEND_WR, also when the
/// QP fails and flushes them all); nothing else completes there.
const FLUSH_CQE: usize = request::FLUSHES_IN_FLIGHT;
// Every QP of a connection has an index a send wr_id can carry.
const _: () = assert!(handshake::MAX_QPS <= request::WR_ID_QPS && proto::limits::MAX_QPS <= request::WR_ID_QPS);
/// Inline bytes requested when NCCL_IB_USE_INLINE=1 (one CTS entry).
const INLINE_BYTES: u32 = fifo::ENTRY_BYTES as u32;
fn remote_access() -> u32 {
    use sys::ibv_access_flags as A;
    A::IBV_ACCESS_LOCAL_WRITE.0 | A::IBV_ACCESS_REMOTE_WRITE.0 | A::IBV_ACCESS_REMOTE_READ.0
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into v.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if n != 8 {
        // Fall back to time and address entropy; uniqueness, not secrecy, is what matters.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        v = t ^ (&v as *const u64 as u64).rotate_left(32) ^ u64::from(std::process::id());
    }
    v | 1
}

fn setup_timeout() -> Duration {
    Duration::from_secs(config::get().connect_timeout_sec.max(1))
}

fn inline_bytes() -> u32 {
    if config::get().use_inline {
        INLINE_BYTES
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

/// A registration of one range on every member device of a (fused) device.
pub struct MemHandle {
    addr: usize,
    len: usize,
    ndevs: usize,
    /// Per member device; read by the data path without locks.
    pub(crate) lkeys: [u32; MAX_DEVS],
    pub(crate) rkeys: [u32; MAX_DEVS],
    regs: Vec<(Arc<mr_cache::DeviceCache>, Arc<MemoryRegion>)>,
}

impl MemHandle {
    /// `[data, data + size)` must lie in the registration (page-rounded), made for ≥ `ndevs`
    /// member devices.
    pub(crate) fn check(&self, data: usize, size: usize, ndevs: usize) -> Result<()> {
        if self.ndevs < ndevs {
            return Err(Error::internal(format!(
                "memory handle registered on {} device(s) used on a comm with {ndevs}",
                self.ndevs
            )));
        }
        if size == 0 {
            return Ok(());
        }
        let page = mr_cache::page_size();
        let (start, end) = mr_cache::page_range(self.addr, self.len, page);
        if data < start || data.saturating_add(size) > end {
            return Err(Error::internal(format!(
                "buffer {data:#x}+{size} lies outside its registration {:#x}+{}",
                self.addr, self.len
            )));
        }
        Ok(())
    }
}

/// Registers `[addr, addr+len)` on every member device (process-wide MR cache); needs no comm,
/// so the service thread never aliases a comm the progress thread is using.
pub fn reg_mr(
    dev: &Arc<VirtualDevice>,
    addr: usize,
    len: usize,
    _kind: MemKind,
    dmabuf: Option<(i32, u64)>,
) -> Result<Box<MemHandle>> {
    if dev.members.is_empty() || dev.members.len() > MAX_DEVS {
        return Err(Error::internal(format!(
            "device {} has {} members",
            dev.name,
            dev.members.len()
        )));
    }
    let mut mh = Box::new(MemHandle {
        addr,
        len,
        ndevs: dev.members.len(),
        lkeys: [0; MAX_DEVS],
        rkeys: [0; MAX_DEVS],
        regs: Vec::with_capacity(dev.members.len()),
    });
    if len == 0 {
        // Nothing to register: only zero-byte transfers can use it (they name no memory).
        return Ok(mh);
    }
    for (d, m) in dev.members.iter().enumerate() {
        let cache = mr_cache::cache_for(&m.pd);
        match cache.acquire(addr, len, dmabuf) {
            Ok(mr) => {
                mh.lkeys[d] = mr.lkey();
                mh.rkeys[d] = mr.rkey();
                mh.regs.push((cache, mr));
            }
            Err(e) => {
                let _ = dereg_mr(mh);
                let how = match dmabuf {
                    Some((fd, off)) => format!("DMA-BUF fd {fd} offset {off}"),
                    None => "host/peer memory".into(),
                };
                return Err(e.context(format!("registering {addr:#x}+{len} ({how}) on {}", m.label())));
            }
        }
    }
    Ok(mh)
}

/// Releases a registration made by [`reg_mr`].
#[allow(clippy::boxed_local)] // the API layer hands back the Box it got from reg_mr
pub fn dereg_mr(mh: Box<MemHandle>) -> Result<()> {
    for (cache, mr) in &mh.regs {
        cache.release(mr);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Listen / accept
// ---------------------------------------------------------------------------------------------

/// A TCP connection on the listener whose first message has not arrived yet.
struct Pending {
    chan: Channel,
    since: Instant,
}

/// The connection that sent a valid request: resources are up, waiting for `Ready`.
struct Accepting {
    chan: Channel,
    parts: RecvParts,
    since: Instant,
}

/// A listening endpoint: one TCP listener plus the handshakes in progress on it.
pub struct ListenComm {
    listener: TcpListener,
    nonce: u64,
    members: Vec<Arc<NetDevice>>,
    pending: Vec<Pending>,
    accepting: Option<Accepting>,
    first_accept: Option<Instant>,
}

/// Most simultaneous unidentified connections kept per listener.
const MAX_PENDING: usize = 64;

/// Open a listener on the side-channel interface and write the handle (≤ 128 bytes).
/// Never blocks; always returns a comm on success.
pub fn listen(_ctx: &CommContext, dev: &Arc<VirtualDevice>, handle: &mut [u8; 128]) -> Result<Box<ListenComm>> {
    if dev.members.is_empty() || dev.members.len() > MAX_DEVS {
        return Err(Error::internal(format!(
            "device {} has {} members",
            dev.name,
            dev.members.len()
        )));
    }
    let ifa = sidechannel::side_channel_interface()?;
    let listener = sidechannel::bind_listener(ifa)?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::system(format!("getsockname on the listener: {e}")))?;
    let nonce = random_u64();
    HandleRepr {
        addr,
        ndevs: dev.members.len() as u8,
        nonce,
    }
    .emit(handle);
    Ok(Box::new(ListenComm {
        listener,
        nonce,
        members: dev.members.clone(),
        pending: Vec::new(),
        accepting: None,
        first_accept: None,
    }))
}

impl ListenComm {
    /// Non-blocking accept; `None` while no peer has completed the handshake. Malformed or
    /// foreign connections are WARNed and dropped; the listener keeps working.
    pub fn accept(&mut self) -> Result<Option<Box<RecvComm>>> {
        let timeout = setup_timeout();
        let now = Instant::now();
        let first = *self.first_accept.get_or_insert(now);
        while let Some(chan) = sidechannel::try_accept(&self.listener)? {
            if self.pending.len() >= MAX_PENDING {
                let old = self.pending.remove(0);
                crate::log_warn!(
                    "listener: too many unidentified connections, dropping the one from {}",
                    old.chan.peer
                );
            }
            self.pending.push(Pending { chan, since: now });
        }
        // Unidentified connections: wait for their first message.
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            match p.chan.poll_recv() {
                Ok(None) if now.duration_since(p.since) < timeout => {
                    i += 1;
                }
                Ok(None) => {
                    let p = self.pending.remove(i);
                    crate::log_warn!(
                        "listener: {} connected but sent nothing for {timeout:?}; dropped",
                        p.chan.peer
                    );
                }
                Ok(Some(Message::ConnectReq(req))) => {
                    let mut p = self.pending.remove(i);
                    if req.nonce != self.nonce {
                        crate::log_warn!(
                            "listener: connection from {} carries another listener's handle (nonce mismatch: a stale or foreign handle); rejected",
                            p.chan.peer
                        );
                        p.chan.queue(&Message::Reject {
                            code: 1,
                            text: "nonce mismatch: this listener did not issue that handle".into(),
                        });
                        let _ = p.chan.flush();
                        continue;
                    }
                    if self.accepting.is_some() {
                        crate::log_warn!(
                            "listener: second connection attempt from {} while one is being accepted; rejected",
                            p.chan.peer
                        );
                        p.chan.queue(&Message::Reject {
                            code: 2,
                            text: "this listener is already accepting a connection".into(),
                        });
                        let _ = p.chan.flush();
                        continue;
                    }
                    match build_recv(&self.members, &req, self.nonce) {
                        Ok((parts, resp)) => {
                            p.chan.queue(&Message::ConnectResp(resp));
                            self.accepting = Some(Accepting {
                                chan: p.chan,
                                parts,
                                since: now,
                            });
                        }
                        Err(e) => {
                            p.chan.queue(&Message::Reject {
                                code: 3,
                                text: format!("receiver setup failed: {e}"),
                            });
                            let _ = p.chan.flush();
                            return Err(e.context(format!("accepting the connection from {}", p.chan.peer)));
                        }
                    }
                }
                Ok(Some(other)) => {
                    let p = self.pending.remove(i);
                    crate::log_warn!(
                        "listener: unexpected first message from {}: {:?}; dropped",
                        p.chan.peer,
                        kind_name(&other)
                    );
                }
                Err(ChannelError::Wire(e)) => {
                    let p = self.pending.remove(i);
                    crate::log_warn!("listener: rejected a connection from {}: {e}", p.chan.peer);
                }
                Err(e) => {
                    let p = self.pending.remove(i);
                    crate::log_info!(
                        crate::log::subsys::NET,
                        "listener: connection from {} went away before identifying itself: {e}",
                        p.chan.peer
                    );
                }
            }
        }
        // The identified connection: send our answer, wait for Ready.
        if let Some(a) = &mut self.accepting {
            let result = a.chan.flush().and_then(|_| a.chan.poll_recv());
            match result {
                Ok(Some(Message::Ready { nonce })) if nonce == self.nonce => {
                    let a = self.accepting.take().expect("checked above");
                    return Ok(Some(Box::new(RecvComm {
                        dp: a.parts.finish(a.chan),
                    })));
                }
                Ok(None) if now.duration_since(a.since) < timeout => {}
                Ok(None) => {
                    let a = self.accepting.take().expect("checked above");
                    crate::log_warn!(
                        "listener: {} did not finish the handshake within {timeout:?}; dropped",
                        a.chan.peer
                    );
                }
                Ok(Some(m)) => {
                    let a = self.accepting.take().expect("checked above");
                    crate::log_warn!(
                        "listener: {} sent {:?} instead of Ready; dropped",
                        a.chan.peer,
                        kind_name(&m)
                    );
                }
                Err(e) => {
                    let a = self.accepting.take().expect("checked above");
                    crate::log_warn!("listener: {} failed during the handshake: {e}; dropped", a.chan.peer);
                }
            }
        }
        if self.accepting.is_none() && now.duration_since(first) > timeout {
            return Err(Error::remote(format!(
                "no peer completed a connection to this listener ({}) within {timeout:?} — is the sending rank alive and can it reach this address? (FERROCE_CONNECT_TIMEOUT_SEC sets the limit)",
                self.listener.local_addr().map(|a| a.to_string()).unwrap_or_default()
            )));
        }
        Ok(None)
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::ConnectReq(_) => "ConnectReq",
        Message::ConnectResp(_) => "ConnectResp",
        Message::Ready { .. } => "Ready",
        Message::Reject { .. } => "Reject",
    }
}

/// Receiver resources built on a valid request, before the connector's Ready.
struct RecvParts {
    devs: Vec<LocalDev>,
    qps: Vec<conn::ConnQp>,
    /// iflush issues reads (its flush QPs are made by the first one).
    flush: bool,
    bufs: RegBuf,
    peer: EndpointRepr,
    qps_per_req: usize,
}

impl RecvParts {
    fn finish(self, mut chan: Channel) -> Box<recv::RecvDp> {
        let p = self;
        chan.release_buffers();
        let conn = Conn {
            qps: p.qps,
            devs: p.devs,
            peer: p.peer,
            chan,
            qps_per_req: p.qps_per_req,
        };
        recv::RecvDp::new(conn, p.flush, p.bufs, config::get().use_inline)
    }
}

/// Whether receives need the GPU flush (spec §8.3): peer memory or DMA-BUF, and not disabled.
fn flush_wanted(members: &[Arc<NetDevice>]) -> bool {
    static PEER_MEMORY: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    let peer = *PEER_MEMORY.get_or_init(crate::device::peer_memory_present);
    !config::get().gdr_flush_disable && (peer || members.iter().all(|m| m.dmabuf))
}

fn build_recv(members: &[Arc<NetDevice>], req: &EndpointRepr, nonce: u64) -> Result<(RecvParts, EndpointRepr)> {
    let cfg = config::get();
    let nl = members.len();
    let nr = req.devs.len();
    let nqps = req.qps.len();
    let ndata = nl.max(nr);
    if nqps < ndata {
        return Err(Error::remote(format!(
            "the sender offers {nqps} QPs for {ndata} device pairs"
        )));
    }
    let flush = flush_wanted(members);
    let devs = conn::local_devs(members, nqps, RECEIVER_CQE_PER_QP, RECEIVER_CQE_CTS)?;
    let qps = conn::create_qps(
        &devs,
        nqps,
        QpCaps {
            max_send_wr: RECEIVER_SEND_WR,
            max_recv_wr: RECEIVER_RECV_WR,
            max_inline_data: inline_bytes(),
        },
        sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        cfg,
    )?;
    conn::check_peer(&devs, nqps, req)?;
    // The CTS staging, which also holds the completion records, in one registration; the peer
    // is told the completion records' address.
    let bufs = RegBuf::new(&devs, recv::RECV_BLOCK_BYTES, remote_access())?;
    let rkeys: Vec<u32> = bufs.mrs.iter().map(|m| m.rkey()).collect();
    let resp = conn::endpoint(
        &devs,
        &qps,
        nonce,
        req.tc,
        req.sl,
        req.flags,
        (bufs.addr() + recv::CMPL_OFF) as u64,
        &rkeys,
    );
    // Our QPs carry the CTS writes: NCCL_IB_FIFO_TC if set, else the sender's data tc.
    let tc = if cfg.fifo_tc >= 0 {
        (cfg.fifo_tc & 0xff) as u8
    } else {
        req.tc
    };
    let qps = conn::bring_up(&devs, qps, req, tc, req.sl, cfg)?;
    let split = req.flags & FLAG_SPLIT != 0;
    let parts = RecvParts {
        devs,
        qps,
        flush,
        bufs,
        peer: req.clone(),
        qps_per_req: split::qps_per_request(split, nqps, ndata),
    };
    Ok((parts, resp))
}

// ---------------------------------------------------------------------------------------------
// Connect
// ---------------------------------------------------------------------------------------------

/// Sender resources from TCP connect to the peer's answer.
struct SendSetup {
    chan: Channel,
    devs: Vec<LocalDev>,
    qps: Option<Vec<QueuePair>>,
    conn_qps: Option<Vec<conn::ConnQp>>,
    bufs: RegBuf,
    peer: Option<EndpointRepr>,
    qps_per_req: usize,
}

/// A connect in progress, found again through the id recorded in the handle.
struct Connecting {
    id: u64,
    listener: HandleRepr,
    members: Vec<Arc<NetDevice>>,
    traffic_class: i32,
    connector: Connector,
    setup: Option<SendSetup>,
    started: Instant,
    touched: Instant,
}

static CONNECTING: Mutex<Vec<Connecting>> = Mutex::new(Vec::new());
static NEXT_CONNECT_ID: AtomicU64 = AtomicU64::new(1);

/// Drop every connect NCCL started and abandoned (never re-entered). They hold device
/// references, so the last `finalize` calls this before closing the devices.
pub fn forget_pending_connects() -> usize {
    let mut all = CONNECTING.lock();
    let n = all.len();
    all.clear();
    n
}

/// Non-blocking connect. Re-entered with the same handle until it returns `Some`; the
/// in-progress state lives in this module, keyed by an id recorded in the handle.
pub fn connect(ctx: &CommContext, dev: &Arc<VirtualDevice>, handle: &mut [u8; 128]) -> Result<Option<Box<SendComm>>> {
    let listener = HandleRepr::parse(handle).map_err(|e| {
        Error::internal(format!(
            "connect: the handle is not a ferroce listen handle ({e}); do both ranks load the same plugin?"
        ))
    })?;
    if dev.members.is_empty() || dev.members.len() > MAX_DEVS {
        return Err(Error::internal(format!(
            "device {} has {} members",
            dev.name,
            dev.members.len()
        )));
    }
    let timeout = setup_timeout();
    let now = Instant::now();
    let mut c = {
        let mut all = CONNECTING.lock();
        // Connects NCCL abandoned (it never called again) are reclaimed after twice the timeout.
        all.retain(|c| now.duration_since(c.touched) < 2 * timeout);
        let found =
            handshake::read_stage(handle).and_then(|id| all.iter().position(|c| c.id == id && c.listener == listener));
        match found {
            Some(i) => all.swap_remove(i),
            None => {
                let id = NEXT_CONNECT_ID.fetch_add(1, Ordering::Relaxed);
                Connecting {
                    id,
                    listener,
                    members: dev.members.clone(),
                    traffic_class: ctx.traffic_class,
                    connector: Connector::new(listener.addr, timeout),
                    setup: None,
                    started: now,
                    touched: now,
                }
            }
        }
    };
    c.touched = now;
    match progress_connect(&mut c, timeout) {
        Ok(Some(comm)) => {
            handshake::write_stage(handle, None);
            Ok(Some(comm))
        }
        Ok(None) => {
            handshake::write_stage(handle, Some(c.id));
            CONNECTING.lock().push(c);
            Ok(None)
        }
        Err(e) => {
            handshake::write_stage(handle, None);
            Err(e)
        }
    }
}

fn progress_connect(c: &mut Connecting, timeout: Duration) -> Result<Option<Box<SendComm>>> {
    let cfg = config::get();
    if c.setup.is_none() {
        let Some(chan) = c.connector.poll()? else {
            return Ok(None);
        };
        let nl = c.members.len();
        let nr = c.listener.ndevs as usize;
        let ndata = nl.max(nr);
        let nqps = (cfg.qps_per_connection.clamp(1, 128) as usize) * ndata;
        let devs = conn::local_devs(&c.members, nqps, SENDER_CQE_PER_QP, 0)?;
        let qps = conn::create_qps(
            &devs,
            nqps,
            QpCaps {
                max_send_wr: SENDER_SEND_WR,
                max_recv_wr: 0,
                max_inline_data: inline_bytes(),
            },
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
            cfg,
        )?;
        // The FIFO (remote-writable) and the grouped-send sizes in one registration.
        let bufs = RegBuf::new(&devs, send::SEND_BLOCK_BYTES, remote_access())?;
        let (tc, sl) = conn::tc_sl(cfg, c.traffic_class);
        let rkeys: Vec<u32> = bufs.mrs.iter().map(|m| m.rkey()).collect();
        let flags = if cfg.split_data_on_qps { FLAG_SPLIT } else { 0 };
        let req = conn::endpoint(&devs, &qps, c.listener.nonce, tc, sl, flags, bufs.addr() as u64, &rkeys);
        let mut chan = chan;
        chan.queue(&Message::ConnectReq(req));
        c.setup = Some(SendSetup {
            chan,
            devs,
            qps: Some(qps),
            conn_qps: None,
            bufs,
            peer: None,
            qps_per_req: split::qps_per_request(cfg.split_data_on_qps, nqps, ndata),
        });
    }
    let s = c.setup.as_mut().expect("set above");
    let peer_addr = s.chan.peer;
    let io_err = |e: ChannelError| {
        Error::remote(format!(
            "connection setup with {peer_addr} failed: {e} — did the peer process exit or reject us? (see its log)"
        ))
    };
    let sent = s.chan.flush().map_err(io_err)?;
    if s.conn_qps.is_none() {
        match s.chan.poll_recv() {
            Ok(None) => {}
            Ok(Some(Message::ConnectResp(resp))) => {
                if resp.nonce != c.listener.nonce {
                    return Err(Error::remote(format!(
                        "{peer_addr} answered with another nonce: not the listener of this handle"
                    )));
                }
                let qps = s.qps.take().expect("QPs not brought up yet");
                conn::check_peer(&s.devs, qps.len(), &resp)?;
                s.conn_qps = Some(conn::bring_up(&s.devs, qps, &resp, resp.tc, resp.sl, cfg)?);
                s.peer = Some(resp);
                s.chan.queue(&Message::Ready {
                    nonce: c.listener.nonce,
                });
            }
            Ok(Some(Message::Reject { code, text })) => {
                return Err(Error::remote(format!(
                    "{peer_addr} rejected the connection (code {code}): {text}"
                )));
            }
            Ok(Some(m)) => {
                return Err(Error::remote(format!(
                    "{peer_addr} sent {} during connection setup",
                    kind_name(&m)
                )));
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    if s.conn_qps.is_some() && s.chan.flush().map_err(io_err)? {
        let mut s = c.setup.take().expect("checked above");
        s.chan.release_buffers();
        let conn = Conn {
            qps: s.conn_qps.expect("checked above"),
            devs: s.devs,
            peer: s.peer.expect("set with the QPs"),
            chan: s.chan,
            qps_per_req: s.qps_per_req,
        };
        let ar = match cfg.adaptive_routing {
            0 => false,
            v if v > 0 => true,
            _ => c.members.iter().all(|m| m.adaptive_routing),
        };
        let dp = send::SendDp::new(conn, s.bufs, ar, cfg.ar_threshold);
        return Ok(Some(Box::new(SendComm { dp })));
    }
    let _ = sent;
    if c.started.elapsed() > timeout {
        return Err(Error::remote(format!(
            "connection setup with {peer_addr} did not finish within {timeout:?} — the peer accepted the TCP connection but never answered (is its proxy thread stuck?) (FERROCE_CONNECT_TIMEOUT_SEC sets the limit)"
        )));
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------------
// Data path
// ---------------------------------------------------------------------------------------------

/// The sending end of a connection.
pub struct SendComm {
    dp: Box<send::SendDp>,
}

/// The receiving end of a connection.
pub struct RecvComm {
    dp: Box<recv::RecvDp>,
}

impl SendComm {
    /// `None` = the receiver has not posted a matching buffer yet, or all request slots are
    /// in flight; retry later (no side effects).
    pub fn isend(&mut self, data: usize, size: usize, tag: i32, mh: &MemHandle) -> Result<Option<*mut Request>> {
        self.dp.isend(data, size, tag, mh)
    }

    /// Requests in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.dp.in_flight()
    }
}

impl RecvComm {
    /// Post a grouped receive of `data.len()` (1..=8) buffers. `None` = out of request slots,
    /// retry later. The optional-completion hint is accepted and ignored (completion is cheap).
    pub fn irecv(
        &mut self,
        data: &[usize],
        sizes: &[usize],
        tags: &[i32],
        mhs: &[&MemHandle],
        _optional_completion_hint: bool,
    ) -> Result<Option<*mut Request>> {
        self.dp.irecv(data, sizes, tags, mhs)
    }

    /// `None` = nothing to flush (flush disabled or every size is 0).
    pub fn iflush(&mut self, data: &[usize], sizes: &[i32], mhs: &[&MemHandle]) -> Result<Option<*mut Request>> {
        self.dp.iflush(data, sizes, mhs)
    }

    /// Whether iflush issues RDMA reads (peer memory / DMA-BUF and NCCL_GDR_FLUSH_DISABLE=0).
    pub fn flush_enabled(&self) -> bool {
        self.dp.flush_enabled()
    }

    /// Loopback flush QPs of this comm (for tests): 0 until its first iflush that reads, then
    /// one per local device.
    pub fn flush_qps(&self) -> usize {
        self.dp.flush_qps()
    }

    /// Flush requests in flight (for tests).
    pub fn flushes_in_flight(&self) -> usize {
        self.dp.flushes_in_flight()
    }

    /// Requests in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.dp.in_flight()
    }
}

/// Progress the request's comm and report whether `req` is done. On done, `sizes` (if
/// non-NULL) receives the byte counts (1 for a send, n for a grouped receive) and the request
/// is reclaimed.
///
/// # Safety
/// `req` came from isend/irecv/iflush of a comm that is still open, and has not completed yet;
/// `sizes` is NULL or has room for the request's count.
pub unsafe fn test(req: *mut Request, sizes: *mut i32) -> Result<bool> {
    if req.is_null() {
        return Err(Error::internal("test: NULL request"));
    }
    // SAFETY: the caller guarantees req points into a live comm's pool; the fields are read
    // by value and the borrow ends before the comm is borrowed mutably.
    let (owner, kind) = unsafe { ((*req).owner, (*req).kind()) };
    match kind {
        // SAFETY: a Send request's owner is the boxed SendDp of its (open) comm, used only by
        // this thread (NCCL's progress thread); `sizes` as the caller guarantees.
        request::ReqKind::Send => unsafe { (*(owner as *mut send::SendDp)).test(req, sizes) },
        // SAFETY: as above for the RecvDp; `sizes` as the caller guarantees.
        request::ReqKind::Recv | request::ReqKind::Flush => unsafe { (*(owner as *mut recv::RecvDp)).test(req, sizes) },
        request::ReqKind::Free => Err(Error::internal(
            "test: the request is not in flight (tested again after done?)",
        )),
    }
}
