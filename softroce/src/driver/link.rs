//! The port's link layer: RoCE (the default) or InfiniBand (`SOFTROCE_LINK_LAYER=ib`), the
//! subnet-manager stand-in that gives an IB port its LID, and the IB packets' framing on the
//! UDP carriage (docs/softroce-internals.md#infiniband-link-layer).
//!
//! An IB packet is `LRH | [GRH] | BTH .. pad | ICRC | VCRC`, sent as the payload of a UDP
//! datagram between the devices' addresses on port 4791: an emulation of an IB link between
//! softroce processes, not a wire any other NIC speaks. The LID of a port is the low 16 bits
//! of its IPv4 address (when that is a unicast LID), so every process derives every other
//! port's LID, and the address that owns a DLID, without talking: the subnet is the /16 of
//! the device's address.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config;
use crate::wire::{grh, icrc, lrh, vcrc, BthPacket, GrhPacket, GrhRepr, Lnh, LrhPacket, LrhRepr};

/// The link layer of the device's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// RoCEv2 over UDP/IPv4 (`IBV_LINK_LAYER_ETHERNET`).
    Ethernet,
    /// InfiniBand packets carried over UDP (`IBV_LINK_LAYER_INFINIBAND`).
    Infiniband,
}

/// The link-layer settings of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkConfig {
    pub layer: LinkLayer,
    /// A subnet manager runs (`SOFTROCE_SM`, default on): without one an IB port stays in INIT
    /// with LID 0, as a real port does.
    pub sm: bool,
    /// A router serves the subnet (`SOFTROCE_IB_ROUTER`): an IB port's GID 1 carries its FLID.
    pub router: bool,
}

/// The link-layer settings of device `index`: its entry of `SOFTROCE_LINK_LAYER` (the last entry
/// for a device past the list), `SOFTROCE_SM` and `SOFTROCE_IB_ROUTER` (declared, parsed and
/// checked in `config`).
pub fn link_config(index: usize) -> LinkConfig {
    let layers = config::link_ib();
    LinkConfig {
        layer: if layers.get(index).or(layers.last()).copied().unwrap_or(false) {
            LinkLayer::Infiniband
        } else {
            LinkLayer::Ethernet
        },
        sm: config::subnet_manager(),
        router: config::ib_router(),
    }
}

/// The LID the subnet-manager stand-in holds: no address maps to it.
pub const SM_LID: u16 = lrh::MAX_UNICAST_LID;

/// The LID the subnet manager assigns to the port bound to `a`: the low 16 bits of the
/// address, when they are a unicast LID other than the SM's (`None`: the port gets none).
pub fn lid_for(a: Ipv4Addr) -> Option<u16> {
    let o = a.octets();
    let lid = u16::from_be_bytes([o[2], o[3]]);
    (lid != 0 && lid < SM_LID).then_some(lid)
}

/// The address that owns `dlid` in the subnet (the /16) of `local`; `None` for a LID no port
/// can hold (0, the SM's, multicast), whose packets are lost.
pub fn addr_for_lid(local: Ipv4Addr, dlid: u16) -> Option<Ipv4Addr> {
    if dlid == 0 || dlid >= SM_LID {
        return None;
    }
    let o = local.octets();
    let [hi, lo] = dlid.to_be_bytes();
    Some(Ipv4Addr::new(o[0], o[1], hi, lo))
}

/// Received IB-mode packets dropped before reaching a QP, by reason (`softroce-ctl ADDR
/// status` shows them).
#[derive(Debug, Default)]
pub struct LinkDrops {
    /// A packet of the other link layer (a RoCE packet on an IB port, or the reverse).
    pub other_link_layer: AtomicU64,
    /// A bad VCRC, LRH or GRH (length, version, next header).
    pub malformed: AtomicU64,
    /// A DLID (or GRH DGID) that is not this port's, or a port without a LID.
    pub not_ours: AtomicU64,
}

impl LinkDrops {
    pub fn count(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn describe(&self) -> String {
        format!(
            "dropped: other link layer {}, malformed {}, not ours {}",
            self.other_link_layer.load(Ordering::Relaxed),
            self.malformed.load(Ordering::Relaxed),
            self.not_ours.load(Ordering::Relaxed)
        )
    }
}

/// The IB headers of one packet to send, built by [`ib_headers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbHeaders {
    pub bytes: [u8; lrh::HEADER_LEN + grh::HEADER_LEN],
    /// LRH only (8) or LRH and GRH (48).
    pub len: usize,
}

