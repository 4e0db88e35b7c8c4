//! Base Transport Header (IBTA Vol 1 §9.2), 12 bytes.
//!
//! ```text
//! //= IBTA Vol 1 §9.2, Figure 92 / docs/softroce-internals.md#base-transport-header
//! //# byte 0: OpCode | byte 1: SE(7) M(6) PadCnt(5..4) TVer(3..0) | 2-3: P_Key
//! //# byte 4: FECN(7) BECN(6) resv6 | 5-7: DestQP | byte 8: A(7) resv7 | 9-11: PSN
//! ```

use super::scalar::{be24, put_be24};
use super::{Error, OpCode, Psn, Result};

pub const HEADER_LEN: usize = 12;

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    pub const RESV8A: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    pub const ACK_REQ: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

/// A read/write view of a BTH at the start of a buffer.
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

    pub fn opcode(&self) -> OpCode {
        OpCode::from(self.buffer.as_ref()[field::OPCODE])
    }
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0F
    }
    pub fn pkey(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PKEY];
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x80 != 0
    }
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x40 != 0
    }
    pub fn dest_qp(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::DEST_QP])
    }
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }
    pub fn psn(&self) -> Psn {
        Psn::new(be24(&self.buffer.as_ref()[field::PSN]))
    }
    /// Bytes after the BTH.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_opcode(&mut self, v: OpCode) {
        self.buffer.as_mut()[field::OPCODE] = v.into();
    }
    /// Set SE, M, PadCnt and TVer at once.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] =
            (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_count & 3) << 4) | (tver & 0xF);
    }
    pub fn set_pkey(&mut self, v: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::RESV8A] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    pub fn set_dest_qp(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[field::DEST_QP], v);
    }
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }
    pub fn set_psn(&mut self, v: Psn) {
        put_be24(&mut self.buffer.as_mut()[field::PSN], v.value());
    }
}

/// High-level representation of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub opcode: OpCode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl Repr {
    /// Parse a checked BTH. TVer must be 0.
    //= IBTA Vol 1 §9.2.3
    //# TVer ... packets with an unsupported transport version are silently dropped.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(Error::Malformed);
        }
        Ok(Repr {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_fecn_becn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // WRITE Only, SE=0 pad=0, pkey ffff, QPN 0x11, AckReq, PSN 0x123456
    // (docs/softroce-internals.md#icrc capture).
    static BYTES: [u8; 12] = [0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56];

    fn repr() -> Repr {
        Repr {
            opcode: OpCode::WriteOnly,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(0x123456),
        }
    }

    #[test]
    fn parse_literal() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn emit_literal() {
        assert_eq!(repr().buffer_len(), BYTES.len());
        let mut buf = [0xAAu8; 12];
        repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn flags_round_trip() {
        let r = Repr {
            solicited: true,
            pad_count: 3,
            fecn: true,
            ack_req: false,
            dest_qp: 0xABCDEF,
            ..repr()
        };
        let mut buf = [0u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(
            buf,
            [0x0a, 0xb0, 0xff, 0xff, 0x80, 0xab, 0xcd, 0xef, 0x00, 0x12, 0x34, 0x56]
        );
        assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), r);
    }

    /// Each one-bit field alone, at its literal position (byte 1 bit 7 SE, bit 6 M; byte 4
    /// bit 7 FECN, bit 6 BECN; byte 8 bit 7 AckReq): emitted there and parsed back alone.
    #[test]
    fn each_flag_bit_alone_at_its_literal_position() {
        let none = Repr {
            ack_req: false,
            ..repr()
        };
        let cases: [(Repr, usize, u8); 5] = [
            (
                Repr {
                    solicited: true,
                    ..none
                },
                1,
                0x80,
            ),
            (Repr { mig_req: true, ..none }, 1, 0x40),
            (Repr { fecn: true, ..none }, 4, 0x80),
            (Repr { becn: true, ..none }, 4, 0x40),
            (Repr { ack_req: true, ..none }, 8, 0x80),
        ];
        for (r, at, bit) in cases {
            let mut want = BYTES;
            want[8] = 0;
            want[at] = bit;
            let mut buf = [0xAAu8; 12];
            r.emit(&mut Packet::new_unchecked(&mut buf[..]));
            assert_eq!(buf, want, "{r:?}");
            assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn payload_is_the_bytes_after_the_header() {
        let mut buf = BYTES.to_vec();
        buf.extend_from_slice(&[1, 2, 3]);
        assert_eq!(Packet::new_checked(&buf[..]).unwrap().payload(), &[1, 2, 3]);
        assert_eq!(Packet::new_checked(&BYTES[..]).unwrap().payload(), &[] as &[u8]);
    }

    #[test]
    fn every_rc_opcode_round_trips_and_unknown_maps() {
        for v in 0u8..=255 {
            let op = OpCode::from(v);
            assert_eq!(u8::from(op), v);
            let mut buf = BYTES;
            buf[0] = v;
            let r = Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap();
            assert_eq!(r.opcode, op);
            if matches!(v, 0x15 | 0x18..=0xFF) {
                assert_eq!(op, OpCode::Unknown(v));
            } else {
                assert!(!matches!(op, OpCode::Unknown(_)), "{v:#x}");
            }
            let mut out = [0u8; 12];
            r.emit(&mut Packet::new_unchecked(&mut out[..]));
            assert_eq!(out, buf);
        }
    }

    #[test]
    fn rejects_short_and_bad_tver() {
        for n in 0..12 {
            assert_eq!(Packet::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
        let mut buf = BYTES;
        buf[1] = 0x01;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()),
            Err(Error::Malformed)
        );
    }
}
