//! Immediate Data Extended Transport Header (IBTA Vol 1 §9.3.4), 4 bytes.
//!
//! The value is carried byte-exact to `wc.imm_data` (docs/softroce-internals.md#design-rules:
//! never swap).
//! `imm` here is the big-endian reading of the 4 wire bytes.

scalar_header!(4, u32, imm, set_imm);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0xde, 0xad, 0xbe, 0xef];
        let repr = Repr { imm: 0xdead_beef };
        assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(Packet::new_checked(&bytes[..3]).err(), Some(Error::Truncated));
    }
}