/// What an IB port puts before a transport packet of `transport_len` bytes (BTH .. pad): the
/// LRH (VL 0, the AV's SL and DLID, our SLID) and, for a global AV, a GRH from `sgid` to `dgid`.
#[allow(clippy::too_many_arguments)]
pub fn ib_headers(
    slid: u16,
    dlid: u16,
    sl: u8,
    global: Option<(&[u8; 16], &[u8; 16])>,
    traffic_class: u8,
    flow_label: u32,
    hop_limit: u8,
    transport_len: usize,
) -> IbHeaders {
    let mut bytes = [0u8; lrh::HEADER_LEN + grh::HEADER_LEN];
    let glen = if global.is_some() { grh::HEADER_LEN } else { 0 };
    let len = lrh::HEADER_LEN + glen;
    let words = (len + transport_len + icrc::ICRC_LEN) / 4;
    LrhRepr {
        vl: 0,
        sl,
        lnh: if global.is_some() {
            Lnh::IbaGlobal
        } else {
            Lnh::IbaLocal
        },
        dlid,
        pkt_len: words as u16,
        slid,
    }
    .emit(&mut LrhPacket::new_unchecked(&mut bytes[..lrh::HEADER_LEN]));
    if let Some((sgid, dgid)) = global {
        GrhRepr {
            traffic_class,
            flow_label,
            payload_len: (transport_len + icrc::ICRC_LEN) as u16,
            next_header: grh::NXT_HDR_BTH,
            hop_limit: if hop_limit == 0 { 64 } else { hop_limit },
            sgid: *sgid,
            dgid: *dgid,
        }
        .emit(&mut GrhPacket::new_unchecked(&mut bytes[lrh::HEADER_LEN..len]));
    }
    IbHeaders { bytes, len }
}

/// ICRC and VCRC of the IB packet `hdr ++ transport`, in wire order (6 bytes).
pub fn ib_trailer(hdr: &IbHeaders, transport: &[u8]) -> [u8; icrc::ICRC_LEN + vcrc::VCRC_LEN] {
    let mut l = [0u8; lrh::HEADER_LEN];
    l.copy_from_slice(&hdr.bytes[..lrh::HEADER_LEN]);
    let mut g = [0u8; grh::HEADER_LEN];
    let global = (hdr.len > lrh::HEADER_LEN).then(|| {
        g.copy_from_slice(&hdr.bytes[lrh::HEADER_LEN..hdr.len]);
        &g
    });
    let ic = icrc::icrc_ib_parts(&l, global, &[transport]).to_le_bytes();
    let mut crc = vcrc::Crc16::new();
    crc.update(&hdr.bytes[..hdr.len]);
    crc.update(transport);
    crc.update(&ic);
    let vc = crc.finish().to_le_bytes();
    [ic[0], ic[1], ic[2], ic[3], vc[0], vc[1]]
}

/// Why a received datagram segment was not handed to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IbDrop {
    /// Not an IB packet of ours (bad VCRC, LRH or GRH).
    Malformed,
    /// Valid, but for another DLID or DGID (or this port has no LID).
    NotOurs,
    /// The ICRC does not match.
    BadIcrc,
}

/// Whether `pkt` is a well-formed IB packet: its LRH length and VCRC agree (a RoCE packet
/// almost never does: the VCRC alone passes one in 65536).
/// The LRH is checked first, so a RoCE packet rarely costs a VCRC.
pub fn looks_like_ib(pkt: &[u8]) -> bool {
    let Ok(l) = LrhPacket::new_checked(pkt) else {
        return false;
    };
    LrhRepr::parse(&l).is_ok_and(|r| usize::from(r.pkt_len) * 4 + vcrc::VCRC_LEN == pkt.len())
        && vcrc::verify(pkt).is_some()
}

