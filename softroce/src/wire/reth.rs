//! RDMA Extended Transport Header (IBTA Vol 1 §9.3.3), 16 bytes.
//!
//! ```text
//! //= IBTA Vol 1 §9.3.3 / docs/softroce-internals.md#extension-headers
//! //# RETH: VA (u64) · R_Key (u32) · DMA length (u32) — length of the whole message
//! ```

use super::{Error, Result};

pub const HEADER_LEN: usize = 16;

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
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
    pub fn va(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buffer.as_ref()[field::VA]);
        u64::from_be_bytes(b)
    }
    pub fn rkey(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buffer.as_ref()[field::RKEY]);
        u32::from_be_bytes(b)
    }
    pub fn dma_len(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buffer.as_ref()[field::DMA_LEN]);
        u32::from_be_bytes(b)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::VA].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::RKEY].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_dma_len(&mut self, v: u32) {
        self.buffer.as_mut()[field::DMA_LEN].copy_from_slice(&v.to_be_bytes());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From the docs/softroce-internals.md#icrc capture: VA 0x7f0000001000, rkey 0x1234, 16 bytes.
    static BYTES: [u8; 16] = [0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0x10];
    const REPR: Repr = Repr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 16,
    };

    #[test]
    fn round_trip() {
        assert_eq!(REPR.buffer_len(), BYTES.len());
        assert_eq!(Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()), Ok(REPR));
        let mut buf = [0u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn short() {
        assert_eq!(Packet::new_checked(&BYTES[..15]).err(), Some(Error::Truncated));
    }
}
