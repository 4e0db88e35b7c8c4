//! Local Route Header (IBTA Vol 1 §7.7), 8 bytes: the first header of every InfiniBand packet
//! (softroce's IB link layer, docs/softroce-internals.md#infiniband-link-layer).
//!
//! ```text
//! //= IBTA Vol 1 §7.7, Figure 32 / docs/softroce-internals.md#infiniband-link-layer
//! //# byte 0: VL(7..4) LVer(3..0) | byte 1: SL(7..4) rsv(3..2) LNH(1..0) | 2-3: DLID
//! //# 4-5: rsv(15..11) PktLen(10..0), in 4-byte words from the LRH to the ICRC inclusive
//! //# 6-7: SLID
//! ```

use super::{Error, Result};

pub const HEADER_LEN: usize = 8;

/// The largest LID of the unicast range (0x0001..=0xBFFF); 0 is "no LID" and 0xC000.. multicast.
pub const MAX_UNICAST_LID: u16 = 0xBFFF;

mod field {
    use core::ops::Range;
    pub const VL_LVER: usize = 0;
    pub const SL_LNH: usize = 1;
    pub const DLID: Range<usize> = 2..4;
    pub const PKT_LEN: Range<usize> = 4..6;
    pub const SLID: Range<usize> = 6..8;
}

enum_with_unknown! {
    /// Link Next Header: what follows the LRH.
    //= IBTA Vol 1 §7.7.5
    //# LNH 11b: IBA global (GRH follows); 10b: IBA local (BTH follows); 01b: raw IPv6; 00b: raw.
    pub enum Lnh(u8) {
        Raw = 0,
        RawIpv6 = 1,
        IbaLocal = 2,
        IbaGlobal = 3,
    }
}

/// A read/write view of an LRH at the start of a buffer.
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

    pub fn vl(&self) -> u8 {
        self.buffer.as_ref()[field::VL_LVER] >> 4
    }
    pub fn lver(&self) -> u8 {
        self.buffer.as_ref()[field::VL_LVER] & 0x0F
    }
    pub fn sl(&self) -> u8 {
        self.buffer.as_ref()[field::SL_LNH] >> 4
    }
    /// The two reserved bits between SL and LNH (must be 0).
    pub fn reserved2(&self) -> u8 {
        (self.buffer.as_ref()[field::SL_LNH] >> 2) & 0x3
    }
    pub fn lnh(&self) -> Lnh {
        Lnh::from(self.buffer.as_ref()[field::SL_LNH] & 0x3)
    }
    pub fn dlid(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::DLID];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// The five reserved bits above PktLen (must be 0).
    pub fn reserved5(&self) -> u8 {
        self.buffer.as_ref()[field::PKT_LEN.start] >> 3
    }
    /// Packet length in 4-byte words, LRH to ICRC inclusive (the VCRC is not counted).
    pub fn pkt_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PKT_LEN];
        u16::from_be_bytes([b[0], b[1]]) & 0x07FF
    }
    pub fn slid(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::SLID];
        u16::from_be_bytes([b[0], b[1]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_vl_lver(&mut self, vl: u8, lver: u8) {
        self.buffer.as_mut()[field::VL_LVER] = ((vl & 0xF) << 4) | (lver & 0xF);
    }
    /// Set SL and LNH (the reserved bits between them to 0).
    pub fn set_sl_lnh(&mut self, sl: u8, lnh: Lnh) {
        self.buffer.as_mut()[field::SL_LNH] = ((sl & 0xF) << 4) | (u8::from(lnh) & 0x3);
    }
    pub fn set_dlid(&mut self, v: u16) {
        self.buffer.as_mut()[field::DLID].copy_from_slice(&v.to_be_bytes());
    }
    /// Set PktLen (the reserved bits above it to 0).
    pub fn set_pkt_len(&mut self, words: u16) {
        self.buffer.as_mut()[field::PKT_LEN].copy_from_slice(&(words & 0x07FF).to_be_bytes());
    }
    pub fn set_slid(&mut self, v: u16) {
        self.buffer.as_mut()[field::SLID].copy_from_slice(&v.to_be_bytes());
    }
}

/// High-level representation of an LRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub vl: u8,
    pub sl: u8,
    pub lnh: Lnh,
    pub dlid: u16,
    /// In 4-byte words, LRH to ICRC inclusive.
    pub pkt_len: u16,
    pub slid: u16,
}

impl Repr {
    /// Parse a checked LRH. LVer must be 0 and the reserved bits 0; an unknown LNH cannot
    /// occur (two bits, all four named).
    //= IBTA Vol 1 §7.7.2
    //# LVer ... packets with a link version other than 0 are dropped.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.lver() != 0 || p.reserved2() != 0 || p.reserved5() != 0 {
            return Err(Error::Malformed);
        }
        Ok(Repr {
            vl: p.vl(),
            sl: p.sl(),
            lnh: p.lnh(),
            dlid: p.dlid(),
            pkt_len: p.pkt_len(),
            slid: p.slid(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Emit into `p` (at least [`HEADER_LEN`] bytes), LVer 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_vl_lver(self.vl, 0);
        p.set_sl_lnh(self.sl, self.lnh);
        p.set_dlid(self.dlid);
        p.set_pkt_len(self.pkt_len);
        p.set_slid(self.slid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// VL 0, SL 3, IBA local, DLID 0x1602, 19 words (76 bytes to the ICRC), SLID 0x1601.
    static BYTES: [u8; 8] = [0x00, 0x32, 0x16, 0x02, 0x00, 0x13, 0x16, 0x01];
    const REPR: Repr = Repr {
        vl: 0,
        sl: 3,
        lnh: Lnh::IbaLocal,
        dlid: 0x1602,
        pkt_len: 19,
        slid: 0x1601,
    };

    #[test]
    fn round_trip() {
        assert_eq!(REPR.buffer_len(), BYTES.len());
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(REPR));
        let mut buf = [0xAAu8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn global_and_vl() {
        // VL 15 (the management VL), SL 0, IBA global, 0x7FF words.
        let b = [0xF0, 0x03, 0xBF, 0xFF, 0x07, 0xFF, 0x00, 0x01];
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            (r.vl, r.sl, r.lnh, r.dlid, r.pkt_len, r.slid),
            (15, 0, Lnh::IbaGlobal, 0xBFFF, 0x7FF, 1)
        );
        // And back: VL in the high nibble of byte 0, every other field at its place.
        let mut out = [0xAAu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn rejects_version_and_reserved_bits() {
        let mut b = BYTES;
        b[0] = 0x01; // LVer 1
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::Malformed));
        let mut b = BYTES;
        b[1] |= 0x04; // reserved bit between SL and LNH
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::Malformed));
        let mut b = BYTES;
        b[4] |= 0x08; // reserved bit above PktLen
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::Malformed));
    }

    #[test]
    fn short() {
        assert_eq!(Packet::new_checked(&BYTES[..7]).err(), Some(Error::Truncated));
    }
}
