//! Registration (docs/nccl-net-abi.md#memory-registration): a range registered on every member
//! device of a (fused) device
//! through the process-wide, refcounted MR cache of each ([`mr_cache`]).
//! Needs no comm, so NCCL's service thread never touches a comm its progress thread uses.

pub(crate) mod mr_cache;

use crate::device::VirtualDevice;
use crate::error::{Error, Result};
use crate::ibv::mr::MemoryRegion;
use crate::memory::{page_range, page_size};
use crate::transport::conn::check_members;
use mr_cache::{cache_for, DeviceCache};
use std::sync::Arc;

use crate::transport::proto::limits::MAX_DEVS;

/// Memory type of a registration (`NCCL_PTR_HOST` / `NCCL_PTR_CUDA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Cuda,
}

/// A registration of one range on every member device of a (fused) device.
pub struct MemHandle {
    addr: usize,
    len: usize,
    ndevs: usize,
    /// Per member device; read by the data path without locks.
    pub(crate) lkeys: [u32; MAX_DEVS],
    pub(crate) rkeys: [u32; MAX_DEVS],
    /// Host memory (not a GPU's, not DMA-BUF): the CPU may copy into it (an eager delivery).
    pub(crate) host: bool,
    regs: Vec<(Arc<DeviceCache>, Arc<MemoryRegion>)>,
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
        let page = page_size();
        let (start, end) = page_range(self.addr, self.len, page);
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
    kind: MemKind,
    dmabuf: Option<(i32, u64)>,
) -> Result<Box<MemHandle>> {
    check_members(dev)?;
    let mut mh = Box::new(MemHandle {
        addr,
        len,
        ndevs: dev.members.len(),
        lkeys: [0; MAX_DEVS],
        rkeys: [0; MAX_DEVS],
        host: kind == MemKind::Host && dmabuf.is_none(),
        regs: Vec::with_capacity(dev.members.len()),
    });
    if len == 0 {
        // Nothing to register: only zero-byte transfers can use it (they name no memory).
        return Ok(mh);
    }
    for (d, m) in dev.members.iter().enumerate() {
        let cache = cache_for(&m.pd);
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
