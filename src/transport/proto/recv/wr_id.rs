//! The receiver's `wr_id` layouts: the kind in the top byte; the low 16 bits are a request
//! index (flush reads) or a QP index (receives), or for CTS writes the device (bits 48..56) and
//! the write's sequence number on that device's CTS QP (bits 0..48).

pub(super) const KIND_SHIFT: u32 = 56;
pub(super) const KIND_RECV: u64 = 1;
pub(super) const KIND_CTS: u64 = 2;
pub(super) const KIND_FLUSH: u64 = 3;
/// A CTS write's device: 8 bits from this one; its sequence number below.
pub(super) const DEVICE_SHIFT: u32 = 48;
const DEVICE_MASK: u64 = 0xff;
pub(super) const SEQ_MASK: u64 = (1 << DEVICE_SHIFT) - 1;
/// The request or QP index of a receive's or flush's `wr_id`.
const INDEX_MASK: u64 = 0xffff;

pub(super) fn wr_id(kind: u64, idx: u16) -> u64 {
    (kind << KIND_SHIFT) | u64::from(idx)
}

/// The request or QP index in the low bits of a receive's or flush's `wr_id`.
pub(super) fn index(wr_id: u64) -> u16 {
    (wr_id & INDEX_MASK) as u16
}

/// The device and sequence number of a CTS write's `wr_id`.
pub(super) fn cts_parts(wr_id: u64) -> (usize, u64) {
    (((wr_id >> DEVICE_SHIFT) & DEVICE_MASK) as usize, wr_id & SEQ_MASK)
}

pub(super) fn cts_wr_id(d: usize, seq: u64) -> u64 {
    (KIND_CTS << KIND_SHIFT) | ((d as u64 & DEVICE_MASK) << DEVICE_SHIFT) | (seq & SEQ_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts, literally: kind in the top byte, a request or QP index in the low 16 bits,
    /// a CTS write's device in bits 48..56 and its sequence number below.
    #[test]
    fn wr_id_layouts_literal() {
        assert_eq!(wr_id(KIND_RECV, 0x1234), 0x0100_0000_0000_1234);
        assert_eq!(wr_id(KIND_FLUSH, 7), 0x0300_0000_0000_0007);
        assert_eq!(cts_wr_id(5, 0x42), 0x0205_0000_0000_0042);
        assert_eq!(
            cts_wr_id(1, SEQ_MASK + 3),
            0x0201_0000_0000_0002,
            "the sequence wraps within its bits"
        );
        assert_eq!(cts_wr_id(2, 9) >> KIND_SHIFT, KIND_CTS);
    }
}
