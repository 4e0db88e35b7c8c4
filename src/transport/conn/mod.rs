//! What both ends of a connection share: member devices with their CQs, the RC QPs and how
//! they pair with the peer's, internally registered buffers, QP bring-up
//! (docs/nccl-net-abi.md#qp-attributes) and the
//! handshake records describing this side (docs/nccl-net-abi.md#connection-setup).

use crate::config::{self, Config};
use crate::device::{LinkLayer, NetDevice, VirtualDevice};
use crate::error::{Error, Result};
use crate::ibv::mr::MemoryRegion;
use crate::ibv::qp::{ModifyRetry, QpCaps, RtrAttrs};
use crate::ibv::{CompletionQueue, QueuePair};
use crate::memory::AlignedBuf;
use crate::transport::proto::handshake::{
    self, DevRepr, EndpointRepr, LinkLayer as WireLinkLayer, QpRepr, FLAG_STANDBY,
};
use crate::transport::proto::plan::QpRoute;
use crate::transport::proto::{fifo, limits, request};
use crate::transport::sidechannel::shared_link::SideChannel;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first wait before a member whose path stopped answering is tried again; it doubles
/// with each failure of that member, up to [`PATH_RETRY_MAX`].
const PATH_RETRY_FIRST: Duration = Duration::from_secs(1);
const PATH_RETRY_MAX: Duration = Duration::from_secs(60);

/// Inline bytes requested when NCCL_IB_USE_INLINE=1 (one CTS entry).
const INLINE_BYTES: u32 = fifo::ENTRY_BYTES as u32;

// The flush loopback QPs of a receive comm (docs/nccl-net-abi.md#flush; `datapath::recv` makes them).
/// Send WRs of a flush loopback QP (made by a comm's first iflush, one per local device): one
/// RDMA read per flush in flight (bound: ≤ request::FLUSHES_IN_FLIGHT, enforced by iflush,
/// which fails beyond; a read's WR is outstanding until its completion is polled, which
/// test() does before it reclaims the flush; a failed comm reclaims nothing and posts nothing).
pub const FLUSH_SEND_WR: u32 = request::FLUSHES_IN_FLIGHT as u32;
/// Entries of a flush QP's own CQ: one per outstanding read (≤ FLUSH_SEND_WR, also when the
/// QP fails and flushes them all); nothing else completes there.
pub const FLUSH_CQE: usize = request::FLUSHES_IN_FLIGHT;

/// Inline bytes of every QP of a comm (NCCL_IB_USE_INLINE).
pub fn inline_bytes() -> u32 {
    if config::get().use_inline {
        INLINE_BYTES
    } else {
        0
    }
}

/// How long either end waits for the other during setup (FERROCE_CONNECT_TIMEOUT_SEC).
pub fn setup_timeout() -> Duration {
    Duration::from_secs(config::get().connect_timeout_sec.max(1))
}

/// Access of the buffers the peer writes (CTS FIFO, CTS staging with the completion records).
/// The peer never reads them, so they are not remotely readable.
pub fn remote_access() -> u32 {
    use crate::ibv::sys::ibv_access_flags as A;
    A::IBV_ACCESS_LOCAL_WRITE.0 | A::IBV_ACCESS_REMOTE_WRITE.0
}

/// A comm spans 1..=MAX_DEVS member devices (the CTS entry has one rkey per member).
pub fn check_members(dev: &VirtualDevice) -> Result<()> {
    if dev.members.is_empty() || dev.members.len() > limits::MAX_DEVS {
        return Err(Error::internal(format!(
            "device {} has {} members",
            dev.name,
            dev.members.len()
        )));
    }
    Ok(())
}

/// A buffer registered on every member device. Field order matters: MRs go before memory.
pub struct RegBuf {
    pub mrs: Vec<MemoryRegion>,
    pub buf: AlignedBuf,
}

