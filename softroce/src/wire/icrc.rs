//! RoCEv2 Invariant CRC.
//!
//! ```text
//! //= IBTA Annex A17 §A17.4.1 (RoCEv2 ICRC) / docs/softroce-internals.md#icrc
//! //# CRC-32 of the Ethernet/zlib flavour (reflected poly 0xEDB88320, preset
//! //# all ones, final complement) over: 8 bytes of 0xFF (masked LRH); the IP
//! //# header with TOS, TTL and header checksum set to all ones (IPv6: traffic
//! //# class, flow label, hop limit); the UDP header with checksum 0xFFFF; the
//! //# BTH with byte 4 (FECN/BECN/resv) set to 0xFF; the rest of the packet.
//! //# The result is appended little-endian.
//! ```
//!
//! IPv4 identification and flags/fragment offset are *inside* the CRC: with
//! UDP GSO the kernel gives segment *i* the ID *first + i*
//! (docs/softroce-internals.md#udp-segmentation-offload), so the
//! driver passes the ID each segment will carry.
//!
//! The CRC is computed by `crc32fast` (PCLMULQDQ/NEON folding, ~40 GB/s);
//! [`SoftCrc32`], a table-driven slicing-by-8 implementation, is kept as the
//! reference the tests cross-check it against.

const POLY: u32 = 0xEDB8_8320;

const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
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

static TABLES: [[u32; 256]; 8] = make_tables();

/// Incremental CRC-32/ISO-HDLC (`crc32fast`).
#[derive(Debug, Clone)]
pub struct Crc32 {
    h: crc32fast::Hasher,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    pub fn new() -> Crc32 {
        Crc32 {
            h: crc32fast::Hasher::new(),
        }
    }

    /// Continue from a finished CRC value (`finish()` of the prefix).
    pub fn with_initial(crc: u32) -> Crc32 {
        Crc32 {
            h: crc32fast::Hasher::new_with_initial(crc),
        }
    }

    /// Feed bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.h.update(data);
    }

    /// The CRC value (final complement applied).
    pub fn finish(&self) -> u32 {
        self.h.clone().finalize()
    }
}

/// `Crc32::finish()` after the 8 bytes of 0xFF that stand in for the masked LRH
/// (raw register 0xDEBB20E3, docs/softroce-internals.md#icrc).
const AFTER_LRH_MASK: u32 = !0xDEBB_20E3;

/// Reference CRC-32/ISO-HDLC, table driven (slicing-by-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftCrc32 {
    reg: u32,
}

impl Default for SoftCrc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl SoftCrc32 {
    pub const fn new() -> SoftCrc32 {
        SoftCrc32 { reg: 0xFFFF_FFFF }
    }

    /// Feed bytes.
    pub fn update(&mut self, data: &[u8]) {
        let t = &TABLES;
        let mut crc = self.reg;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            crc = t[7][(lo & 0xFF) as usize]
                ^ t[6][((lo >> 8) & 0xFF) as usize]
                ^ t[5][((lo >> 16) & 0xFF) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][(hi & 0xFF) as usize]
                ^ t[2][((hi >> 8) & 0xFF) as usize]
                ^ t[1][((hi >> 16) & 0xFF) as usize]
                ^ t[0][(hi >> 24) as usize];
        }
        for &b in chunks.remainder() {
            crc = t[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
        }
        self.reg = crc;
    }

    /// The CRC value (final complement applied).
    pub const fn finish(&self) -> u32 {
        !self.reg
    }
}

/// One-shot CRC-32/ISO-HDLC (`crc32fast::hash` equivalent).
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(data);
    c.finish()
}

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// The IPv4 header fields that enter the ICRC. TOS and TTL are masked by
/// the ICRC, so they are not needed; total length and UDP length are
/// derived from the transport length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Fields {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// IP identification (0 for an unconnected socket with DF forced; segment index under GSO).
    pub ident: u16,
    /// Flags + fragment offset (0x4000 = DF, which softroce always sets).
    pub flags_frag: u16,
}

impl Ipv4Fields {
    /// DF set, the given ID.
    pub const fn new(src: [u8; 4], dst: [u8; 4], ident: u16) -> Self {
        Ipv4Fields {
            src,
            dst,
            ident,
            flags_frag: 0x4000,
        }
    }
}

