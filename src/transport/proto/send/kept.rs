//! What the sender keeps of each send request until it completes ([`Kept`]), so that a
//! recovery can post its chains again on new QPs (NCCL keeps the buffer until the request
//! completes).

use super::super::limits;

/// What the sender keeps of each send request until it completes, so that a recovery can post
/// its chains again on new QPs (NCCL keeps the buffer until the request completes): the
/// buffer's address, and packed its length (bits 0..35: at most 7 GiB), its index in the group
/// (bits 35..38) and the low bits of its group's posting counter (bits 38..64).
#[derive(Clone, Copy, Default)]
pub(super) struct Kept {
    pub(super) data: u64,
    packed: u64,
}

const KEPT_LEN_BITS: u32 = 35;
const KEPT_BUF_SHIFT: u32 = KEPT_LEN_BITS;
/// The buffer index's bits (a group has at most 8 buffers).
const KEPT_BUF_MASK: u64 = 7;
const KEPT_COUNTER_SHIFT: u32 = KEPT_BUF_SHIFT + KEPT_BUF_MASK.count_ones();
pub(super) const KEPT_COUNTER_MASK: u64 = (1 << (64 - KEPT_COUNTER_SHIFT)) - 1;
const _: () = assert!(
    (1u64 << KEPT_LEN_BITS) > (limits::PIECES_PER_BUFFER * limits::MAX_WR_BYTES) as u64,
    "the largest buffer's length fits"
);

impl Kept {
    pub(super) fn new(data: usize, len: usize, buf: usize) -> Kept {
        Kept {
            data: data as u64,
            packed: (len as u64 & ((1 << KEPT_LEN_BITS) - 1)) | ((buf as u64 & KEPT_BUF_MASK) << KEPT_BUF_SHIFT),
        }
    }
    pub(super) fn len(self) -> usize {
        (self.packed & ((1 << KEPT_LEN_BITS) - 1)) as usize
    }
    pub(super) fn buf(self) -> usize {
        ((self.packed >> KEPT_BUF_SHIFT) & KEPT_BUF_MASK) as usize
    }
    pub(super) fn set_counter(&mut self, counter: u64) {
        self.packed =
            (self.packed & ((1 << KEPT_COUNTER_SHIFT) - 1)) | ((counter & KEPT_COUNTER_MASK) << KEPT_COUNTER_SHIFT);
    }
    pub(super) fn counter_low(self) -> u64 {
        self.packed >> KEPT_COUNTER_SHIFT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Length (35 bits), buffer index (3 bits) and counter (the low 26 bits) share one word
    /// without disturbing each other.
    #[test]
    fn the_packed_fields_keep_to_their_bits() {
        let longest = (1usize << KEPT_LEN_BITS) - 1;
        let mut k = Kept::new(0xdead_b000, longest, 7);
        assert_eq!(
            (k.data, k.len(), k.buf(), k.counter_low()),
            (0xdead_b000, longest, 7, 0)
        );
        k.set_counter(u64::MAX);
        assert_eq!((k.len(), k.buf(), k.counter_low()), (longest, 7, KEPT_COUNTER_MASK));
        k.set_counter(KEPT_COUNTER_MASK + 1 + 5);
        assert_eq!(
            (k.len(), k.buf(), k.counter_low()),
            (longest, 7, 5),
            "only the low bits are kept"
        );
        let small = Kept::new(1, 100, 2);
        assert_eq!((small.len(), small.buf()), (100, 2));
        let top = Kept::new(1, 1 << (KEPT_LEN_BITS - 1), 0);
        assert_eq!(
            (top.len(), top.buf()),
            (1 << (KEPT_LEN_BITS - 1), 0),
            "the length's top bit is its own"
        );
    }
}
