//! Atomic ACK Extended Transport Header (IBTA Vol 1 §9.3.8), 8 bytes: the
//! original remote value, big-endian on the wire.

use super::{Error, Result};

pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;
    pub const ORIG: Range<usize> = 0..8;
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
    pub fn orig(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buffer.as_ref()[field::ORIG]);
        u64::from_be_bytes(b)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_orig(&mut self, v: u64) {
        self.buffer.as_mut()[field::ORIG].copy_from_slice(&v.to_be_bytes());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub orig: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { orig: p.orig() })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        let repr = Repr {
            orig: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0u8; 8];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(Packet::new_checked(&bytes[..7]).err(), Some(Error::Truncated));
    }
}
