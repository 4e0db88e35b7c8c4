//! Atomic ACK Extended Transport Header (IBTA Vol 1 §9.3.8), 8 bytes: the
//! original remote value, big-endian on the wire.

scalar_header!(8, u64, orig, set_orig);

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
