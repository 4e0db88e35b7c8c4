//! The handshake records describing this side of a connection
//! (docs/nccl-net-abi.md#connection-setup: its member devices, its QPs, its buffer's address
//! and keys) and the checks of the peer's record against ours.

use super::devices::LocalDev;
use super::qps::Probe;
use crate::device::LinkLayer;
use crate::error::{Error, Result};
use crate::transport::proto::handshake::{
    self, DevRepr, EndpointRepr, LinkLayer as WireLinkLayer, QpRepr, FLAG_STANDBY,
};

fn wire_ll(l: LinkLayer) -> WireLinkLayer {
    match l {
        LinkLayer::InfiniBand => WireLinkLayer::InfiniBand,
        LinkLayer::Ethernet => WireLinkLayer::Ethernet,
    }
}

#[allow(clippy::too_many_arguments)]
/// This side's handshake record. `rkeys[d]` is the rkey of the buffer at `addr` on device d;
/// `qps` as [`qp_list`] makes it. Each member's GID is the one it uses now
/// ([`NetDevice::gid_now`](crate::device::NetDevice::gid_now)); `Err` when one has none.
pub fn endpoint(
    devs: &[LocalDev],
    qps: Vec<QpRepr>,
    nonce: u64,
    tc: u8,
    sl: u8,
    flags: u8,
    addr: u64,
    rkeys: &[u32],
) -> Result<EndpointRepr> {
    let gids = devs.iter().map(|d| d.dev.gid_now()).collect::<Result<Vec<_>>>()?;
    Ok(EndpointRepr {
        nonce,
        tc,
        sl,
        flags,
        addr,
        devs: devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (gid_index, gid) = gids[i];
                let mut r = DevRepr {
                    gid,
                    lid: d.dev.lid,
                    port: d.dev.port,
                    link_layer: wire_ll(d.dev.link_layer),
                    mtu: d.dev.active_mtu.clamp(1, 5) as u8,
                    gid_index: gid_index.clamp(0, 255) as u8,
                    rkey: rkeys.get(i).copied().unwrap_or(0),
                    name: [0; handshake::NAME_BYTES],
                };
                r.set_name(&d.dev.name);
                r
            })
            .collect(),
        qps,
        eager: handshake::EagerOffer::default(),
        link: handshake::LinkOffer::default(),
    })
}

/// The QP list of a handshake record: the data QPs (number and member, in QP order), then the
/// probe QPs (active-standby).
pub fn qp_list(data: impl Iterator<Item = (u32, usize)>, probes: &[Probe]) -> Vec<QpRepr> {
    let data = data.map(|(qpn, dev)| QpRepr { qpn, dev: dev as u8 });
    let probes = probes.iter().map(|p| QpRepr {
        qpn: p.qp.qpn(),
        dev: p.dev as u8,
    });
    data.chain(probes).collect()
}

/// Check the peer's record against ours (`sender`: we are the connecting, sending end): both in
/// active-standby or neither (`standby`, with as many probes), every QP paired, link layers
/// equal.
pub fn check_peer(devs: &[LocalDev], nqps: usize, standby: bool, peer: &EndpointRepr, sender: bool) -> Result<()> {
    check_mode(devs.len(), nqps, standby, peer)?;
    check_link_layer(&devs[0].dev.label(), wire_ll(devs[0].dev.link_layer), peer, sender)
}

fn link_layer_name(l: WireLinkLayer) -> String {
    match l {
        WireLinkLayer::InfiniBand => "InfiniBand".into(),
        WireLinkLayer::Ethernet => "RoCE".into(),
        WireLinkLayer::Unknown(x) => format!("link layer {x}"),
    }
}

/// Every member of the peer's device on our link layer (`ours`, of our first member `local`;
/// `sender`: we connect): an InfiniBand port and a RoCE port never talk, so the connection is
/// refused, a usage error (ncclInvalidUsage) that names both link layers, each end by its role
/// (the line also reaches the other end, in the refusal), and what to change.
fn check_link_layer(local: &str, ours: WireLinkLayer, peer: &EndpointRepr, sender: bool) -> Result<()> {
    let Some(d) = peer.devs.iter().find(|d| d.link_layer != ours) else {
        return Ok(());
    };
    let (we, they) = if sender {
        ("sender", "receiver")
    } else {
        ("receiver", "sender")
    };
    Err(Error::usage(format!(
        "link layer mismatch: the {we}'s {local} is {}, the {they}'s {}:{} is {}: InfiniBand and RoCE ports cannot talk to each other — select ports of one link layer on both ends (NCCL_IB_HCA)",
        link_layer_name(ours),
        d.name_str(),
        d.port,
        link_layer_name(d.link_layer)
    )))
}

