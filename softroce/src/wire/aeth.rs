//! ACK Extended Transport Header (IBTA Vol 1 §9.3.5), 4 bytes.
//!
//! ```text
//! //= IBTA Vol 1 §9.3.5, Table 43 / docs/softroce-internals.md#aeth-syndrome
//! //# Syndrome (u8) · MSN (u24)
//! //# bits 6..5: 00 ACK (4..0 credit count, 0x1F = no credit information)
//! //#            01 RNR NAK (4..0 RNR timer code), 11 NAK (4..0 NAK code)
//! ```

use super::scalar::{be24, put_be24};
use super::{Error, Result};

pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

enum_with_unknown! {
    /// NAK codes (syndrome bits 4..0 when bits 6..5 are 11).
    pub enum NakCode(u8) {
        PsnSequenceError = 0,
        InvalidRequest = 1,
        RemoteAccessError = 2,
        RemoteOperationalError = 3,
        InvalidRdRequest = 4,
    }
}

/// Decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// ACK with a credit count (0x1F: no credit information).
    Ack { credits: u8 },
    /// RNR NAK with the 5-bit RNR timer code.
    RnrNak { timer: u8 },
    /// NAK.
    Nak(NakCode),
    /// Reserved encoding (bits 6..5 = 10, or bit 7 set): the raw byte.
    Reserved(u8),
}

impl Syndrome {
    /// rxe never sends credits.
    pub const ACK_NO_CREDITS: Syndrome = Syndrome::Ack { credits: 0x1F };

    pub fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack { credits: b & 0x1F },
            1 => Syndrome::RnrNak { timer: b & 0x1F },
            3 => Syndrome::Nak(NakCode::from(b & 0x1F)),
            _ => Syndrome::Reserved(b),
        }
    }

    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(c) => 0x60 | (u8::from(c) & 0x1F),
            Syndrome::Reserved(b) => b,
        }
    }
}

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
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    pub fn msn(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v;
    }
    pub fn set_msn(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[field::MSN], v & super::MASK_24);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub syndrome: Syndrome,
    pub msn: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            syndrome: Syndrome::from_byte(p.syndrome()),
            msn: p.msn(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome(self.syndrome.to_byte());
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_round_trips() {
        let cases: [([u8; 4], Repr); 6] = [
            (
                [0x1f, 0x00, 0x00, 0x07],
                Repr {
                    syndrome: Syndrome::ACK_NO_CREDITS,
                    msn: 7,
                },
            ),
            (
                [0x2c, 0x12, 0x34, 0x56],
                Repr {
                    syndrome: Syndrome::RnrNak { timer: 12 },
                    msn: 0x123456,
                },
            ),
            (
                [0x60, 0, 0, 1],
                Repr {
                    syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                    msn: 1,
                },
            ),
            (
                [0x61, 0, 0, 1],
                Repr {
                    syndrome: Syndrome::Nak(NakCode::InvalidRequest),
                    msn: 1,
                },
            ),
            (
                [0x62, 0xff, 0xff, 0xff],
                Repr {
                    syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    msn: 0xFF_FFFF,
                },
            ),
            (
                [0x63, 0, 0, 0],
                Repr {
                    syndrome: Syndrome::Nak(NakCode::RemoteOperationalError),
                    msn: 0,
                },
            ),
        ];
        for (bytes, repr) in cases {
            assert_eq!(repr.buffer_len(), bytes.len());
            assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()), Ok(repr));
            let mut out = [0u8; 4];
            repr.emit(&mut Packet::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn syndrome_bytes_all_round_trip() {
        for b in 0u8..=255 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x45), Syndrome::Reserved(0x45));
        assert_eq!(Syndrome::from_byte(0x75), Syndrome::Nak(NakCode::Unknown(0x15)));
    }

    #[test]
    fn short() {
        assert_eq!(Packet::new_checked(&[0u8; 3][..]).err(), Some(Error::Truncated));
    }
}
