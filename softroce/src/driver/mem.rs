//! Memory translation: the device's MR table and the [`MemoryAccess`] the
//! core reaches registered memory through.
//!
//! Every access translates and copies while holding the MR table's read
//! lock, so `ibv_dereg_mr` (write lock) returns only after in-flight copies
//! into or out of that region have finished, as a NIC's deregistration waits
//! for its DMA.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::srq::SrqInner;
use crate::proto::mem::access;
use crate::proto::{AtomicOp, LocalAccessError, MemoryAccess, RecvWr, RemoteAccess, RemoteAccessError};

/// Registered memory region, as the data path sees it.
#[derive(Clone, Copy, Debug)]
pub struct MrInfo {
    /// Host address of the first byte.
    pub addr: usize,
    pub len: usize,
    /// The address remote peers use for byte 0 (== addr for plain ibv_reg_mr).
    pub iova: u64,
    pub access: u32,
    pub pd: u32,
}

/// The device's MRs by key (lkey == rkey).
#[derive(Default)]
pub struct MrTable(RwLock<HashMap<u32, MrInfo>>);

impl MrTable {
    /// The table for reading (translation, lookups).
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, HashMap<u32, MrInfo>> {
        self.0.read().unwrap()
    }

    /// The table for registering, re-registering and deregistering; waits
    /// for the copies running under [`Self::read`].
    pub fn write(&self) -> RwLockWriteGuard<'_, HashMap<u32, MrInfo>> {
        self.0.write().unwrap()
    }

    /// Some MR belongs to PD `pd`.
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.read().values().any(|m| m.pd == pd)
    }
}

/// Memory of one PD, through the device's MR table (what the core sees).
pub struct PdMemory<'a> {
    pub mrs: &'a MrTable,
    pub pd: u32,
    /// The QP's SRQ (serves `take_srq_recv`).
    pub srq: Option<&'a SrqInner>,
}

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
        let mrs = self.mrs.read();
        let m = mrs
            .get(&lkey)
            .filter(|m| m.pd == self.pd)
            .ok_or(LocalAccessError::InvalidKey)?;
        if write && m.access & access::LOCAL_WRITE == 0 {
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
        let mrs = self.mrs.read();
        let m = mrs
            .get(&rkey)
            .filter(|m| m.pd == self.pd)
            .ok_or(RemoteAccessError::InvalidKey)?;
        let need = match what {
            RemoteAccess::Write => access::REMOTE_WRITE,
            RemoteAccess::Read => access::REMOTE_READ,
            RemoteAccess::Atomic => access::REMOTE_ATOMIC,
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
    fn take_srq_recv(&mut self) -> Option<RecvWr> {
        self.srq?.take()
    }
}
