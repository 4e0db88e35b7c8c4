//! Process-wide, reference-counted registration cache per device
//! (docs/nccl-net-abi.md#memory-registration).
//!
//! Ranges are rounded out to pages; a registration fully covering a requested range of the same
//! backing ([`Backing`]: host memory, or one DMA-BUF at the same fd offsets) is reused
//! (refcount + 1); the MR is deregistered when its last user releases it. The cache is behind
//! its own mutex and is touched only by registration calls (NCCL's service thread): the data
//! path uses the lkeys/rkeys copied into the [`MemHandle`](crate::transport::MemHandle), so it never waits
//! for a registration.

use crate::error::Result;
use crate::ibv::mr::{MemoryRegion, ACCESS_DATA};
use crate::ibv::ProtectionDomain;
use crate::memory::{page_range, page_size, AlignedBuf};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// What a registration maps: host (or peer) memory by address, or a DMA-BUF, whose byte at
/// address `a` is fd offset `a + base` (wrapping). A host and a DMA-BUF registration of the same
/// addresses never stand in for each other, nor do two DMA-BUF views that differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    Host,
    DmaBuf { fd: i32, base: u64 },
}

/// One cached registration.
struct Entry<T> {
    start: usize,
    end: usize,
    backing: Backing,
    refs: usize,
    value: Arc<T>,
}

/// The pure cache: a sorted list of ranges with refcounts; `T` is the registration.
pub(crate) struct RangeCache<T> {
    entries: Vec<Entry<T>>,
}

impl<T> Default for RangeCache<T> {
    fn default() -> Self {
        RangeCache { entries: Vec::new() }
    }
}

impl<T> RangeCache<T> {
    /// Reuse an entry of the same `backing` covering `[start, end)` or create one with
    /// `register`.
    pub(crate) fn acquire<E>(
        &mut self,
        start: usize,
        end: usize,
        backing: Backing,
        register: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<Arc<T>, E> {
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.backing == backing && e.start <= start && end <= e.end)
        {
            e.refs += 1;
            return Ok(e.value.clone());
        }
        let value = Arc::new(register()?);
        let pos = self.entries.partition_point(|e| e.start < start);
        self.entries.insert(
            pos,
            Entry {
                start,
                end,
                backing,
                refs: 1,
                value: value.clone(),
            },
        );
        Ok(value)
    }

    /// Drop one reference to `value`; returns true when it was the last (entry removed).
    pub(crate) fn release(&mut self, value: &Arc<T>) -> bool {
        let Some(i) = self.entries.iter().position(|e| Arc::ptr_eq(&e.value, value)) else {
            return false;
        };
        self.entries[i].refs -= 1;
        if self.entries[i].refs == 0 {
            self.entries.remove(i);
            return true;
        }
        false
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The registrations of one device (protection domain).
pub(crate) struct DeviceCache {
    pub pd: Arc<ProtectionDomain>,
    cache: Mutex<RangeCache<MemoryRegion>>,
    /// The flush scratch of every receive comm on this device, made at the first use.
    scratch: Mutex<Option<Arc<FlushScratch>>>,
}

/// One registered page per device that every GPU flush (docs/nccl-net-abi.md#flush) reads its byte
/// into.
/// Nobody reads it, so all comms share it (instead of a registration per comm). Field order:
/// the MR goes before the memory.
pub(crate) struct FlushScratch {
    pub mr: MemoryRegion,
    pub buf: AlignedBuf,
}

static CACHES: Mutex<Vec<(usize, Weak<DeviceCache>)>> = Mutex::new(Vec::new());

/// The cache of `pd`'s device, created on first use; shared by every comm of the process.
pub(crate) fn cache_for(pd: &Arc<ProtectionDomain>) -> Arc<DeviceCache> {
    let key = Arc::as_ptr(pd) as usize;
    let mut all = CACHES.lock();
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(c) = all.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
        return c;
    }
    let c = Arc::new(DeviceCache {
        pd: pd.clone(),
        cache: Mutex::new(RangeCache::default()),
        scratch: Mutex::new(None),
    });
    all.push((key, Arc::downgrade(&c)));
    c
}

impl DeviceCache {
    /// A registration covering `[addr, addr + len)`: host memory (`dmabuf` None) or a DMA-BUF
    /// `(fd, offset)` whose byte `offset` is mapped at `addr`.
    pub(crate) fn acquire(&self, addr: usize, len: usize, dmabuf: Option<(i32, u64)>) -> Result<Arc<MemoryRegion>> {
        let page = page_size();
        let (start, end) = page_range(addr, len, page);
        let mut cache = self.cache.lock();
        let relaxed = crate::config::get().pci_relaxed_ordering != 0;
        match dmabuf {
            None => cache.acquire(start, end, Backing::Host, || {
                // SAFETY: NCCL registers memory it owns and deregisters it before freeing it
                // (docs/nccl-net-abi.md#memory-registration); the range is page-rounded like
                // NCCL's IB transport does.
                unsafe {
                    if relaxed {
                        // Relaxed ordering when the library has ibv_reg_mr_iova2
                        // (docs/nccl-net-abi.md#device-discovery
                        // step 6); a refusal falls back to a plain registration.
                        if let Some(Ok(mr)) =
                            MemoryRegion::register_relaxed(self.pd.clone(), start, end - start, ACCESS_DATA)
                        {
                            return Ok(mr);
                        }
                    }
                    MemoryRegion::register(self.pd.clone(), start, end - start, ACCESS_DATA)
                }
            }),
            Some((fd, offset)) => {
                // Round the start down only as far as the fd offset allows; never past the
                // end the caller gave (the dma-buf may be exactly that long).
                let back = (addr - start).min(offset as usize);
                let (s, off) = (addr - back, offset - back as u64);
                let l = len.max(1) + back;
                let backing = Backing::DmaBuf {
                    fd,
                    base: off.wrapping_sub(s as u64),
                };
                cache.acquire(s, s + l, backing, || {
                    let has_iova2 = self.pd.context.verbs.ibv_reg_mr_iova2.is_some();
                    if relaxed && has_iova2 {
                        let ro = ACCESS_DATA | crate::ibv::mr::ACCESS_RELAXED_ORDERING;
                        if let Ok(mr) = MemoryRegion::register_dmabuf(self.pd.clone(), off, l, s as u64, fd, ro) {
                            return Ok(mr);
                        }
                    }
                    MemoryRegion::register_dmabuf(self.pd.clone(), off, l, s as u64, fd, ACCESS_DATA)
                })
            }
        }
    }

