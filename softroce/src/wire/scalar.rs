//! Extended transport headers that are a single big-endian integer (ImmDt, IETH,
//! AtomicAckETH): one macro writes their `Packet` view and `Repr`, so the three stay identical
//! in behaviour. Each header module keeps its own doc comment, names and tests.

/// `scalar_header!(HEADER_LEN, u32, field, set_field)` defines `HEADER_LEN`, `Packet<T>` with
/// `new_unchecked`/`new_checked`/`check_len`/`into_inner`, the getter and setter, and
/// `Repr { field }` with `parse`/`buffer_len`/`emit`.
macro_rules! scalar_header {
    ($len:expr, $ty:ty, $name:ident, $set:ident) => {
        use super::{Error, Result};

        pub const HEADER_LEN: usize = $len;

        mod field {
            use core::ops::Range;
            pub const VALUE: Range<usize> = 0..$len;
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
            pub fn $name(&self) -> $ty {
                let mut b = [0u8; $len];
                b.copy_from_slice(&self.buffer.as_ref()[field::VALUE]);
                <$ty>::from_be_bytes(b)
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            pub fn $set(&mut self, v: $ty) {
                self.buffer.as_mut()[field::VALUE].copy_from_slice(&v.to_be_bytes());
            }
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct Repr {
            pub $name: $ty,
        }

        impl Repr {
            pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
                p.check_len()?;
                Ok(Repr { $name: p.$name() })
            }
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
                p.$set(self.$name);
            }
        }
    };
}

/// A 24-bit big-endian field (BTH DestQP and PSN, AETH MSN).
pub(crate) fn be24(b: &[u8]) -> u32 {
    (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2])
}

/// Store a 24-bit big-endian field.
pub(crate) fn put_be24(b: &mut [u8], v: u32) {
    b[0] = (v >> 16) as u8;
    b[1] = (v >> 8) as u8;
    b[2] = v as u8;
}