/// Both ends in active-standby or neither, with as many members, and as many data QPs.
fn check_mode(ndevs: usize, nqps: usize, standby: bool, peer: &EndpointRepr) -> Result<()> {
    let peer_standby = peer.flags & FLAG_STANDBY != 0;
    if peer_standby != standby {
        let (yes, no) = if standby {
            ("this side", "the peer")
        } else {
            ("the peer", "this side")
        };
        return Err(Error::remote(format!(
            "{yes} runs its fused device active-standby and {no} does not: set FERROCE_ACTIVE_STANDBY (and NCCL_IB_RESILIENCY_PORT_FAILOVER) alike on both ends, with fused devices on both"
        )));
    }
    if standby && peer.devs.len() != ndevs {
        return Err(Error::remote(format!(
            "active-standby needs fused devices of as many members on both ends (each standby is probed against the peer's member of the same index): the peer has {}, this side {}",
            peer.devs.len(),
            ndevs
        )));
    }
    if peer.data_qp_count() != nqps {
        return Err(Error::remote(format!(
            "the peer has {} QPs for this connection, this side {nqps}: are NCCL_IB_QPS_PER_CONNECTION and the fused devices the same on both ends?",
            peer.data_qp_count()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's record of `ndevs` members, `nqps` data QPs and, with `standby`, its probes.
    fn record(ndevs: usize, nqps: usize, standby: bool) -> EndpointRepr {
        let dev = DevRepr {
            gid: [0; 16],
            lid: 0,
            port: 1,
            link_layer: WireLinkLayer::Ethernet,
            mtu: 3,
            gid_index: 0,
            rkey: 1,
            name: [0; handshake::NAME_BYTES],
        };
        let mut dev = dev;
        dev.set_name("mlx5_0");
        let probes = if standby { ndevs - 1 } else { 0 };
        EndpointRepr {
            nonce: 0,
            tc: 0,
            sl: 0,
            flags: if standby { FLAG_STANDBY } else { 0 },
            addr: 0,
            devs: vec![dev; ndevs],
            qps: (0..nqps + probes)
                .map(|i| QpRepr {
                    qpn: 0x10 + i as u32,
                    dev: if i < nqps { 0 } else { (i - nqps + 1) as u8 },
                })
                .collect(),
            eager: handshake::EagerOffer::default(),
            link: handshake::LinkOffer::default(),
        }
    }

    #[test]
    fn a_peer_on_the_other_link_layer_is_refused_naming_both() {
        let roce = record(2, 2, false);
        assert!(check_link_layer("softroce0:1", WireLinkLayer::Ethernet, &roce, false).is_ok());
        let e = check_link_layer("softroce0:1", WireLinkLayer::InfiniBand, &roce, false).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert_eq!(e.result_code(), crate::error::code::INVALID_USAGE);
        assert!(
            e.message.starts_with(
                "link layer mismatch: the receiver's softroce0:1 is InfiniBand, the sender's mlx5_0:1 is RoCE: "
            ),
            "{}",
            e.message
        );
        assert!(e.message.ends_with("(NCCL_IB_HCA)"), "{}", e.message);
        // One member of a fused peer device on the other link layer is enough.
        let mut mixed = record(2, 2, false);
        mixed.devs[1].link_layer = WireLinkLayer::InfiniBand;
        let e = check_link_layer("mlx5_0:1", WireLinkLayer::InfiniBand, &mixed, true).unwrap_err();
        assert!(
            e.message
                .contains("the sender's mlx5_0:1 is InfiniBand, the receiver's mlx5_0:1 is RoCE"),
            "{}",
            e.message
        );
    }

    #[test]
    fn both_ends_must_agree_on_active_standby() {
        let msg = |r: Result<()>| r.err().map(|e| e.message).unwrap_or_default();
        assert!(check_mode(2, 1, true, &record(2, 1, true)).is_ok());
        assert!(check_mode(2, 2, false, &record(2, 2, false)).is_ok());
        assert!(msg(check_mode(2, 1, true, &record(2, 2, false)))
            .contains("this side runs its fused device active-standby and the peer does not"));
        assert!(msg(check_mode(2, 2, false, &record(2, 1, true)))
            .contains("the peer runs its fused device active-standby and this side does not"));
        assert!(msg(check_mode(2, 1, true, &record(3, 1, true))).contains("as many members on both ends"));
        // The probes do not count as data QPs.
        assert!(msg(check_mode(3, 2, true, &record(3, 1, true)))
            .contains("the peer has 1 QPs for this connection, this side 2"));
    }
}