impl RegBuf {
    /// `len` bytes registered on every device: exactly `len`, not the whole pages allocated
    /// for them, so that a remotely writable block (the 4 KiB FIFO) ends where the NIC refuses
    /// the peer's writes also where pages are larger than the block (64 KiB on some arm64
    /// kernels).
    pub fn new(devs: &[LocalDev], len: usize, access: u32) -> Result<RegBuf> {
        let buf = AlignedBuf::new(len)?;
        let mut mrs = Vec::with_capacity(devs.len());
        for d in devs {
            // SAFETY: `buf` holds at least `len` bytes, is owned by the same RegBuf and outlives
            // the MRs (dropped after them).
            mrs.push(unsafe { MemoryRegion::register(d.dev.pd.clone(), buf.addr(), len.max(1), access)? });
        }
        Ok(RegBuf { mrs, buf })
    }

    pub fn addr(&self) -> usize {
        self.buf.addr()
    }
}

/// One member device as a comm uses it.
pub struct LocalDev {
    pub dev: Arc<NetDevice>,
    pub cq: Arc<CompletionQueue>,
    /// `fatal_events` of the context when the comm was made; more means the NIC failed.
    pub fatal_base: u32,
    /// `port_errors` of the comm's port when the comm was made; more means the port went down.
    pub port_error_base: u32,
    /// `qp_failures.count` when the comm was made; more means some QP of the device failed.
    pub qp_failure_base: u32,
    /// `cq_failures.count` when the comm was made; more means some CQ of the device overran.
    pub cq_failure_base: u32,
    /// `fatal_generation` when [`Conn::fatal_event`] last looked (the data path compares it
    /// on every test()).
    pub seen_generation: u32,
    /// How the CQ is sized: entries per QP it serves, plus `cq_extra`; `cq_qps` QPs fit.
    pub cqe_per_qp: usize,
    pub cq_extra: usize,
    pub cq_qps: usize,
    /// A recovery moved this member's QPs to the others (its port was down, or its path
    /// stopped answering): `port_actives` of its port then, so that the port coming back is
    /// noticed (failback).
    pub failed_over: Option<u32>,
    /// A QP of this member ran out of retries with its port up (a broken path): the
    /// recovery leaves it out while others answer, until this time (failback tries it again).
    pub path_retry_at: Option<Instant>,
    /// How often that happened: the wait before trying it again doubles each time.
    pub path_failures: u32,
}

/// What a fatal async event hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalKind {
    /// The whole NIC (device fatal).
    Device,
    /// The port went down: the connection's QPs fail, new ones work once it is back.
    Port,
    /// One of the connection's QPs (QP fatal, access error).
    Qp,
    /// The connection's CQ (overrun).
    Cq,
}

