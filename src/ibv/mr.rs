//! RAII memory region (host pointer or DMA-BUF), holding its protection domain.

use super::{sys, ProtectionDomain};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Live objects of this type in the process (leak tests compare before/after).
pub static LIVE_MRS: AtomicUsize = AtomicUsize::new(0);

/// Access for data buffers: the peer writes into them, flush reads them back.
pub const ACCESS_DATA: u32 = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
#[cfg(any(test, feature = "testing"))]
/// Access for local-only staging (sources of RDMA writes, flush scratch).
pub const ACCESS_LOCAL: u32 = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
/// `IBV_ACCESS_RELAXED_ORDERING` (an optional flag: providers without it ignore it).
pub const ACCESS_RELAXED_ORDERING: u32 = sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;

pub struct MemoryRegion {
    pub pd: Arc<ProtectionDomain>,
    raw: *mut sys::ibv_mr,
}

// SAFETY: an ibv_mr is immutable after registration; the pointer is owned by this object.
unsafe impl Send for MemoryRegion {}
// SAFETY: see Send.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Register `[addr, addr + len)`.
    ///
    /// # Safety
    /// The range is mapped memory of this process and stays mapped while the MR exists (the
    /// NIC may read or write it at any time the MR's keys are in use).
    pub unsafe fn register(pd: Arc<ProtectionDomain>, addr: usize, len: usize, access: u32) -> Result<MemoryRegion> {
        let verbs = &pd.context.verbs;
        // SAFETY: live PD; the caller guarantees the range.
        let raw = unsafe { (verbs.ibv_reg_mr)(pd.as_ptr(), addr as *mut _, len, access as i32) };
        if raw.is_null() {
            return Err(Error::last_os(&format!(
                "ibv_reg_mr({}, {addr:#x}, {len} bytes)",
                pd.context.info.name
            )));
        }
        LIVE_MRS.fetch_add(1, Ordering::Relaxed);
        Ok(MemoryRegion { pd, raw })
    }

    /// Register `[addr, addr + len)` with PCIe relaxed ordering (`ibv_reg_mr_iova2`, iova =
    /// addr), as NCCL does when NCCL_IB_PCI_RELAXED_ORDERING allows it; `None` when the library
    /// has no `ibv_reg_mr_iova2`.
    ///
    /// # Safety
    /// As [`MemoryRegion::register`].
    pub unsafe fn register_relaxed(
        pd: Arc<ProtectionDomain>,
        addr: usize,
        len: usize,
        access: u32,
    ) -> Option<Result<MemoryRegion>> {
        let reg = pd.context.verbs.ibv_reg_mr_iova2?;
        // SAFETY: live PD; the caller guarantees the range.
        let raw = unsafe {
            reg(
                pd.as_ptr(),
                addr as *mut _,
                len,
                addr as u64,
                access | ACCESS_RELAXED_ORDERING,
            )
        };
        if raw.is_null() {
            return Some(Err(Error::last_os(&format!(
                "ibv_reg_mr_iova2({}, {addr:#x}, {len} bytes, relaxed ordering)",
                pd.context.info.name
            ))));
        }
        LIVE_MRS.fetch_add(1, Ordering::Relaxed);
        Some(Ok(MemoryRegion { pd, raw }))
    }

    /// Register `len` bytes of the DMA-BUF `fd` from `offset`, addressed by the NIC as `iova`.
    /// The fd is not kept (the kernel MR holds its own reference).
    pub fn register_dmabuf(
        pd: Arc<ProtectionDomain>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: u32,
    ) -> Result<MemoryRegion> {
        let name = pd.context.info.name.clone();
        let reg = pd.context.verbs.ibv_reg_dmabuf_mr.ok_or_else(|| {
            Error::system(format!(
                "{name}: libibverbs has no ibv_reg_dmabuf_mr (rdma-core ≥ 34 needed for DMA-BUF)"
            ))
        })?;
        // SAFETY: live PD; the kernel validates fd/offset/len and takes its own reference.
        let raw = unsafe { reg(pd.as_ptr(), offset, len, iova, fd, access as i32) };
        if raw.is_null() {
            let err = std::io::Error::last_os_error();
            let what = format!("ibv_reg_dmabuf_mr({name}, fd {fd}, offset {offset}, {len} bytes)");
            return Err(Error::os(&what, &err).suffixed(&crate::error::dmabuf_suffix(&err)));
        }
        LIVE_MRS.fetch_add(1, Ordering::Relaxed);
        Ok(MemoryRegion { pd, raw })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: raw is a live MR owned by self.
        unsafe { (*self.raw).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as lkey.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        LIVE_MRS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: raw is owned and deregistered once.
        let rc = unsafe { (self.pd.context.verbs.ibv_dereg_mr)(self.raw) };
        if rc != 0 {
            crate::log_warn!(
                "ibv_dereg_mr({}) failed: {}",
                self.pd.context.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}
