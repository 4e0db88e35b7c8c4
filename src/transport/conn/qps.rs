//! A connection's RC QPs: how they are made (in INIT, on the member a placement names) and
//! brought up against the peer's (RTR, RTS: docs/nccl-net-abi.md#qp-attributes), the probe QPs
//! of active-standby's standby members, and the settings every QP of a comm shares.

use super::devices::LocalDev;
use crate::config::{self, Config};
use crate::device::{IbRoute, LinkLayer, NetDevice};
use crate::error::{Error, Result};
use crate::ibv::qp::{ModifyRetry, QpCaps, RtrAttrs};
use crate::ibv::{CompletionQueue, QueuePair};
use crate::transport::proto::handshake::{DevRepr, EndpointRepr};
use std::sync::Arc;
use std::time::Instant;

/// One QP of the connection and where its peer QP lives.
pub struct ConnQp {
    pub qp: QueuePair,
    /// Local member-device index.
    pub dev: usize,
    /// The peer's member-device index of the paired QP.
    pub remote_dev: usize,
}

/// How the connection's QPs were made and connected: a recovery makes its new ones alike.
#[derive(Clone, Copy, Debug)]
pub struct QpSpec {
    pub caps: QpCaps,
    pub access: u32,
    /// Traffic class and service level of our QPs.
    pub tc: u8,
    pub sl: u8,
    /// Active-standby: the QPs go on one member, each other member has a probe QP.
    pub standby: bool,
}

/// Traffic class and service level of the data QPs (docs/nccl-net-abi.md#connection-setup).
pub fn tc_sl(cfg: &Config, comm_tc: i32) -> (u8, u8) {
    let pick = |v: i32| {
        if v >= 0 {
            v
        } else if comm_tc >= 0 {
            comm_tc
        } else {
            0
        }
    };
    ((pick(cfg.tc) & 0xff) as u8, (pick(cfg.sl) & 0xf) as u8)
}

pub fn modify_retry(cfg: &Config) -> ModifyRetry {
    ModifyRetry {
        count: cfg.mqp_retry_cnt,
        sleep_ms: cfg.mqp_retry_sleep_ms,
        all_errors: cfg.mqp_retry_all,
    }
}

/// Create RC QPs in INIT, QP i on local device `placement[i]`.
pub fn create_qps(
    devs: &[LocalDev],
    placement: &[usize],
    caps: QpCaps,
    access: u32,
    cfg: &Config,
) -> Result<Vec<QueuePair>> {
    placement
        .iter()
        .map(|&dev| {
            let d = &devs[dev];
            let qp = QueuePair::new_rc(d.dev.pd.clone(), d.cq.clone(), d.cq.clone(), caps, modify_retry(cfg))?;
            qp.to_init(d.dev.port, d.dev.pkey_index, access)?;
            Ok(qp)
        })
        .collect()
}

/// A standby member's probe QP (active-standby). It pairs with the peer's probe QP on the
/// member of the same index and carries one signalled zero-length RDMA WRITE every
/// [`PROBE_WRITE_EVERY`](crate::transport::recovery::standby::PROBE_WRITE_EVERY), so that a failover knows before it
/// needs the standby whether its path answers. Its own small CQ keeps its completions out of
/// the data path's.
pub struct Probe {
    /// First: destroyed before its CQ.
    pub qp: QueuePair,
    pub cq: Arc<CompletionQueue>,
    /// The local member it probes.
    pub dev: usize,
    /// A probe write is outstanding.
    pub in_flight: bool,
    /// When the next one is due.
    pub next_at: Instant,
    /// A probe write failed: the QP is in ERR, and the member does not answer until a recovery
    /// makes a new probe.
    pub failed: bool,
}

/// One probe QP, in INIT, on every member after the first (active-standby; none otherwise).
pub fn create_probes(devs: &[LocalDev], standby: bool, cfg: &Config) -> Result<Vec<Probe>> {
    if !standby {
        return Ok(Vec::new());
    }
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 0,
        max_inline_data: 0,
        max_send_sge: 1,
    };
    let access = crate::ibv::sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    (1..devs.len())
        .map(|dev| {
            let d = &devs[dev];
            // One write in flight, and its flush when the QP fails.
            let cq = CompletionQueue::new(d.dev.context.clone(), 2)?;
            let qp = QueuePair::new_rc(d.dev.pd.clone(), cq.clone(), cq.clone(), caps, modify_retry(cfg))?;
            qp.to_init(d.dev.port, d.dev.pkey_index, access)?;
            Ok(Probe {
                qp,
                cq,
                dev,
                in_flight: false,
                next_at: Instant::now(),
                failed: false,
            })
        })
        .collect()
}