/// One QP of the connection and where its peer QP lives.
pub struct ConnQp {
    pub qp: QueuePair,
    /// Local member-device index.
    pub dev: usize,
    /// The peer's member-device index of the paired QP.
    pub remote_dev: usize,
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

/// `IBV_EVENT_PORT_ERR`s seen so far on the port `dev` uses.
fn port_errors(dev: &NetDevice) -> u32 {
    dev.context
        .port_errors
        .get(usize::from(dev.port))
        .map_or(0, |c| c.load(Ordering::Acquire))
}

/// Member devices with a CQ of `cqe_per_qp × (QPs `placement` puts on that device) + extra`
/// entries.
pub fn local_devs(
    members: &[Arc<NetDevice>],
    placement: &[usize],
    cqe_per_qp: usize,
    extra: usize,
) -> Result<Vec<LocalDev>> {
    members
        .iter()
        .enumerate()
        .map(|(d, dev)| {
            let qps_here = placement.iter().filter(|&&p| p == d).count();
            let ctx = &dev.context;
            // The generation first: an event racing with the bases below is looked at again.
            let seen_generation = ctx.fatal_generation.load(Ordering::Acquire);
            Ok(LocalDev {
                dev: dev.clone(),
                cq: CompletionQueue::new(ctx.clone(), cq_entries(qps_here, cqe_per_qp, extra))?,
                fatal_base: ctx.fatal_events.load(Ordering::Acquire),
                port_error_base: port_errors(dev),
                qp_failure_base: ctx.qp_failures.count.load(Ordering::Acquire),
                cq_failure_base: ctx.cq_failures.count.load(Ordering::Acquire),
                seen_generation,
                cqe_per_qp,
                cq_extra: extra,
                cq_qps: qps_here,
                failed_over: None,
                path_retry_at: None,
                path_failures: 0,
            })
        })
        .collect()
}

fn cq_entries(qps: usize, cqe_per_qp: usize, extra: usize) -> i32 {
    (qps * cqe_per_qp + extra).min(i32::MAX as usize) as i32
}

/// `IBV_EVENT_PORT_ACTIVE`s seen so far on the port `dev` uses.
fn port_actives(dev: &NetDevice) -> u32 {
    dev.context
        .port_actives
        .get(usize::from(dev.port))
        .map_or(0, |c| c.load(Ordering::Acquire))
}

/// Whether `ibv_query_port` says the port `dev` uses is ACTIVE now.
fn port_is_active(dev: &NetDevice) -> bool {
    dev.context
        .query_port(dev.port)
        .is_ok_and(|p| p.state == crate::device::PORT_ACTIVE)
}

/// QP i of `nqps` on local device i mod ndevs.
fn striped(ndevs: usize, nqps: usize) -> Vec<usize> {
    (0..nqps).map(|i| i % ndevs.max(1)).collect()
}

/// Where a connection's `nqps` QPs start: striped over the members, or, active-standby, all
/// on the first member whose port is ACTIVE (the first member when none is).
pub fn initial_placement(members: &[Arc<NetDevice>], nqps: usize) -> Vec<usize> {
    if !config::get().active_standby_for(members.len()) {
        return striped(members.len(), nqps);
    }
    let primary = members.iter().position(|m| port_is_active(m)).unwrap_or(0);
    vec![primary; nqps]
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
            qp.to_init(d.dev.port, cfg.pkey_index, access)?;
            Ok(qp)
        })
        .collect()
}

fn wire_ll(l: LinkLayer) -> WireLinkLayer {
    match l {
        LinkLayer::InfiniBand => WireLinkLayer::InfiniBand,
        LinkLayer::Ethernet => WireLinkLayer::Ethernet,
    }
}

