//! Connections and the data path (docs/nccl-net-abi.md#connection-setup, #closing,
//! #memory-registration, #nic-fusion).
//!
//! `api.rs` calls exactly these entry points; every ABI version drives the same code.
//!
//! * [`listen()`] / [`ListenComm::accept`] and [`connect()`] ([`setup`]): non-blocking setup over
//!   a TCP side channel ([`sidechannel`]) with a versioned handshake ([`proto::handshake`]),
//!   driven by the pure setup states of [`proto::setup`]; the resources both ends build and
//!   bring up are [`conn`]'s.
//! * [`reg_mr`] / [`dereg_mr`] ([`registration`]): a process-wide, refcounted MR cache per
//!   device ([`registration::mr_cache`]); they need no comm, so the service thread never
//!   touches a comm the progress thread uses.
//! * [`SendComm::isend`], [`RecvComm::irecv`], [`RecvComm::iflush`], [`test()`] ([`datapath`]):
//!   the receiver-driven CTS FIFO design ([`proto::fifo`], [`proto::split`], [`proto::request`]),
//!   each comm's QPs kept alive by [`recovery`].
//! * [`stats`]: the counters a comm keeps when statistics are on (the file is `crate::report`'s).
//! * Close = drop of the boxed comm; safe with requests in flight.
//!
//! Errors: unreachable or failed peer → `ErrorKind::Remote`; OS / verbs failure → `System`;
//! NCCL misuse → `Internal`. Completion errors are WARNed once per comm ([`datapath::completion_errors`]).
//!
//! Connection setup (connector → listener, over a TCP connection of its own): `ConnectReq` (sender devices, QPs, CTS FIFO address/rkeys, tc/sl,
//! split flag) → `ConnectResp` (receiver devices, QPs, completion-record address/rkeys, echoed
//! tc/sl; the receiver's QPs are already RTS) → `Ready` (the sender's QPs are RTS). Both ends
//! give up after `FERROCE_CONNECT_TIMEOUT_SEC`. Afterwards the side channel carries recovery
//! messages and tells a comm when its peer is gone; from wire version 6 the comms between two
//! processes share one such TCP connection, a link ([`sidechannel::shared_link`], [`proto::link`]): the first
//! connect to a process keeps its setup connection as the link, later ones (in either
//! direction) send their handshake on it and open no socket, so a process holds one or two
//! side-channel descriptors per peer process however many comms it has with it. A comm with an older peer or within this
//! process keeps its setup connection. QP *i* lives on member device *i mod ndevs*,
//! `NCCL_IB_QPS_PER_CONNECTION × max(ndevs local, remote)` QPs in all; the receiver adopts
//! the sender's QP count and split mode. Active-standby (`FERROCE_ACTIVE_STANDBY`, flag in the
//! records, both ends alike): `NCCL_IB_QPS_PER_CONNECTION` QPs on the first member that is up,
//! and the QP lists end with one probe QP per other member ([`recovery::standby`]).
//!
//! Limits: 32 receives in flight per recv comm (NCCL_NET_MAX_REQUESTS) holding at most 64 CTS
//! entries in all (the FIFO ring: NCCL_STEPS 8 × maxRecvs 8), 32 flushes besides (an error
//! beyond: iflush cannot say "retry later"); 64 isends in
//! flight per send comm; beyond these irecv/isend return "retry later"
//! (docs/nccl-net-abi.md#limits). Grouped
//! receives of up to 8 buffers of ≤ 4 GiB each.
//!
//! Per-message path: no allocation, no lock; syscalls only inside the provider's post/poll and
//! one rate-limited read of the side channel (its link's socket) while a request waits for the
//! peer.

pub(crate) mod clock;
#[cfg(feature = "testing")]
pub mod conn;
#[cfg(not(feature = "testing"))]
pub(crate) mod conn;
pub(crate) mod datapath;
#[cfg(feature = "testing")]
pub mod proto;
#[cfg(not(feature = "testing"))]
pub(crate) mod proto;
pub(crate) mod recovery;
pub(crate) mod registration;
#[cfg(feature = "testing")]
pub mod setup;
#[cfg(not(feature = "testing"))]
pub(crate) mod setup;
pub mod sidechannel;
pub(crate) mod stats;

// The modules' paths before they moved into their folders, for `api`, the ABI shims, the doctor,
// the integration tests and the fuzz targets.
pub use datapath::{driver, recv};

use crate::error::Error;
use datapath::requests::Side;
use datapath::watch::Guarded;

