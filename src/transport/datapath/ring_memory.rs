//! The registered 4 KiB ring blocks as the cores see them: the sender's CTS FIFO
//! ([`FifoRing`]) and the receiver's CTS staging ([`StagingRing`]). The peer's NIC writes into
//! both while we read them, so every access is volatile, and a stamp is loaded alone before
//! (after an acquire fence) the entries it announces.

use crate::transport::conn::RegBuf;
use crate::transport::proto::eager;
use crate::transport::proto::fifo::{self, CtsEntry, RING};
use crate::transport::proto::limits::MAX_RECVS;
use crate::transport::proto::recv::StagingRing;
use crate::transport::proto::send::FifoRing;
use std::sync::atomic::{fence, Ordering};

/// A view of a comm's registered ring block (which the comm owns and keeps registered for as
/// long as its QPs exist). Positions are taken mod [`RING`], so no access leaves the block.
pub(crate) struct RingMemory {
    base: *mut CtsEntry,
    /// The receiver's eager landing ring right after the ring (`slot_bytes` 0: none).
    slot_bytes: usize,
}

impl RingMemory {
    /// # Safety
    /// `bufs` holds at least [`fifo::RING_BYTES`] bytes, 64-byte aligned (a page), and
    /// outlives the view.
    pub(crate) unsafe fn new(bufs: &RegBuf) -> RingMemory {
        RingMemory {
            base: bufs.addr() as *mut CtsEntry,
            slot_bytes: 0,
        }
    }

    /// A view of a receiver's block whose eager landing ring of [`eager::SLOTS`] slots of
    /// `slot_bytes` follows the staging ring.
    ///
    /// # Safety
    /// As [`RingMemory::new`], and `bufs` holds `fifo::RING_BYTES + SLOTS × slot_bytes` bytes.
    pub(crate) unsafe fn with_landing(bufs: &RegBuf, slot_bytes: usize) -> RingMemory {
        RingMemory {
            base: bufs.addr() as *mut CtsEntry,
            slot_bytes,
        }
    }

    fn entry(&self, pos: usize) -> *mut CtsEntry {
        self.base.wrapping_add(pos % RING)
    }
}

impl FifoRing for RingMemory {
    fn load_stamp(&self, pos: usize) -> u64 {
        // SAFETY: an entry inside the block (pos mod RING), live as long as the view. The NIC
        // writes it concurrently: the stamp is one aligned 8-byte volatile load, and the
        // entries are loaded only after it matched (and this fence).
        let stamp = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.entry(pos)).stamp)) };
        fence(Ordering::Acquire);
        stamp
    }

    fn load_entry(&self, pos: usize) -> CtsEntry {
        // SAFETY: as above; read by value (sealed, so a torn read is only "landing").
        unsafe { std::ptr::read_volatile(self.entry(pos)) }
    }

    fn store_sizes(&mut self, pos: usize, sizes: &[u32]) {
        let at = (self.entry(pos) as usize + fifo::SIZES_IN_ENTRY) as *mut u32;
        for (i, s) in sizes.iter().take(MAX_RECVS).enumerate() {
            // SAFETY: bytes SIZES_IN_ENTRY + 4i (i < 8) of a consumed entry of the block; no
            // NIC writes it before this group's receive completed (proto::send's module doc).
            unsafe { std::ptr::write_volatile(at.add(i), s.to_le()) };
        }
    }
}

impl StagingRing for RingMemory {
    fn store_entry(&mut self, pos: usize, wire: &CtsEntry) {
        // SAFETY: an entry of the block; the ring gave it to this group (proto::recv).
        unsafe { std::ptr::write_volatile(self.entry(pos), *wire) };
    }

    fn load_record(&self, pos: usize, i: usize) -> u32 {
        let at = (self.entry(pos) as usize + fifo::SIZES_IN_ENTRY) as *const u32;
        // SAFETY: inside the group's first staging entry (i mod 8); written by the NIC before
        // the receive completions the core has seen; reused only after the request is
        // reclaimed.
        u32::from_le(unsafe { std::ptr::read_volatile(at.add(i % MAX_RECVS)) })
    }

    fn load_eager_header(&self, slot: usize) -> [u8; eager::EAGER_HEADER_BYTES] {
        if self.slot_bytes == 0 {
            return [0; eager::EAGER_HEADER_BYTES];
        }
        let at = self.base as usize + fifo::RING_BYTES + (slot % eager::SLOTS) * self.slot_bytes;
        // SAFETY: the header of a slot inside the block's landing ring (slot mod SLOTS); its
        // write with immediate completed, so the NIC wrote it before, and writes the slot again
        // only after the next CTS write's credit frees it.
        unsafe { std::ptr::read_volatile(at as *const [u8; eager::EAGER_HEADER_BYTES]) }
    }
}