fn masked_bth_start(crc: &mut Crc32, transport: &[u8]) {
    // BTH with byte 4 (FECN/BECN/resv6) masked to 0xFF.
    if transport.len() >= 12 {
        let mut b = [0u8; 12];
        b.copy_from_slice(&transport[..12]);
        b[4] = 0xFF;
        crc.update(&b);
        crc.update(&transport[12..]);
    } else {
        crc.update(transport);
    }
}

/// ICRC of an IPv4 RoCEv2 packet whose UDP payload is
/// `transport ++ ICRC` (`transport` = BTH .. pad, without the ICRC),
/// passed in one or more pieces (headers, payload) to avoid a copy.
pub fn icrc_ipv4_parts(ip: &Ipv4Fields, src_port: u16, dst_port: u16, parts: &[&[u8]]) -> u32 {
    let tlen: usize = parts.iter().map(|p| p.len()).sum();
    let udp_len = (8 + tlen + ICRC_LEN) as u16;
    let total_len = udp_len.wrapping_add(20);
    let mut pseudo = [0xFFu8; 20 + 8];
    let h = &mut pseudo[0..20];
    h[0] = 0x45;
    h[1] = 0xFF; // TOS masked
    h[2..4].copy_from_slice(&total_len.to_be_bytes());
    h[4..6].copy_from_slice(&ip.ident.to_be_bytes());
    h[6..8].copy_from_slice(&ip.flags_frag.to_be_bytes());
    h[8] = 0xFF; // TTL masked
    h[9] = 17; // UDP
    h[10] = 0xFF; // header checksum masked
    h[11] = 0xFF;
    h[12..16].copy_from_slice(&ip.src);
    h[16..20].copy_from_slice(&ip.dst);
    let u = &mut pseudo[20..28];
    u[0..2].copy_from_slice(&src_port.to_be_bytes());
    u[2..4].copy_from_slice(&dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6] = 0xFF; // UDP checksum masked
    u[7] = 0xFF;
    let mut crc = Crc32::with_initial(AFTER_LRH_MASK);
    crc.update(&pseudo);
    feed_parts(&mut crc, parts);
    crc.finish()
}

fn feed_parts(crc: &mut Crc32, parts: &[&[u8]]) {
    // The BTH (first 12 transport bytes) may straddle pieces; mask byte 4.
    let mut off = 0usize;
    for p in parts {
        if off >= 12 {
            crc.update(p);
        } else if off == 0 && p.len() >= 12 {
            masked_bth_start(crc, p);
        } else {
            for (i, &b) in p.iter().enumerate() {
                let pos = off + i;
                if pos >= 12 {
                    crc.update(&p[i..]);
                    break;
                }
                crc.update(&[if pos == 4 { 0xFF } else { b }]);
            }
        }
        off += p.len();
    }
}

/// ICRC of an IPv4 RoCEv2 packet (`transport` = BTH .. pad, no ICRC).
pub fn icrc_ipv4(ip: &Ipv4Fields, src_port: u16, dst_port: u16, transport: &[u8]) -> u32 {
    icrc_ipv4_parts(ip, src_port, dst_port, &[transport])
}

/// Check the ICRC of an IPv4 RoCEv2 UDP payload (`transport ++ ICRC`).
/// Returns the transport part (BTH .. pad) on success.
pub fn verify_ipv4<'a>(ip: &Ipv4Fields, src_port: u16, dst_port: u16, udp_payload: &'a [u8]) -> Option<&'a [u8]> {
    let n = udp_payload.len().checked_sub(ICRC_LEN)?;
    let (t, c) = udp_payload.split_at(n);
    let got = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    (icrc_ipv4(ip, src_port, dst_port, t) == got).then_some(t)
}