    /// The device's shared flush scratch (registered once; callers keep the `Arc` as long as
    /// a QP may write into it).
    pub(crate) fn flush_scratch(&self) -> Result<Arc<FlushScratch>> {
        let mut s = self.scratch.lock();
        if let Some(s) = &*s {
            return Ok(s.clone());
        }
        let buf = AlignedBuf::new(64)?;
        // SAFETY: `buf` lives in the same FlushScratch, dropped after the MR.
        let mr = unsafe {
            MemoryRegion::register(
                self.pd.clone(),
                buf.addr(),
                buf.len(),
                crate::ibv::sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
            )?
        };
        let new = Arc::new(FlushScratch { mr, buf });
        *s = Some(new.clone());
        Ok(new)
    }

    pub(crate) fn release(&self, mr: &Arc<MemoryRegion>) {
        self.cache.lock().release(mr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refcounted_reuse() {
        let mut c: RangeCache<u32> = RangeCache::default();
        let mut regs = 0;
        let mut reg = || -> std::result::Result<u32, ()> {
            regs += 1;
            Ok(regs)
        };
        let a = c.acquire(0x1000, 0x5000, Backing::Host, &mut reg).unwrap();
        let b = c.acquire(0x2000, 0x3000, Backing::Host, &mut reg).unwrap(); // covered: reused
        assert!(Arc::ptr_eq(&a, &b));
        let d = c.acquire(0x4000, 0x6000, Backing::Host, &mut reg).unwrap(); // not covered: new
        assert!(!Arc::ptr_eq(&a, &d));
        assert_eq!(c.len(), 2);
        assert!(!c.release(&a));
        assert!(c.release(&b), "last reference removes the entry");
        assert!(c.release(&d));
        assert!(c.is_empty());
        assert!(!c.release(&d), "unknown value is ignored");
        // Failed registration leaves nothing behind.
        assert!(c.acquire(0, 0x1000, Backing::Host, || Err::<u32, ()>(())).is_err());
        assert!(c.is_empty());
    }

    /// Regression: the cache was keyed by address alone, so a DMA-BUF registration of
    /// a range a host registration covers got the host MR (and the reverse).
    #[test]
    fn issue_14_host_and_dmabuf_registrations_of_one_range_never_alias() {
        let mut c: RangeCache<u32> = RangeCache::default();
        let mut next = 0;
        let mut reg = || {
            next += 1;
            Ok::<u32, ()>(next)
        };
        let host = c.acquire(0x1000, 0x9000, Backing::Host, &mut reg).unwrap();
        let buf = Backing::DmaBuf { fd: 7, base: 0 };
        let dma = c.acquire(0x2000, 0x3000, buf, &mut reg).unwrap();
        assert!(
            !Arc::ptr_eq(&host, &dma),
            "a DMA-BUF range inside a host registration is its own MR"
        );
        let again = c.acquire(0x2000, 0x2800, buf, &mut reg).unwrap();
        assert!(Arc::ptr_eq(&dma, &again), "the same DMA-BUF view is reused");
        let shifted = c
            .acquire(0x2000, 0x2800, Backing::DmaBuf { fd: 7, base: 0x1000 }, &mut reg)
            .unwrap();
        assert!(
            !Arc::ptr_eq(&dma, &shifted),
            "other fd offsets for the same addresses: another MR"
        );
        let other_fd = c
            .acquire(0x2000, 0x2800, Backing::DmaBuf { fd: 8, base: 0 }, &mut reg)
            .unwrap();
        assert!(!Arc::ptr_eq(&dma, &other_fd));
        let host2 = c.acquire(0x2000, 0x3000, Backing::Host, &mut reg).unwrap();
        assert!(Arc::ptr_eq(&host, &host2), "host memory still reuses the host MR");
    }
}
