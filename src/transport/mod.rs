//! Connections and the data path (spec §7.2–§7.8, §8.4–§8.10).
//!
//! `api.rs` calls exactly these entry points; every ABI version drives the same code.
//!
//! * [`listen`] / [`connect`] / [`ListenComm::accept`]: non-blocking setup over a TCP side
//!   channel ([`sidechannel`]) with a versioned handshake ([`handshake`]).
//! * [`SendComm::reg_mr`] / [`RecvComm::reg_mr`] / `dereg_mr`: a process-wide, refcounted MR
//!   cache per device ([`mr_cache`]); safe to call on the service thread while the data path of
//!   the same comm runs on the progress thread (it touches only `Sync` shared state).
//! * [`SendComm::isend`], [`RecvComm::irecv`], [`RecvComm::iflush`], [`test`]: the receiver-driven
//!   CTS FIFO design ([`fifo`], [`split`], [`request`]).
//! * Close = drop of the boxed comm; safe with requests in flight.
//!
//! Errors: unreachable or failed peer → `ErrorKind::Remote`; OS / verbs failure → `System`;
//! NCCL misuse → `Internal`. Completion errors are WARNed once per comm ([`errors`]).

pub mod errors;
pub mod fifo;
pub mod handshake;
pub mod mr_cache;
pub mod request;
pub mod sidechannel;
pub mod split;

use crate::api::CommContext;
use crate::device::VirtualDevice;
use crate::error::Error;
use std::sync::Arc;

pub use request::Request;

/// Memory type of a registration (`NCCL_PTR_HOST` / `NCCL_PTR_CUDA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Cuda,
}

/// A listening endpoint: one TCP listener plus the handshakes in progress on it.
pub struct ListenComm {
    _private: (),
}

/// The sending end of a connection.
pub struct SendComm {
    _private: (),
}

/// The receiving end of a connection.
pub struct RecvComm {
    _private: (),
}

/// A registration of one range on every member device of a comm's device.
pub struct MemHandle {
    _private: (),
}

fn not_yet() -> Error {
    Error::internal("ferroce transport: not implemented yet")
}

/// Open a listener on the side-channel interface and write the handle (≤ 128 bytes).
/// Never blocks; always returns a comm on success.
pub fn listen(
    _ctx: &CommContext,
    _dev: &Arc<VirtualDevice>,
    _handle: &mut [u8; 128],
) -> Result<Box<ListenComm>, Error> {
    Err(not_yet())
}

/// Non-blocking connect. Re-entered with the same handle until it returns `Some`; the
/// in-progress state lives in this module, keyed by an id recorded in the handle.
pub fn connect(
    _ctx: &CommContext,
    _dev: &Arc<VirtualDevice>,
    _handle: &mut [u8; 128],
) -> Result<Option<Box<SendComm>>, Error> {
    Err(not_yet())
}

impl ListenComm {
    /// Non-blocking accept; `None` while no peer has completed the handshake.
    pub fn accept(&mut self) -> Result<Option<Box<RecvComm>>, Error> {
        Err(not_yet())
    }
}

impl SendComm {
    pub fn reg_mr(
        &self,
        _addr: usize,
        _len: usize,
        _kind: MemKind,
        _dmabuf: Option<(i32, u64)>,
    ) -> Result<Box<MemHandle>, Error> {
        Err(not_yet())
    }

    pub fn dereg_mr(&self, _mh: Box<MemHandle>) -> Result<(), Error> {
        Err(not_yet())
    }

    /// `None` = the receiver has not posted a matching buffer yet; retry later (no side effects).
    pub fn isend(
        &mut self,
        _data: usize,
        _size: usize,
        _tag: i32,
        _mh: &MemHandle,
    ) -> Result<Option<*mut Request>, Error> {
        Err(not_yet())
    }
}

impl RecvComm {
    pub fn reg_mr(
        &self,
        _addr: usize,
        _len: usize,
        _kind: MemKind,
        _dmabuf: Option<(i32, u64)>,
    ) -> Result<Box<MemHandle>, Error> {
        Err(not_yet())
    }

    pub fn dereg_mr(&self, _mh: Box<MemHandle>) -> Result<(), Error> {
        Err(not_yet())
    }

    /// Post a grouped receive of `data.len()` (1..=8) buffers. `None` = out of request slots,
    /// retry later.
    pub fn irecv(
        &mut self,
        _data: &[usize],
        _sizes: &[usize],
        _tags: &[i32],
        _mhs: &[&MemHandle],
        _optional_completion_hint: bool,
    ) -> Result<Option<*mut Request>, Error> {
        Err(not_yet())
    }

    /// `None` = nothing to flush (flush disabled or every size is 0).
    pub fn iflush(
        &mut self,
        _data: &[usize],
        _sizes: &[i32],
        _mhs: &[&MemHandle],
    ) -> Result<Option<*mut Request>, Error> {
        Err(not_yet())
    }
}

/// Progress the request's comm and report whether `req` is done. On done, `sizes` (if
/// non-NULL) receives the byte counts (1 for a send, n for a grouped receive) and the request
/// is reclaimed.
///
/// # Safety
/// `req` came from isend/irecv/iflush of a comm that is still open, and has not completed yet;
/// `sizes` is NULL or has room for the request's count.
pub unsafe fn test(_req: *mut Request, _sizes: *mut i32) -> Result<bool, Error> {
    Err(not_yet())
}

/// Registers `[addr, addr+len)` on every member device (process-wide MR cache); needs no comm,
/// so the service thread never aliases a comm the progress thread is using.
pub fn reg_mr(
    _dev: &Arc<VirtualDevice>,
    _addr: usize,
    _len: usize,
    _kind: MemKind,
    _dmabuf: Option<(i32, u64)>,
) -> Result<Box<MemHandle>, Error> {
    Err(not_yet())
}

/// Releases a registration made by [`reg_mr`].
pub fn dereg_mr(_mh: Box<MemHandle>) -> Result<(), Error> {
    Err(not_yet())
}
