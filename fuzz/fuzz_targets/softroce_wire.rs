//! softroce's wire parser on arbitrary bytes: every header view and `Repr` (BTH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH) and the whole-packet `Repr`.
//!
//! Invariants, beyond "no panic" (the contract of `softroce::wire`):
//! * a `Repr` that parsed emits bytes that parse to the same `Repr`, and those bytes are the
//!   input's own (the BTH's reserved bits masked, which emit writes as 0);
//! * a whole packet that parsed re-emits to a packet that parses equal (the pad count derived
//!   from the payload length), byte for byte the input when its pad was canonical and zero;
//! * the ICRC of the emitted packet verifies, and no longer does after flipping any one bit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softroce::wire::icrc::{icrc_ipv4, verify_ipv4, Ipv4Fields};
use softroce::wire::{self, aeth, atomic_ack_eth, atomic_eth, bth, ieth, immdt, pad_len, reth, RocePacketRepr};

/// Parse one header kind at the start of `data`; when it parses, emit it and check both levels.
macro_rules! header_round_trip {
    ($m:ident, $data:expr, $mask:expr) => {
        if let Ok(p) = $m::Packet::new_checked($data) {
            if let Ok(r) = $m::Repr::parse(&p) {
                let mut out = [0u8; $m::HEADER_LEN];
                r.emit(&mut $m::Packet::new_unchecked(&mut out[..]));
                let back = $m::Packet::new_checked(&out[..]).expect("an emitted header is long enough");
                assert_eq!(
                    $m::Repr::parse(&back),
                    Ok(r),
                    concat!(stringify!($m), ": parse(emit(r)) == r")
                );
                let mask: &[u8] = $mask;
                for (i, (&a, &b)) in out.iter().zip($data.iter()).enumerate() {
                    let m = mask.get(i).copied().unwrap_or(0xff);
                    assert_eq!(
                        a & m,
                        b & m,
                        concat!(stringify!($m), ": emit(parse(x)) == x at byte {}"),
                        i
                    );
                }
            }
        }
    };
}

/// BTH byte 4 holds FECN, BECN and 6 reserved bits; byte 8 AckReq and 7 reserved bits.
const BTH_MASK: [u8; 12] = [0xff, 0xff, 0xff, 0xff, 0xc0, 0xff, 0xff, 0xff, 0x80, 0xff, 0xff, 0xff];

fuzz_target!(|data: &[u8]| {
    header_round_trip!(bth, data, &BTH_MASK);
    header_round_trip!(reth, data, &[]);
    header_round_trip!(atomic_eth, data, &[]);
    header_round_trip!(aeth, data, &[]);
    header_round_trip!(atomic_ack_eth, data, &[]);
    header_round_trip!(immdt, data, &[]);
    header_round_trip!(ieth, data, &[]);
    if let Some(&b) = data.first() {
        assert_eq!(
            aeth::Syndrome::from_byte(b).to_byte(),
            b,
            "AETH syndrome byte round trip"
        );
        assert_eq!(u8::from(wire::OpCode::from(b)), b, "opcode round trip");
    }

    let Ok(r) = RocePacketRepr::parse(data) else { return };
    assert!(r.payload.len() <= data.len());
    let mut out = vec![0u8; r.buffer_len()];
    r.emit(&mut out);
    let again = RocePacketRepr::parse(&out).expect("an emitted packet parses");
    let mut want = r;
    want.bth.pad_count = pad_len(r.payload.len()) as u8;
    assert_eq!(
        again, want,
        "parse(emit(parse(x))) == parse(x), pad derived from the payload"
    );
    let canonical_pad = usize::from(r.bth.pad_count) == pad_len(r.payload.len())
        && data[data.len() - usize::from(r.bth.pad_count)..]
            .iter()
            .all(|&b| b == 0);
    if canonical_pad {
        assert_eq!(out.len(), data.len());
        for (i, (&a, &b)) in out.iter().zip(data).enumerate() {
            let m = BTH_MASK.get(i).copied().unwrap_or(0xff);
            assert_eq!(a & m, b & m, "emit(parse(x)) == x at byte {i}");
        }
    }
    // The ICRC the driver appends verifies; any single flipped bit of the datagram fails it.
    let ip = Ipv4Fields::new([127, 0, 0, 1], [127, 0, 0, 2], 0);
    let mut dgram = out.clone();
    dgram.extend_from_slice(&icrc_ipv4(&ip, 4791, 4791, &out).to_le_bytes());
    assert_eq!(verify_ipv4(&ip, 4791, 4791, &dgram), Some(&out[..]));
    let bit = data
        .iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(usize::from(b)))
        % (dgram.len() * 8);
    // Byte 4 of the BTH (FECN/BECN) is masked out of the ICRC by the spec: flip elsewhere.
    let bit = if bit / 8 == 4 { bit + 8 } else { bit };
    dgram[bit / 8] ^= 1 << (bit % 8);
    assert_eq!(
        verify_ipv4(&ip, 4791, 4791, &dgram),
        None,
        "a flipped bit {bit} passes the ICRC"
    );
});