/// ICRC of a native InfiniBand packet (softroce's IB link layer,
/// docs/softroce-internals.md#infiniband-link-layer): `lrh` and `grh` as they will be sent,
/// `parts` = BTH .. pad (no ICRC, no VCRC).
///
/// ```text
/// //= IBTA Vol 1 §7.8.1 / docs/softroce-internals.md#infiniband-link-layer
/// //# Variant fields, replaced by ones: LRH.VL; GRH.TClass, GRH.FlowLabel, GRH.HopLmt;
/// //# BTH.Resv8a. A packet with a GRH may cross routers, which rewrite its LRH, so there
/// //# the whole LRH counts as ones (the 8 bytes of 0xFF RoCE keeps); an LRH-only packet
/// //# never leaves its subnet, and its LRH counts as sent, VL excepted.
/// ```
pub fn icrc_ib_parts(lrh: &[u8; 8], grh: Option<&[u8; 40]>, parts: &[&[u8]]) -> u32 {
    let mut crc = match grh {
        Some(g) => {
            let mut m = *g;
            m[0] |= 0x0F; // TClass, high nibble
            m[1] = 0xFF; // TClass low nibble, FlowLabel high nibble
            m[2] = 0xFF; // FlowLabel
            m[3] = 0xFF;
            m[7] = 0xFF; // HopLmt
            let mut c = Crc32::with_initial(AFTER_LRH_MASK);
            c.update(&m);
            c
        }
        None => {
            let mut m = *lrh;
            m[0] |= 0xF0; // VL
            let mut c = Crc32::new();
            c.update(&m);
            c
        }
    };
    feed_parts(&mut crc, parts);
    crc.finish()
}

/// ICRC of an IPv6 RoCEv2 packet (`transport` = BTH .. pad, no ICRC).
/// Traffic class, flow label and hop limit are masked.
pub fn icrc_ipv6_parts(src: &[u8; 16], dst: &[u8; 16], src_port: u16, dst_port: u16, parts: &[&[u8]]) -> u32 {
    let tlen: usize = parts.iter().map(|p| p.len()).sum();
    let udp_len = (8 + tlen + ICRC_LEN) as u16;
    let mut pseudo = [0xFFu8; 40 + 8];
    let h = &mut pseudo[0..40];
    h[0] = 0x6F; // version 6, traffic class + flow label masked
    h[1] = 0xFF;
    h[2] = 0xFF;
    h[3] = 0xFF;
    h[4..6].copy_from_slice(&udp_len.to_be_bytes()); // payload length
    h[6] = 17;
    h[7] = 0xFF; // hop limit masked
    h[8..24].copy_from_slice(src);
    h[24..40].copy_from_slice(dst);
    let u = &mut pseudo[40..48];
    u[0..2].copy_from_slice(&src_port.to_be_bytes());
    u[2..4].copy_from_slice(&dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6] = 0xFF;
    u[7] = 0xFF;
    let mut crc = Crc32::with_initial(AFTER_LRH_MASK);
    crc.update(&pseudo);
    feed_parts(&mut crc, parts);
    crc.finish()
}