/// Checks a received IB packet for the port `lid` with GIDs `gids` (VCRC, LRH, GRH, DLID, then
/// the ICRC when `check_icrc`) and returns its transport part (BTH .. pad).
pub fn ib_receive(
    pkt: &[u8],
    lid: u16,
    is_our_gid: impl Fn(&[u8; 16]) -> bool,
    check_icrc: bool,
) -> Result<&[u8], IbDrop> {
    let body = vcrc::verify(pkt).ok_or(IbDrop::Malformed)?;
    let lp = LrhPacket::new_checked(body).map_err(|_| IbDrop::Malformed)?;
    let l = LrhRepr::parse(&lp).map_err(|_| IbDrop::Malformed)?;
    if usize::from(l.pkt_len) * 4 != body.len() || body.len() < lrh::HEADER_LEN + icrc::ICRC_LEN {
        return Err(IbDrop::Malformed);
    }
    let (hlen, grh_bytes) = match l.lnh {
        Lnh::IbaLocal => (lrh::HEADER_LEN, None),
        Lnh::IbaGlobal => {
            let gp = GrhPacket::new_checked(&body[lrh::HEADER_LEN..]).map_err(|_| IbDrop::Malformed)?;
            let g = GrhRepr::parse(&gp).map_err(|_| IbDrop::Malformed)?;
            let after = body.len() - lrh::HEADER_LEN - grh::HEADER_LEN;
            if g.next_header != grh::NXT_HDR_BTH || usize::from(g.payload_len) != after {
                return Err(IbDrop::Malformed);
            }
            if !is_our_gid(&g.dgid) {
                return Err(IbDrop::NotOurs);
            }
            (lrh::HEADER_LEN + grh::HEADER_LEN, Some(g))
        }
        _ => return Err(IbDrop::Malformed),
    };
    if lid == 0 || l.dlid != lid {
        return Err(IbDrop::NotOurs);
    }
    let n = body.len() - icrc::ICRC_LEN;
    if n < hlen + crate::wire::bth::HEADER_LEN {
        return Err(IbDrop::Malformed);
    }
    let transport = &body[hlen..n];
    if BthPacket::new_checked(transport).is_err() {
        return Err(IbDrop::Malformed);
    }
    if check_icrc {
        let mut lb = [0u8; lrh::HEADER_LEN];
        lb.copy_from_slice(&body[..lrh::HEADER_LEN]);
        let mut gb = [0u8; grh::HEADER_LEN];
        let global = grh_bytes.map(|_| {
            gb.copy_from_slice(&body[lrh::HEADER_LEN..hlen]);
            &gb
        });
        let c = &body[n..];
        if icrc::icrc_ib_parts(&lb, global, &[transport]) != u32::from_le_bytes([c[0], c[1], c[2], c[3]]) {
            return Err(IbDrop::BadIcrc);
        }
    }
    Ok(transport)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lids_map_to_addresses_and_back() {
        let a = Ipv4Addr::new(127, 0, 22, 1);
        assert_eq!(lid_for(a), Some(0x1601));
        assert_eq!(addr_for_lid(Ipv4Addr::new(127, 0, 22, 2), 0x1601), Some(a));
        assert_eq!(lid_for(Ipv4Addr::new(10, 0, 0, 0)), None);
        assert_eq!(lid_for(Ipv4Addr::new(10, 0, 0xbf, 0xff)), None, "the SM's LID");
        assert_eq!(lid_for(Ipv4Addr::new(10, 0, 0xc0, 1)), None, "multicast range");
        assert_eq!(addr_for_lid(a, 0), None);
        assert_eq!(addr_for_lid(a, SM_LID), None);
        assert_eq!(addr_for_lid(a, 0xC001), None);
    }

    fn packet(global: bool) -> (Vec<u8>, Vec<u8>, [u8; 16]) {
        let transport: Vec<u8> = vec![0x0a, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x12, 0x34, 0x56, 1, 2, 3, 4];
        let dgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x53, 0x7f, 0xff, 0xfe, 0, 0x16, 2];
        let sgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x53, 0x7f, 0xff, 0xfe, 0, 0x16, 1];
        let h = ib_headers(
            0x1601,
            0x1602,
            5,
            global.then_some((&sgid, &dgid)),
            0,
            0,
            0,
            transport.len(),
        );
        let mut p = h.bytes[..h.len].to_vec();
        p.extend_from_slice(&transport);
        p.extend_from_slice(&ib_trailer(&h, &transport));
        (p, transport, dgid)
    }

    #[test]
    fn a_sent_packet_is_received_and_checked() {
        for global in [false, true] {
            let (p, t, dgid) = packet(global);
            assert!(looks_like_ib(&p));
            let ours = |g: &[u8; 16]| *g == dgid;
            assert_eq!(ib_receive(&p, 0x1602, ours, true), Ok(&t[..]));
            assert_eq!(ib_receive(&p, 0x1603, ours, true), Err(IbDrop::NotOurs));
            assert_eq!(ib_receive(&p, 0, ours, true), Err(IbDrop::NotOurs));
            if global {
                assert_eq!(ib_receive(&p, 0x1602, |_| false, true), Err(IbDrop::NotOurs));
            }
            // Any bit flip fails the VCRC.
            for i in 0..p.len() {
                let mut q = p.clone();
                q[i] ^= 0x10;
                assert_eq!(ib_receive(&q, 0x1602, ours, true), Err(IbDrop::Malformed), "byte {i}");
            }
        }
        // A RoCE packet (BTH .. ICRC) is not IB.
        let (_, t, _) = packet(false);
        let mut roce = t.clone();
        roce.extend_from_slice(&[0x6f, 0x3b, 0x3c, 0x8f]);
        assert!(!looks_like_ib(&roce));
        assert_eq!(ib_receive(&roce, 0x1602, |_| true, true), Err(IbDrop::Malformed));
    }

    #[test]
    fn lrh_fields_of_a_local_packet() {
        let (p, t, _) = packet(false);
        // LRH: VL 0, SL 5, IBA local, DLID 0x1602, (8 + 16 + 4) / 4 = 7 words, SLID 0x1601.
        assert_eq!(&p[..8], &[0x00, 0x52, 0x16, 0x02, 0x00, 0x07, 0x16, 0x01]);
        assert_eq!(p.len(), 8 + t.len() + 4 + 2);
    }
}
