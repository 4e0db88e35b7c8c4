//! Plain host memory the plugin allocates for itself, and the page arithmetic registrations
//! round with. No verbs here: whoever registers this memory (transport/conn.rs,
//! transport/mr_cache.rs) depends on this file, never the other way.

use crate::error::{Error, Result};
use std::alloc::Layout;

/// Page size used for rounding.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf is always safe to call.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `[addr, addr + len)` rounded out to whole pages (`len` 0 counts as 1 byte).
pub(crate) fn page_range(addr: usize, len: usize, page: usize) -> (usize, usize) {
    let start = addr & !(page - 1);
    let end = addr.saturating_add(len.max(1)).saturating_add(page - 1) & !(page - 1);
    (start, end)
}

/// Zeroed, page-aligned heap memory (FIFOs, staging areas), freed on drop.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain owned memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only hands out the address and length; whoever writes through the
// address (unsafe code, or a NIC) answers for the accesses.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let page = page_size();
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(page), page)
            .map_err(|e| Error::internal(format!("bad buffer layout: {e}")))?;
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::system(format!("cannot allocate {} bytes", layout.size())));
        }
        Ok(AlignedBuf { ptr, layout })
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rounding() {
        assert_eq!(page_range(0x1000, 0x1000, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_range(0x1001, 1, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_range(0x1fff, 2, 0x1000), (0x1000, 0x3000));
        assert_eq!(page_range(0x1000, 0, 0x1000), (0x1000, 0x2000));
    }

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::new(10).unwrap();
        assert_eq!(b.addr() % page_size(), 0);
        assert_eq!(b.len(), page_size());
        // SAFETY: the buffer owns `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(b.addr() as *const u8, b.len()) };
        assert!(bytes.iter().all(|&x| x == 0));
    }
}