/// Check the ICRC of an IPv6 RoCEv2 UDP payload; returns BTH .. pad on success.
pub fn verify_ipv6<'a>(
    src: &[u8; 16],
    dst: &[u8; 16],
    src_port: u16,
    dst_port: u16,
    udp_payload: &'a [u8],
) -> Option<&'a [u8]> {
    let n = udp_payload.len().checked_sub(ICRC_LEN)?;
    let (t, c) = udp_payload.split_at(n);
    let got = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    (icrc_ipv6_parts(src, dst, src_port, dst_port, &[t]) == got).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/softroce-internals.md#icrc: captured on `lo`, RDMA WRITE Only, QPN 0x11, PSN 0x123456.
    const FRAME: [u8; 76] = [
        0x45, 0x00, 0x00, 0x4c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x3c, 0x9f, 0x7f, 0x00, 0x00, 0x01, //
        0x7f, 0x00, 0x00, 0x01, 0xc0, 0x01, 0x12, 0xb7, 0x00, 0x38, 0xfe, 0x4b, 0x0a, 0x00, 0xff, 0xff, //
        0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, //
        0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x10, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, //
        0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50, 0x6f, 0x3b, 0x3c, 0x8f,
    ];

    fn ip() -> Ipv4Fields {
        Ipv4Fields::new([127, 0, 0, 1], [127, 0, 0, 1], 0)
    }

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // slicing path == bytewise path for every length/alignment
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..data.len() {
            let mut bytewise = SoftCrc32::new();
            for b in &data[..n] {
                bytewise.update(core::slice::from_ref(b));
            }
            let mut soft = SoftCrc32::new();
            soft.update(&data[..n]);
            assert_eq!(bytewise.finish(), crc32(&data[..n]));
            assert_eq!(soft.finish(), crc32(&data[..n]));
        }
    }

    #[test]
    fn preset_after_lrh_mask() {
        //= docs/softroce-internals.md#icrc
        //# start the raw register at 0xDEBB20E3 — verified: that is the register after 8×0xFF
        let mut c = SoftCrc32::new();
        c.update(&[0xFF; 8]);
        assert_eq!(c.reg, 0xDEBB_20E3);
        let mut f = Crc32::new();
        f.update(&[0xFF; 8]);
        assert_eq!(f.finish(), AFTER_LRH_MASK);
    }

    #[test]
    fn captured_frame_matches() {
        let transport = &FRAME[28..72];
        let icrc = icrc_ipv4(&ip(), 0xc001, 4791, transport);
        assert_eq!(icrc, 0x8f3c_3b6f);
        assert_eq!(icrc.to_le_bytes(), [0x6f, 0x3b, 0x3c, 0x8f]);
        assert_eq!(verify_ipv4(&ip(), 0xc001, 4791, &FRAME[28..]), Some(transport));
        // Split into header/payload pieces at every point: same CRC.
        for cut in 0..=transport.len() {
            assert_eq!(
                icrc_ipv4_parts(&ip(), 0xc001, 4791, &[&transport[..cut], &transport[cut..]]),
                icrc
            );
        }
    }

    #[test]
    fn matches_spec_crc_input() {
        // The 80-byte CRC input spelled out in docs/softroce-internals.md#icrc.
        let mut input = vec![0xFFu8; 8];
        input.extend_from_slice(&[0x45, 0xff, 0x00, 0x4c, 0x00, 0x00, 0x40, 0x00, 0xff, 0x11, 0xff, 0xff]);
        input.extend_from_slice(&[0x7f, 0, 0, 1, 0x7f, 0, 0, 1]);
        input.extend_from_slice(&[0xc0, 0x01, 0x12, 0xb7, 0x00, 0x38, 0xff, 0xff]);
        input.extend_from_slice(&[0x0a, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56]);
        input.extend_from_slice(&FRAME[40..72]);
        assert_eq!(input.len(), 80);
        assert_eq!(crc32(&input), 0x8f3c_3b6f);
    }

    #[test]
    fn masked_fields_do_not_matter_and_others_do() {
        let mut t = FRAME[28..72].to_vec();
        t[4] = 0xC0; // FECN/BECN
        assert_eq!(icrc_ipv4(&ip(), 0xc001, 4791, &t), 0x8f3c_3b6f);
        t[20] ^= 1; // payload bit flip
        assert_ne!(icrc_ipv4(&ip(), 0xc001, 4791, &t), 0x8f3c_3b6f);
        assert_ne!(
            icrc_ipv4(
                &Ipv4Fields::new([127, 0, 0, 1], [127, 0, 0, 1], 1),
                0xc001,
                4791,
                &FRAME[28..72]
            ),
            0x8f3c_3b6f
        );
        assert_ne!(icrc_ipv4(&ip(), 4791, 4791, &FRAME[28..72]), 0x8f3c_3b6f);
        for i in 0..FRAME.len() - 28 {
            for bit in 0..8 {
                let mut f = FRAME[28..].to_vec();
                f[i] ^= 1 << bit;
                let masked = i == 4; // BTH resv8a
                assert_eq!(
                    verify_ipv4(&ip(), 0xc001, 4791, &f).is_some(),
                    masked,
                    "byte {i} bit {bit}"
                );
            }
        }
        assert_eq!(verify_ipv4(&ip(), 0xc001, 4791, &[1, 2, 3]), None);
    }

    /// The IPv6 ICRC against its CRC input spelled out (IBTA Vol 1 Annex A17: 8 bytes of 1s for
    /// the LRH, the IPv6 header with TClass, FlowLabel and HopLimit as 1s, the UDP header with
    /// its checksum as 1s, the BTH with its reserved byte as 1s), not only against itself: the
    /// payload length and UDP length are 8 + 44 transport bytes + 4 (the ICRC) = 0x38.
    #[test]
    fn ipv6_matches_spec_crc_input() {
        let s = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let d = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let mut input = vec![0xFFu8; 8];
        input.extend_from_slice(&[0x6f, 0xff, 0xff, 0xff, 0x00, 0x38, 0x11, 0xff]);
        input.extend_from_slice(&s);
        input.extend_from_slice(&d);
        input.extend_from_slice(&[0xc0, 0x01, 0x12, 0xb7, 0x00, 0x38, 0xff, 0xff]);
        input.extend_from_slice(&[0x0a, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56]);
        input.extend_from_slice(&FRAME[40..72]);
        assert_eq!(input.len(), 8 + 40 + 8 + 44);
        assert_eq!(icrc_ipv6_parts(&s, &d, 0xc001, 4791, &[&FRAME[28..72]]), crc32(&input));
    }

    #[test]
    fn ipv6_round_trip() {
        let s = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let d = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let t = &FRAME[28..72];
        let c = icrc_ipv6_parts(&s, &d, 0xc001, 4791, &[t]);
        let mut dg = t.to_vec();
        dg.extend_from_slice(&c.to_le_bytes());
        assert_eq!(verify_ipv6(&s, &d, 0xc001, 4791, &dg), Some(t));
        assert_eq!(verify_ipv6(&d, &s, 0xc001, 4791, &dg), None);
    }

    /// The captured WRITE Only (docs/softroce-internals.md#icrc) as a native IB packet: LRH VL 0,
    /// SL 0, IBA local, DLID 0x1602, 14 words, SLID 0x1601, then the same BTH, RETH, payload.
    const LRH: [u8; 8] = [0x00, 0x02, 0x16, 0x02, 0x00, 0x0e, 0x16, 0x01];

    #[test]
    fn ib_local_covers_the_lrh_but_vl() {
        let t = &FRAME[28..72];
        // The CRC input spelled out: the LRH with VL as ones, the BTH with byte 4 as ones.
        let mut input = LRH.to_vec();
        input[0] = 0xF0;
        input.extend_from_slice(t);
        input[8 + 4] = 0xFF;
        let c = icrc_ib_parts(&LRH, None, &[t]);
        assert_eq!(c, crc32(&input));
        assert_eq!(c, 0x23e1_d42c);
        let mut l = LRH;
        l[0] = 0x70; // another VL: masked
        assert_eq!(icrc_ib_parts(&l, None, &[t]), c);
        for byte in 0..8 {
            for bit in 0..8 {
                if byte == 0 && bit >= 4 {
                    continue;
                }
                let mut l = LRH;
                l[byte] ^= 1 << bit;
                assert_ne!(icrc_ib_parts(&l, None, &[t]), c, "LRH byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn ib_global_masks_the_lrh_and_the_grh_variant_fields() {
        let t = &FRAME[28..72];
        let mut grh = [0u8; 40];
        grh[0] = 0x60;
        grh[4..6].copy_from_slice(&48u16.to_be_bytes());
        grh[6] = 0x1B;
        grh[7] = 64;
        grh[8] = 0xfe;
        grh[9] = 0x80;
        grh[24] = 0xfe;
        grh[25] = 0x80;
        grh[39] = 2;
        let mut input = vec![0xFFu8; 8];
        let mut g = grh;
        g[0] = 0x6F;
        g[1..4].fill(0xFF);
        g[7] = 0xFF;
        input.extend_from_slice(&g);
        input.extend_from_slice(t);
        input[48 + 4] = 0xFF;
        let c = icrc_ib_parts(&LRH, Some(&grh), &[t]);
        assert_eq!(c, crc32(&input));
        let other_lrh = [0x70, 0x33, 0x00, 0x07, 0x00, 0x18, 0x00, 0x09];
        let mut variant = grh;
        variant[0] = 0x6A; // TClass
        variant[1] = 0x51; // TClass, flow label
        variant[3] = 0x45;
        variant[7] = 1; // HopLmt
        assert_eq!(icrc_ib_parts(&other_lrh, Some(&variant), &[t]), c);
        let mut dgid = grh;
        dgid[39] = 3;
        assert_ne!(icrc_ib_parts(&LRH, Some(&dgid), &[t]), c);
        let mut paylen = grh;
        paylen[5] = 49;
        assert_ne!(icrc_ib_parts(&LRH, Some(&paylen), &[t]), c);
    }
}