#[allow(clippy::too_many_arguments)]
/// This side's handshake record. `rkeys[d]` is the rkey of the buffer at `addr` on device d;
/// `qps` as [`qp_list`] makes it.
pub fn endpoint(
    devs: &[LocalDev],
    qps: Vec<QpRepr>,
    nonce: u64,
    tc: u8,
    sl: u8,
    flags: u8,
    addr: u64,
    rkeys: &[u32],
) -> EndpointRepr {
    EndpointRepr {
        nonce,
        tc,
        sl,
        flags,
        addr,
        devs: devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut r = DevRepr {
                    gid: d.dev.gid,
                    lid: d.dev.lid,
                    port: d.dev.port,
                    link_layer: wire_ll(d.dev.link_layer),
                    mtu: d.dev.active_mtu.clamp(1, 5) as u8,
                    gid_index: d.dev.gid_index.clamp(0, 255) as u8,
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
    }
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
            qp.to_init(d.dev.port, cfg.pkey_index, access)?;
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

/// Check the peer's record against ours: both in active-standby or neither (`standby`, with
/// as many probes), every QP paired, link layers equal.
pub fn check_peer(devs: &[LocalDev], nqps: usize, standby: bool, peer: &EndpointRepr) -> Result<()> {
    check_mode(devs.len(), nqps, standby, peer)?;
    let ours = wire_ll(devs[0].dev.link_layer);
    if let Some(d) = peer.devs.iter().find(|d| d.link_layer != ours) {
        return Err(Error::remote(format!(
            "link layer mismatch: local {} is {:?}, peer {} is {:?} — RoCE and InfiniBand ports cannot talk to each other",
            devs[0].dev.name,
            ours,
            d.name_str(),
            d.link_layer
        )));
    }
    Ok(())
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
fn connect_probes(
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
fn connect_qp(
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
    let global = l.link_layer == LinkLayer::Ethernet || r.gid[..8] != l.gid[..8];
    qp.to_rtr(&RtrAttrs {
        path_mtu: l.active_mtu.clamp(1, 5).min(u32::from(r.mtu)),
        dest_qpn: rq.qpn,
        global,
        dgid: r.gid,
        sgid_index: l.gid_index.clamp(0, 255) as u8,
        traffic_class: tc,
        dlid: r.lid,
        sl,
        port_num: l.port,
    })?;
    qp.to_rts(cfg.timeout, cfg.retry_cnt)?;
    Ok(rq.dev as usize)
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

/// Everything a live connection holds besides its data-path buffers. Field order is drop
/// order: QPs are destroyed before the CQs and before the caller's registered buffers.
pub struct Conn {
    pub qps: Vec<ConnQp>,
    /// Active-standby: one probe QP per standby member (empty otherwise).
    pub probes: Vec<Probe>,
    pub devs: Vec<LocalDev>,
    pub peer: EndpointRepr,
    pub chan: SideChannel,
    /// QPs each message is spread over.
    pub qps_per_req: usize,
    pub spec: QpSpec,
}

impl Conn {
    /// The most bytes one RDMA WRITE of this connection carries: the smallest `max_msg_sz` of
    /// our member devices, at most [`limits::MAX_WR_BYTES`].
    pub fn wr_bytes(&self) -> usize {
        self.devs
            .iter()
            .map(|d| d.dev.max_msg_bytes)
            .min()
            .unwrap_or(0)
            .clamp(1, limits::MAX_WR_BYTES)
    }

    /// Destroy the QPs (what they held is gone without a completion); the peer's member
    /// device of each, for [`Self::create_qps_again`].
    pub fn destroy_qps(&mut self) -> Vec<usize> {
        let remote = self.qps.iter().map(|q| q.remote_dev).collect();
        self.qps.clear();
        self.probes.clear();
        remote
    }

    /// New QPs in INIT, made like the destroyed ones (a recovery), after their CQs were
    /// drained. A fused device's QPs go to the members whose ports are up
    /// (NCCL_IB_RESILIENCY_PORT_FAILOVER; striped as at the start once all are up again), or,
    /// active-standby, to the first of them, with new probes on the others.
    pub fn create_qps_again(&mut self, remote: Vec<usize>) -> Result<()> {
        let placement = self.placement(remote.len());
        self.fit_cqs(&placement)?;
        let cfg = config::get();
        let qps = create_qps(&self.devs, &placement, self.spec.caps, self.spec.access, cfg)?;
        self.probes = create_probes(&self.devs, self.spec.standby, cfg)?;
        self.qps = qps
            .into_iter()
            .zip(placement)
            .zip(remote)
            .map(|((qp, dev), remote_dev)| ConnQp { qp, dev, remote_dev })
            .collect();
        Ok(())
    }

    /// Where a recovery puts the connection's `nqps` QPs: striped over the members whose
    /// ports are up (all of them when none is, so that the attempt fails and is retried), or,
    /// active-standby, all on the first of them. A member left out that the QPs would
    /// otherwise use is marked failed over, with its port's `port_actives` then.
    fn placement(&mut self, nqps: usize) -> Vec<usize> {
        let failover = config::get().port_failover && self.devs.len() > 1;
        let now = Instant::now();
        // The counts first: a PORT_ACTIVE after the query is then a change.
        let actives: Vec<u32> = self.devs.iter().map(|d| port_actives(&d.dev)).collect();
        let up: Vec<bool> = self.devs.iter().map(|d| !failover || port_is_active(&d.dev)).collect();
        for (d, &up) in self.devs.iter_mut().zip(&up) {
            if !up || d.path_retry_at.is_some_and(|t| now >= t) {
                // A port that is down explains the failed retries; a wait that is over ends.
                d.path_retry_at = None;
            }
        }
        let answering: Vec<bool> = self.devs.iter().map(|d| d.path_retry_at.is_none()).collect();
        let chosen = choose_members(self.spec.standby, &up, &answering);
        for (i, d) in self.devs.iter_mut().enumerate() {
            d.failed_over = chosen.left_out.contains(&i).then_some(actives[i]);
        }
        if chosen.used.is_empty() {
            return striped(self.devs.len(), nqps);
        }
        (0..nqps).map(|i| chosen.used[i % chosen.used.len()]).collect()
    }

    /// A QP on member `dev` ran out of retries: on a fused device with failover, the member
    /// is left out of the next recovery while another answers, for a wait that doubles per
    /// failure.
    pub fn note_path_failure(&mut self, dev: usize) {
        if !config::get().port_failover || self.devs.len() < 2 || dev >= self.devs.len() {
            return;
        }
        let d = &mut self.devs[dev];
        if d.path_retry_at.is_some() {
            return;
        }
        let wait = PATH_RETRY_FIRST
            .saturating_mul(1u32 << d.path_failures.min(6))
            .min(PATH_RETRY_MAX);
        d.path_failures += 1;
        d.path_retry_at = Some(Instant::now() + wait);
    }

    /// A CQ that is to serve more QPs than it was sized for is replaced by a larger one (its
    /// QPs are destroyed and it is drained, so nothing refers to it any more).
    fn fit_cqs(&mut self, placement: &[usize]) -> Result<()> {
        for (i, d) in self.devs.iter_mut().enumerate() {
            let n = placement.iter().filter(|&&p| p == i).count();
            if n > d.cq_qps {
                d.cq = CompletionQueue::new(d.dev.context.clone(), cq_entries(n, d.cqe_per_qp, d.cq_extra))?;
                d.cq_qps = n;
            }
        }
        Ok(())
    }

    /// A member whose QPs a recovery moved to the others is to be used again: its port is up
    /// again (an `IBV_EVENT_PORT_ACTIVE` since, and ACTIVE now), or the wait after its path
    /// failed is over (and its port is ACTIVE). Its label, and why, so the QPs move back.
    ///
    /// Active-standby, a standby whose probe failed is probed again (over a new probe QP, which
    /// takes a recovery) once its wait is over. The cause in words, for the recovery's WARN.
    pub fn member_back(&self) -> Option<String> {
        let now = Instant::now();
        self.devs.iter().enumerate().find_map(|(i, d)| {
            let waited = d.path_retry_at.is_none_or(|t| now >= t);
            let cause = if let Some(base) = d.failed_over {
                let why = match d.path_retry_at {
                    Some(t) if now >= t => "the wait after its path stopped answering is over",
                    Some(_) => return None,
                    None if port_actives(&d.dev) != base => "its port is up again (IBV_EVENT_PORT_ACTIVE)",
                    None => return None,
                };
                format!(
                    "member {} of the fused device is to be used again: {why}; moving its QPs back to it (failback)",
                    d.dev.label()
                )
            } else if waited && self.probes.iter().any(|p| p.dev == i && p.failed) {
                format!(
                    "standby member {} of the fused device is to be probed again (the wait after its probe failed is over); making a new probe QP for it",
                    d.dev.label()
                )
            } else {
                return None;
            };
            port_is_active(&d.dev).then_some(cause)
        })
    }

    /// Labels of the members the connection's QPs left (their ports were down).
    pub fn failed_over_members(&self) -> Vec<String> {
        self.devs
            .iter()
            .filter(|d| d.failed_over.is_some())
            .map(|d| d.dev.label())
            .collect()
    }

    /// Our new QPs (data, then probes) and member devices as a recovery's Hello tells the peer.
    pub fn qps_record(&self) -> EndpointRepr {
        let list = qp_list(self.qps.iter().map(|q| (q.qp.qpn(), q.dev)), &self.probes);
        let flags = if self.spec.standby { FLAG_STANDBY } else { 0 };
        endpoint(&self.devs, list, 0, self.spec.tc, self.spec.sl, flags, 0, &[])
    }

    /// Connect our (new) QPs to the peer's new ones (its Hello's record); the peer's record
    /// takes its new QP numbers and device addresses (its buffers and keys are unchanged).
    pub fn connect_new_qps(&mut self, peer: &EndpointRepr) -> Result<()> {
        let ours = self.qps.len() + self.probes.len();
        if peer.qps.len() != ours || peer.devs.len() != self.peer.devs.len() {
            return Err(Error::remote(format!(
                "the peer's recovery names {} QPs on {} devices; the connection has {ours} on {}",
                peer.qps.len(),
                peer.devs.len(),
                self.peer.devs.len()
            )));
        }
        for (mine, theirs) in self.peer.devs.iter_mut().zip(&peer.devs) {
            let rkey = mine.rkey;
            *mine = *theirs;
            mine.rkey = rkey;
        }
        self.peer.qps = peer.qps.clone();
        let cfg = config::get();
        for i in 0..self.qps.len() {
            let remote_dev = connect_qp(
                &self.devs[self.qps[i].dev].dev,
                &self.qps[i].qp,
                i,
                &self.peer,
                self.spec.tc,
                self.spec.sl,
                cfg,
            )?;
            self.qps[i].remote_dev = remote_dev;
        }
        let Conn {
            devs,
            probes,
            peer,
            spec,
            qps,
            ..
        } = &*self;
        connect_probes(devs, probes, qps.len(), peer, spec.tc, spec.sl, cfg)
    }

    /// The local QP numbers, in QP order.
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.qps.iter().map(|q| q.qp.qpn()).collect()
    }

    /// The QP with this number on local member `dev` (QP numbers are per device: two
    /// members may each have a QP of the same number).
    pub fn qp_by_num(&self, dev: usize, qpn: u32) -> Option<&ConnQp> {
        self.qp_index(dev, qpn).map(|i| &self.qps[i])
    }

    /// The index in the connection of that QP.
    pub fn qp_index(&self, dev: usize, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| q.dev == dev && q.qp.qpn() == qpn)
    }

    /// Per QP of the connection: its local and remote member device (the cores' routes).
    pub fn routes(&self) -> Vec<QpRoute> {
        self.qps
            .iter()
            .map(|q| QpRoute {
                dev: q.dev,
                remote_dev: q.remote_dev,
            })
            .collect()
    }

    /// A fatal async event hit one of our devices or its port, one of our own QPs or our
    /// CQ since the comm was made (or, for a port, since [`Self::accept_port_errors`]).
    /// Another comm's QP or CQ failing on the same device does not fail this one.
    pub fn fatal_event(&self) -> Option<(&LocalDev, FatalKind)> {
        self.devs.iter().enumerate().find_map(|(i, d)| {
            let ctx = &d.dev.context;
            if ctx.fatal_events.load(Ordering::Acquire) != d.fatal_base {
                return Some((d, FatalKind::Device));
            }
            // A member that holds none of our data QPs (the QPs left it, or it stands by) loses
            // nothing when its port goes down (a standby's probe notices).
            let port_down = port_errors(&d.dev) != d.port_error_base && self.qps.iter().any(|q| q.dev == i);
            let own_qp_failed = || {
                ctx.qp_failures.any_of_since(
                    d.qp_failure_base,
                    self.qps.iter().filter(|q| q.dev == i).map(|q| u64::from(q.qp.qpn())),
                )
            };
            let own_cq_failed = || {
                ctx.cq_failures
                    .any_of_since(d.cq_failure_base, [d.cq.as_ptr() as usize as u64])
            };
            if own_cq_failed() {
                Some((d, FatalKind::Cq))
            } else if own_qp_failed() {
                Some((d, FatalKind::Qp))
            } else {
                port_down.then_some((d, FatalKind::Port))
            }
        })
    }

    /// A recovery took the port errors seen so far (and our old QPs' failures) into account:
    /// only later ones count.
    pub fn accept_port_errors(&mut self) {
        for d in &mut self.devs {
            d.port_error_base = port_errors(&d.dev);
            d.qp_failure_base = d.dev.context.qp_failures.count.load(Ordering::Acquire);
        }
    }

    /// The cheap check the data path makes on every call: whether any device of the comm had
    /// a fatal event since the last look (one load per member device); if so, the full
    /// [`Self::fatal_event`].
    pub fn new_fatal_event(&mut self) -> Option<(&LocalDev, FatalKind)> {
        let mut moved = false;
        for d in &mut self.devs {
            let g = d.dev.context.fatal_generation.load(Ordering::Acquire);
            if g != d.seen_generation {
                d.seen_generation = g;
                moved = true;
            }
        }
        if moved {
            self.fatal_event()
        } else {
            None
        }
    }
}

/// Which members a placement uses, and which of the others it marks failed over.
#[derive(Debug, PartialEq, Eq)]
struct Chosen {
    used: Vec<usize>,
    left_out: Vec<usize>,
}

/// The placement's decision from each member's state: `up` (its port is ACTIVE) and
/// `answering` (not left out after its path failed). Striped: every member up and answering
/// (else every one up), the rest failed over. Active-standby: the first such member; those
/// before it (preferred, but down or not answering) failed over, those after stand by. None up:
/// nothing used, nothing failed over (the attempt fails and is tried again).
fn choose_members(standby: bool, up: &[bool], answering: &[bool]) -> Chosen {
    let n = up.len();
    let healthy: Vec<usize> = (0..n).filter(|&i| up[i] && answering[i]).collect();
    let mut used = if healthy.is_empty() {
        (0..n).filter(|&i| up[i]).collect()
    } else {
        healthy
    };
    if standby {
        used.truncate(1);
    }
    let left_out = match used.first() {
        None => Vec::new(),
        Some(&first) if standby => (0..first).collect(),
        Some(_) => (0..n).filter(|i| !used.contains(i)).collect(),
    };
    Chosen { used, left_out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(used: &[usize], left_out: &[usize]) -> Chosen {
        Chosen {
            used: used.to_vec(),
            left_out: left_out.to_vec(),
        }
    }

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

    #[test]
    fn striping_uses_every_member_that_is_up_and_answers() {
        let all = [true, true, true];
        assert_eq!(choose_members(false, &all, &all), chosen(&[0, 1, 2], &[]));
        assert_eq!(choose_members(false, &[true, false, true], &all), chosen(&[0, 2], &[1]));
        assert_eq!(choose_members(false, &all, &[true, false, true]), chosen(&[0, 2], &[1]));
        // None answers: every member that is up, rather than none.
        assert_eq!(
            choose_members(false, &[true, true, false], &[false, false, true]),
            chosen(&[0, 1], &[2])
        );
        assert_eq!(choose_members(false, &[false, false], &[true, true]), chosen(&[], &[]));
    }

    #[test]
    fn active_standby_uses_the_first_healthy_member_and_keeps_the_rest_standing_by() {
        let all = [true, true, true];
        assert_eq!(choose_members(true, &all, &all), chosen(&[0], &[]));
        // The primary down: the first standby that answers; the primary is failed over (failback
        // when it is back), the standby after it still stands by.
        assert_eq!(choose_members(true, &[false, true, true], &all), chosen(&[1], &[0]));
        // The first standby's probe failed: the next one.
        assert_eq!(
            choose_members(true, &[false, true, true], &[true, false, true]),
            chosen(&[2], &[0, 1])
        );
        // Nobody answers: the first member that is up.
        assert_eq!(
            choose_members(true, &[false, true, true], &[false, false, false]),
            chosen(&[1], &[0])
        );
        assert_eq!(choose_members(true, &[false, false], &[true, true]), chosen(&[], &[]));
    }
}
