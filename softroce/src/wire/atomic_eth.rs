//! Atomic Extended Transport Header (IBTA Vol 1 §9.3.7), 28 bytes.
//!
//! ```text
//! //= IBTA Vol 1 §9.3.7 / docs/softroce-internals.md#extension-headers
//! //# AtomicETH: VA (u64) · R_Key (u32) · Swap-or-Add (u64) · Compare (u64) — packed
//! ```

use super::{Error, Result};

pub const HEADER_LEN: usize = 28;

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const SWAP_ADD: Range<usize> = 12..20;
    pub const COMPARE: Range<usize> = 20..28;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
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
        be64(&self.buffer.as_ref()[field::VA])
    }
    pub fn rkey(&self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buffer.as_ref()[field::RKEY]);
        u32::from_be_bytes(b)
    }
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::VA].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::RKEY].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_swap_add(&mut self, v: u64) {
        self.buffer.as_mut()[field::SWAP_ADD].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_compare(&mut self, v: u64) {
        self.buffer.as_mut()[field::COMPARE].copy_from_slice(&v.to_be_bytes());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    /// Swap value (CmpSwap) or add value (FetchAdd).
    pub swap_add: u64,
    /// Compare value (CmpSwap; ignored by FetchAdd).
    pub compare: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 28] = [
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x20, 0x08, // va
        0x00, 0x00, 0x56, 0x78, // rkey
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // swap/add
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // compare
    ];
    const REPR: Repr = Repr {
        va: 0x7f00_0000_2008,
        rkey: 0x5678,
        swap_add: 0x1122_3344_5566_7788,
        compare: 0x0102_0304_0506_0708,
    };

    #[test]
    fn round_trip() {
        assert_eq!(REPR.buffer_len(), BYTES.len());
        assert_eq!(Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()), Ok(REPR));
        let mut out = [0u8; 28];
        REPR.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert_eq!(Packet::new_checked(&BYTES[..27]).err(), Some(Error::Truncated));
    }
}
