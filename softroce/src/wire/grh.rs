//! Global Route Header (IBTA Vol 1 §8.3), 40 bytes, laid out as an IPv6 header: present in an
//! InfiniBand packet whose LRH says LNH = IBA global (an address vector with `is_global`).
//!
//! ```text
//! //= IBTA Vol 1 §8.3, Figure 37 / docs/softroce-internals.md#infiniband-link-layer
//! //# byte 0: IPVer(7..4) TClass(7..4) | byte 1: TClass(3..0) FlowLabel(19..16)
//! //# 2-3: FlowLabel(15..0) | 4-5: PayLen (bytes after the GRH, ICRC included)
//! //# 6: NxtHdr (0x1B: BTH) | 7: HopLmt | 8-23: SGID | 24-39: DGID
//! ```

use super::{Error, Result};

pub const HEADER_LEN: usize = 40;

/// The GRH's IP version.
pub const IP_VERSION: u8 = 6;

/// `NxtHdr` of an IBA transport header (BTH) after the GRH.
//= IBTA Vol 1 §8.3.1
//# NxtHdr ... 0x1B: IBA transport header follows.
pub const NXT_HDR_BTH: u8 = 0x1B;

mod field {
    use core::ops::Range;
    pub const VER_TCLASS_FLOW: Range<usize> = 0..4;
    pub const PAY_LEN: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LMT: usize = 7;
    pub const SGID: Range<usize> = 8..24;
    pub const DGID: Range<usize> = 24..40;
}

/// A read/write view of a GRH at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn first_word(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VER_TCLASS_FLOW];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn ip_version(&self) -> u8 {
        (self.first_word() >> 28) as u8
    }
    pub fn traffic_class(&self) -> u8 {
        (self.first_word() >> 20) as u8
    }
    pub fn flow_label(&self) -> u32 {
        self.first_word() & 0x000F_FFFF
    }
    pub fn payload_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PAY_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LMT]
    }
    pub fn sgid(&self) -> [u8; 16] {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.buffer.as_ref()[field::SGID]);
        g
    }
    pub fn dgid(&self) -> [u8; 16] {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.buffer.as_ref()[field::DGID]);
        g
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set IPVer, TClass and FlowLabel (its low 20 bits) at once.
    pub fn set_version_class_flow(&mut self, version: u8, traffic_class: u8, flow_label: u32) {
        let w = (u32::from(version & 0xF) << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000F_FFFF);
        self.buffer.as_mut()[field::VER_TCLASS_FLOW].copy_from_slice(&w.to_be_bytes());
    }
    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::PAY_LEN].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = v;
    }
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LMT] = v;
    }
    pub fn set_sgid(&mut self, g: &[u8; 16]) {
        self.buffer.as_mut()[field::SGID].copy_from_slice(g);
    }
    pub fn set_dgid(&mut self, g: &[u8; 16]) {
        self.buffer.as_mut()[field::DGID].copy_from_slice(g);
    }
}

/// High-level representation of a GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub traffic_class: u8,
    pub flow_label: u32,
    /// Bytes after the GRH: BTH .. ICRC inclusive.
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
}

impl Repr {
    /// Parse a checked GRH; IPVer must be 6.
    //= IBTA Vol 1 §8.3.1
    //# IPVer ... shall be set to 6.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.ip_version() != IP_VERSION {
            return Err(Error::Malformed);
        }
        Ok(Repr {
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            payload_len: p.payload_len(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            sgid: p.sgid(),
            dgid: p.dgid(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Emit into `p` (at least [`HEADER_LEN`] bytes), IPVer 6.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_version_class_flow(IP_VERSION, self.traffic_class, self.flow_label);
        p.set_payload_len(self.payload_len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_sgid(&self.sgid);
        p.set_dgid(&self.dgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TClass 0xA5, flow label 0x12345, 44 bytes after the GRH, BTH next, hop limit 64,
    /// SGID fe80::253:7fff:fe00:1601, DGID fe80::253:7fff:fe00:1602.
    static BYTES: [u8; 40] = [
        0x6A, 0x51, 0x23, 0x45, 0x00, 0x2C, 0x1B, 0x40, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x53, 0x7f, 0xff, 0xfe, 0x00, 0x16, 0x01, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x53, 0x7f, 0xff, 0xfe, 0x00, 0x16, 0x02,
    ];

    fn repr() -> Repr {
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&BYTES[8..24]);
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&BYTES[24..40]);
        Repr {
            traffic_class: 0xA5,
            flow_label: 0x12345,
            payload_len: 44,
            next_header: NXT_HDR_BTH,
            hop_limit: 64,
            sgid,
            dgid,
        }
    }

    #[test]
    fn round_trip() {
        assert_eq!(repr().buffer_len(), BYTES.len());
        assert_eq!(Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()), Ok(repr()));
        let mut buf = [0u8; 40];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn rejects_other_versions_and_short_buffers() {
        let mut b = BYTES;
        b[0] = 0x4A;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::Malformed));
        assert_eq!(Packet::new_checked(&BYTES[..39]).err(), Some(Error::Truncated));
    }
}
