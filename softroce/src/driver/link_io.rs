//! What a port does in the engine beyond RoCE: an InfiniBand port sends by DLID and checks what
//! it receives, and either link layer drops (and counts) the other's packets
//! (docs/softroce-internals.md#infiniband-link-layer). The engine's loop calls these.

use std::net::SocketAddrV4;

use super::device::Device;
use super::link::{addr_for_lid, ib_headers, ib_receive, looks_like_ib, IbDrop, LinkLayer};
use super::qp::QpShared;
use super::tx::Tx;
use super::udp::MAX_GSO_SEGS;
use crate::proto;
use crate::wire::{icrc, ROCEV2_UDP_PORT};

/// What the receive path needs per packet, read once per batch.
pub(super) struct RxConfig {
    /// Verify the ICRC (`SOFTROCE_ICRC_CHECK`).
    pub check: bool,
    /// Say what was dropped (`SOFTROCE_DEBUG`).
    pub debug: bool,
}

/// The transport part (BTH .. pad) of packet `pkt`, segment `j` of a datagram from `src`
/// (`coalesced`: GRO merged several), after the checks of the port's link layer; None when it
/// was dropped (a bad RoCE ICRC counts in `bad_icrc`, the link layer's drops in `dev.link_drops`).
pub(super) fn checked_body<'a>(
    dev: &Device,
    pkt: &'a [u8],
    j: usize,
    coalesced: bool,
    src: SocketAddrV4,
    cfg: &RxConfig,
    bad_icrc: &mut u64,
) -> Option<&'a [u8]> {
    let roce_icrc = |id: u16| {
        let ip = icrc::Ipv4Fields::new(src.ip().octets(), dev.addr.octets(), id);
        icrc::verify_ipv4(&ip, src.port(), ROCEV2_UDP_PORT, pkt)
    };
    let body = if dev.link == LinkLayer::Infiniband {
        receive_ib(dev, pkt, src, cfg, &roce_icrc)?
    } else if cfg.check {
        // Segment j of a GSO send carries IP ID j; packets GRO
        // merged from separate sends carry 0.
        match roce_icrc(j as u16).or_else(|| if coalesced && j > 0 { roce_icrc(0) } else { None }) {
            Some(b) => b,
            None if looks_like_ib(pkt) => {
                // An InfiniBand port's packet: the link layers never talk.
                drop_link(dev, &dev.link_drops.other_link_layer, "an InfiniBand packet", src, cfg);
                return None;
            }
            None => {
                *bad_icrc += 1;
                if cfg.debug {
                    eprintln!("softroce: bad ICRC from {} ({} so far)", src, bad_icrc);
                }
                return None;
            }
        }
    } else if looks_like_ib(pkt) {
        drop_link(dev, &dev.link_drops.other_link_layer, "an InfiniBand packet", src, cfg);
        return None;
    } else {
        &pkt[..pkt.len() - icrc::ICRC_LEN]
    };
    Some(body)
}

/// Sends the transport packet in `tx.scratch[..len]` as an InfiniBand packet to the port that
/// owns the AV's DLID (docs/softroce-internals.md#infiniband-link-layer). A port without a
/// LID sends nothing, and a DLID no address can own loses the packet: the requester's retries
/// then end in `IBV_WC_RETRY_EXC_ERR`, as on a fabric with no such port.
pub(super) fn transmit_ib(dev: &Device, qp: &QpShared, meta: &proto::TransmitMeta, len: usize, tx: &mut Tx) {
    if !dev.ib_active() {
        return;
    }
    let Some(dst) = addr_for_lid(dev.addr, meta.dlid) else {
        return;
    };
    let sgid = dev.gid(usize::from(meta.sgid_index)).unwrap_or_default();
    let hdr = ib_headers(
        dev.lid,
        meta.dlid,
        meta.sl,
        meta.is_global.then_some((&sgid, &meta.dgid)),
        meta.traffic_class,
        meta.flow_label,
        meta.hop_limit,
        len,
    );
    qp.counters.packet_sent(len + icrc::ICRC_LEN, meta.is_response);
    tx.push_ib(&dev.sock, len, dst, &hdr);
}

/// An IB port's receive check (docs/softroce-internals.md#infiniband-link-layer): the
/// transport part of a packet for this port, or None when it was dropped (and counted). A
/// RoCE packet (its RoCE ICRC checks out, as sent with any GSO IP ID up to 64) is counted
/// as the other link layer's.
fn receive_ib<'a>(
    dev: &Device,
    pkt: &'a [u8],
    src: std::net::SocketAddrV4,
    cfg: &RxConfig,
    roce_icrc: &dyn Fn(u16) -> Option<&'a [u8]>,
) -> Option<&'a [u8]> {
    let d = &dev.link_drops;
    match ib_receive(pkt, dev.lid, |g| dev.gid_index_of(g).is_some(), cfg.check) {
        Ok(b) => Some(b),
        Err(IbDrop::Malformed) if (0..MAX_GSO_SEGS as u16).any(|id| roce_icrc(id).is_some()) => {
            drop_link(dev, &d.other_link_layer, "a RoCE packet", src, cfg);
            None
        }
        Err(IbDrop::Malformed) | Err(IbDrop::BadIcrc) => {
            drop_link(
                dev,
                &d.malformed,
                "a malformed IB packet (VCRC, LRH, GRH or ICRC)",
                src,
                cfg,
            );
            None
        }
        Err(IbDrop::NotOurs) => {
            drop_link(dev, &d.not_ours, "an IB packet for another DLID or DGID", src, cfg);
            None
        }
    }
}

/// Counts a packet the link layer dropped (and says so with `SOFTROCE_DEBUG=1`).
fn drop_link(
    dev: &Device,
    counter: &std::sync::atomic::AtomicU64,
    what: &str,
    src: impl std::fmt::Display,
    cfg: &RxConfig,
) {
    dev.link_drops.count(counter);
    if cfg.debug {
        eprintln!(
            "softroce: {} dropped {what} from {src}; {}",
            dev.name,
            dev.link_drops.describe()
        );
    }
}
