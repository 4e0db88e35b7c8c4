//! InfiniBand Variant CRC: the 16-bit CRC that ends every InfiniBand packet, after the ICRC
//! (docs/softroce-internals.md#infiniband-link-layer).
//!
//! ```text
//! //= IBTA Vol 1 §7.8.2 / docs/softroce-internals.md#infiniband-link-layer
//! //# CRC-16 with polynomial x^16 + x^12 + x^3 + x + 1 (0x100B), register preset to all
//! //# ones, result complemented, over every byte from the first of the LRH to the last of
//! //# the ICRC; bits in the order of the ICRC (least significant first), so the register
//! //# runs reflected (polynomial 0xD008) and the result goes on the wire least-significant
//! //# byte first.
//! ```
//!
//! The VCRC covers the fields a switch may change (VL), so each link recomputes it; softroce
//! has one link per packet, and checks it on receive before anything else.

/// Length of the VCRC trailer.
pub const VCRC_LEN: usize = 2;

/// The reflected form of the polynomial 0x100B.
const POLY_REFLECTED: u16 = 0xD008;

/// Slicing-by-8 tables: `[0]` is the byte table of the reflected register, `[k]` advances a
/// byte through k more zero bytes (as `icrc::SoftCrc32` does for the ICRC).
const fn make_tables() -> [[u16; 256]; 8] {
    let mut t = [[0u16; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY_REFLECTED } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

static VCRC_TABLES: [[u16; 256]; 8] = make_tables();

/// Incremental VCRC, for a packet passed in pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc16 {
    reg: u16,
}

impl Default for Crc16 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc16 {
    pub const fn new() -> Crc16 {
        Crc16 { reg: 0xFFFF }
    }

    /// Feed bytes.
    pub fn update(&mut self, data: &[u8]) {
        let t = &VCRC_TABLES;
        let mut reg = self.reg;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let r = reg ^ u16::from_le_bytes([c[0], c[1]]);
            reg = t[7][usize::from(r as u8)]
                ^ t[6][usize::from(r >> 8)]
                ^ t[5][usize::from(c[2])]
                ^ t[4][usize::from(c[3])]
                ^ t[3][usize::from(c[4])]
                ^ t[2][usize::from(c[5])]
                ^ t[1][usize::from(c[6])]
                ^ t[0][usize::from(c[7])];
        }
        for &b in chunks.remainder() {
            reg = t[0][usize::from((reg ^ u16::from(b)) as u8)] ^ (reg >> 8);
        }
        self.reg = reg;
    }

    /// The VCRC value (final complement applied).
    pub const fn finish(&self) -> u16 {
        !self.reg
    }
}

/// The VCRC of `data` (LRH .. ICRC inclusive).
pub fn vcrc(data: &[u8]) -> u16 {
    let mut c = Crc16::new();
    c.update(data);
    c.finish()
}

/// Checks the VCRC at the end of a whole InfiniBand packet; returns the packet without it.
pub fn verify(packet: &[u8]) -> Option<&[u8]> {
    let n = packet.len().checked_sub(VCRC_LEN)?;
    let (body, c) = packet.split_at(n);
    (vcrc(body) == u16::from_le_bytes([c[0], c[1]])).then_some(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial applied one bit at a time, least significant bit first, as the spec's
    /// serial shift register does; the table-driven [`vcrc`] must agree on every input.
    fn serial(data: &[u8]) -> u16 {
        let mut reg: u16 = 0xFFFF;
        for &b in data {
            for bit in 0..8 {
                let inb = u16::from((b >> bit) & 1);
                let out = reg & 1;
                reg >>= 1;
                if out ^ inb != 0 {
                    reg ^= POLY_REFLECTED;
                }
            }
        }
        !reg
    }

    #[test]
    fn table_matches_serial_register() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 13 + 7) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(vcrc(&data[..n]), serial(&data[..n]), "length {n}");
        }
        assert_eq!(vcrc(b""), 0x0000);
    }

    /// Appended least-significant byte first, the VCRC makes the register over packet ++ VCRC
    /// end at one constant residue for every packet (the property of a CRC sent in its bit
    /// order), and any bit flip is caught.
    #[test]
    fn check_value_and_residue() {
        assert_eq!(vcrc(b"123456789"), serial(b"123456789"));
        let mut residues = std::collections::HashSet::new();
        for msg in [&b"123456789"[..], b"softroce", b"\x00\x32\x16\x02"] {
            let mut m = msg.to_vec();
            m.extend_from_slice(&vcrc(msg).to_le_bytes());
            assert_eq!(verify(&m), Some(msg));
            residues.insert(!serial(&m));
            m[0] ^= 1;
            assert_eq!(verify(&m), None);
        }
        assert_eq!(residues.len(), 1, "every message ++ its VCRC leaves the same residue");
        assert_eq!(verify(&[1]), None);
    }
}
