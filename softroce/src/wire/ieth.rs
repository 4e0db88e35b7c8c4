//! Invalidate Extended Transport Header (IBTA Vol 1 §9.3.6), 4 bytes: the R_Key to invalidate.

use super::{Error, Result};

pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;
    pub const VALUE: Range<usize> = 0..4;
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
    pub fn rkey(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buffer.as_ref()[field::VALUE]);
        u32::from_be_bytes(b)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::VALUE].copy_from_slice(&v.to_be_bytes());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub rkey: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr { rkey: p.rkey() })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0xde, 0xad, 0xbe, 0xef];
        let repr = Repr { rkey: 0xdead_beef };
        assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(Packet::new_checked(&bytes[..3]).err(), Some(Error::Truncated));
    }
}