/// RTR + RTS of data QP i (on member `placement[i]`) against the peer's QP i, and of probe j
/// against the peer's probe j.
pub fn bring_up(
    devs: &[LocalDev],
    qps: Vec<QueuePair>,
    placement: &[usize],
    probes: &[Probe],
    peer: &EndpointRepr,
    tc: u8,
    sl: u8,
) -> Result<Vec<ConnQp>> {
    let cfg = config::get();
    let nqps = qps.len();
    let mut out = Vec::with_capacity(nqps);
    for ((i, qp), &dev) in qps.into_iter().enumerate().zip(placement) {
        let remote_dev = connect_qp(&devs[dev].dev, &qp, i, peer, tc, sl, cfg)?;
        out.push(ConnQp { qp, dev, remote_dev });
    }
    connect_probes(devs, probes, nqps, peer, tc, sl, cfg)?;
    Ok(out)
}

/// RTR + RTS of each probe against the peer's probe of the same index (its list after the
/// `nqps` data QPs).
pub(super) fn connect_probes(
    devs: &[LocalDev],
    probes: &[Probe],
    nqps: usize,
    peer: &EndpointRepr,
    tc: u8,
    sl: u8,
    cfg: &Config,
) -> Result<()> {
    for (j, p) in probes.iter().enumerate() {
        connect_qp(&devs[p.dev].dev, &p.qp, nqps + j, peer, tc, sl, cfg)?;
    }
    Ok(())
}

/// RTR + RTS of `qp`, QP `i` of the connection on our device `l`, against the peer's QP `i`;
/// the peer's member device of that QP.
pub(super) fn connect_qp(
    l: &NetDevice,
    qp: &QueuePair,
    i: usize,
    peer: &EndpointRepr,
    tc: u8,
    sl: u8,
    cfg: &Config,
) -> Result<usize> {
    let Some(rq) = peer.qps.get(i).copied() else {
        return Err(Error::remote(format!("the peer names no QP {i} of the connection")));
    };
    let Some(r) = peer.devs.get(rq.dev as usize) else {
        return Err(Error::remote(format!(
            "the peer's QP {i} is on its device {}, of {}",
            rq.dev,
            peer.devs.len()
        )));
    };
    let route = peer_route(l, r);
    // The GID our record advertised (the port's current pick: it moves after a GID change).
    let (sgid_index, _) = l.gid_now()?;
    if route.flid_missing {
        crate::log_warn!(
            "{}: the peer's GID {} is on another subnet but carries no FLID: addressing its LID {:#x} with a GRH, which only a router that knows that LID forwards — check the fabric's FLID configuration (NCCL_IB_ROUTABLE_FLID_GID_INDEX)",
            l.label(),
            crate::device::format_gid(&r.gid),
            r.lid
        );
    }
    qp.to_rtr(&RtrAttrs {
        path_mtu: l.active_mtu.clamp(1, 5).min(u32::from(r.mtu)),
        dest_qpn: rq.qpn,
        global: route.global,
        dgid: r.gid,
        sgid_index: sgid_index.clamp(0, 255) as u8,
        traffic_class: tc,
        dlid: route.dlid,
        sl,
        port_num: l.port,
    })?;
    qp.to_rts(cfg.timeout, cfg.retry_cnt)?;
    Ok(rq.dev as usize)
}

/// How our device `l` addresses the peer's member device `r`: on RoCE always a GRH to its GID
/// (DLID unused); on InfiniBand by LID within a subnet, a GRH and the FLID across subnets
/// ([`ib_route`](crate::device::ib_route)).
pub(crate) fn peer_route(l: &NetDevice, r: &DevRepr) -> IbRoute {
    match l.link_layer {
        LinkLayer::Ethernet => IbRoute {
            global: true,
            dlid: r.lid,
            flid_missing: false,
        },
        LinkLayer::InfiniBand => crate::device::ib_route(&l.gid, &r.gid, r.lid),
    }
}

/// The connection INFO line's account of [`peer_route`]: `RoCE (GRH)`, or on InfiniBand
/// `InfiniBand LID 0x2c05 -> DLID 0x2c06, no GRH` (with a GRH across subnets).
pub(crate) fn describe_route(l: &NetDevice, r: &DevRepr) -> String {
    let route = peer_route(l, r);
    match l.link_layer {
        LinkLayer::Ethernet => "RoCE (GRH)".to_string(),
        LinkLayer::InfiniBand => format!(
            "InfiniBand LID {:#x} -> DLID {:#x}, {}",
            l.lid,
            route.dlid,
            if route.global { "GRH (another subnet)" } else { "no GRH" }
        ),
    }
}