pub(crate) use conn::{FLUSH_CQE, FLUSH_SEND_WR};
pub use datapath::requests::Request;
#[cfg(feature = "testing")]
pub use datapath::wr_monitor::clock_reads as wr_monitor_clock_reads;
pub(crate) use proto::handshake::{read_listen_gids, read_stage, write_listen_gids};
pub use proto::limits::MAX_RECVS;
pub use registration::{dereg_mr, reg_mr, MemHandle, MemKind};
pub use setup::connect::{connect, forget_pending_connects};
pub use setup::listen::{listen, ListenComm};

type Result<T> = std::result::Result<T, Error>;

// ---------------------------------------------------------------------------------------------
// Data path
// ---------------------------------------------------------------------------------------------

/// The sending end of a connection.
pub struct SendComm {
    dp: Box<Guarded<datapath::send::SendDp>>,
}

/// The receiving end of a connection.
pub struct RecvComm {
    dp: Box<Guarded<datapath::recv::RecvDp>>,
}

impl SendComm {
    /// `None` = the receiver has not posted a matching buffer yet, or all request slots are
    /// in flight; retry later (no side effects).
    /// `phandle`: NCCL's profiler handle for this send (NULL: no profiler events).
    pub fn isend(
        &mut self,
        data: usize,
        size: usize,
        tag: i32,
        mh: &MemHandle,
        phandle: *mut std::ffi::c_void,
    ) -> Result<Option<*mut Request>> {
        self.dp.enter().isend(data, size, tag, mh, phandle)
    }

    /// Requests in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.dp.enter().in_flight()
    }

    /// The connection's local QP numbers, as its INFO line prints them (for tests and tools).
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.dp.enter().io.conn.qp_numbers()
    }

    /// The P_Key index of each of the connection's QPs, read back from the device (for tests).
    pub fn qp_pkey_indices(&self) -> Result<Vec<u16>> {
        self.dp.enter().io.conn.qp_pkey_indices()
    }

    /// `ibv_poll_cq` calls this comm's data path made so far, empty ones too (for tests).
    pub fn cq_polls(&self) -> u64 {
        self.dp.enter().io.cq_polls
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
        phandles: &[*mut std::ffi::c_void],
    ) -> Result<Option<*mut Request>> {
        self.dp.enter().irecv(data, sizes, tags, mhs, phandles)
    }

    /// `None` = nothing to flush (flush disabled or every size is 0).
    pub fn iflush(&mut self, data: &[usize], sizes: &[i32], mhs: &[&MemHandle]) -> Result<Option<*mut Request>> {
        self.dp.enter().iflush(data, sizes, mhs)
    }

    /// The connection's local data QP numbers, as its INFO line prints them (for tests and tools).
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.dp.enter().io.conn.qp_numbers()
    }

    /// The P_Key index of each of the connection's data QPs, read back from the device (for tests).
    pub fn qp_pkey_indices(&self) -> Result<Vec<u16>> {
        self.dp.enter().io.conn.qp_pkey_indices()
    }

    /// Whether iflush issues RDMA reads (peer memory / DMA-BUF and NCCL_GDR_FLUSH_DISABLE=0).
    pub fn flush_enabled(&self) -> bool {
        self.dp.enter().flush_enabled()
    }

    /// Loopback flush QPs of this comm (for tests): 0 until its first iflush that reads, then
    /// one per local device.
    pub fn flush_qps(&self) -> usize {
        self.dp.enter().flush_qps()
    }

    /// Flush requests in flight (for tests).
    pub fn flushes_in_flight(&self) -> usize {
        self.dp.enter().flushes_in_flight()
    }

    /// Requests in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.dp.enter().in_flight()
    }

    /// `ibv_poll_cq` calls on this comm's data CQs so far, empty ones too (for tests).
    pub fn cq_polls(&self) -> u64 {
        self.dp.enter().io.cq_polls
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
    // SAFETY: the caller guarantees req points into a live comm's request table; the fields
    // are read by value and the borrow ends before the comm is borrowed mutably.
    let (owner, side) = unsafe { (*req).owner() };
    match side {
        // SAFETY: a Send request's owner is the Guarded SendDp of its (open) comm (entered
        // under its lock); `sizes` as the caller guarantees.
        Side::Send => unsafe {
            (*(owner as *const Guarded<datapath::send::SendDp>))
                .enter()
                .test(req, sizes)
        },
        // SAFETY: as above for the RecvDp; `sizes` as the caller guarantees.
        Side::Recv => unsafe {
            (*(owner as *const Guarded<datapath::recv::RecvDp>))
                .enter()
                .test(req, sizes)
        },
    }
}
