//! What both ends of a connection share: member devices with their CQs, the RC QPs and how
//! they pair with the peer's, internally registered buffers, QP bring-up (spec §8.7) and the
//! handshake records describing this side (spec §8.5).

use super::proto::handshake::{self, DevRepr, EndpointRepr, LinkLayer as WireLinkLayer, QpRepr};
use super::proto::plan::QpRoute;
use super::proto::{fifo, limits, request};
use super::sidechannel::Channel;
use crate::config::{self, Config};
use crate::device::{LinkLayer, NetDevice, VirtualDevice};
use crate::error::{Error, Result};
use crate::ibv::mr::MemoryRegion;
use crate::ibv::qp::{ModifyRetry, QpCaps, RtrAttrs};
use crate::ibv::{CompletionQueue, QueuePair};
use crate::memory::AlignedBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first wait before a member whose path stopped answering is tried again; it doubles
/// with each failure of that member, up to [`PATH_RETRY_MAX`].
const PATH_RETRY_FIRST: Duration = Duration::from_secs(1);
const PATH_RETRY_MAX: Duration = Duration::from_secs(60);

/// Inline bytes requested when NCCL_IB_USE_INLINE=1 (one CTS entry).
const INLINE_BYTES: u32 = fifo::ENTRY_BYTES as u32;

// The flush loopback QPs of a receive comm (spec §8.9; recv.rs makes them).
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

/// Traffic class and service level of the data QPs (spec §8.5 step 7).
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

/// Member devices with a CQ of `cqe_per_qp × (QPs on that device) + extra` entries.
pub fn local_devs(members: &[Arc<NetDevice>], nqps: usize, cqe_per_qp: usize, extra: usize) -> Result<Vec<LocalDev>> {
    let nl = members.len();
    members
        .iter()
        .enumerate()
        .map(|(d, dev)| {
            let qps_here = (d..nqps).step_by(nl).count();
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

/// QP i of `nqps` on local device i mod ndevs: how a connection starts.
fn striped(ndevs: usize, nqps: usize) -> Vec<usize> {
    (0..nqps).map(|i| i % ndevs.max(1)).collect()
}

/// Create `nqps` RC QPs striped over the local devices (QP i on device i mod ndevs), in INIT.
pub fn create_qps(devs: &[LocalDev], nqps: usize, caps: QpCaps, access: u32, cfg: &Config) -> Result<Vec<QueuePair>> {
    create_placed_qps(devs, &striped(devs.len(), nqps), caps, access, cfg)
}

/// Create RC QPs in INIT, QP i on local device `placement[i]`.
fn create_placed_qps(
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
/// This side's handshake record. `rkeys[d]` is the rkey of the buffer at `addr` on device d.
pub fn endpoint(
    devs: &[LocalDev],
    qps: &[QueuePair],
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
        qps: qps
            .iter()
            .enumerate()
            .map(|(i, q)| QpRepr {
                qpn: q.qpn(),
                dev: (i % devs.len().max(1)) as u8,
            })
            .collect(),
    }
}

/// Check the peer's record against ours: every QP paired, link layers equal.
pub fn check_peer(devs: &[LocalDev], nqps: usize, peer: &EndpointRepr) -> Result<()> {
    if peer.qps.len() != nqps {
        return Err(Error::remote(format!(
            "the peer has {} QPs for this connection, this side {nqps}: are NCCL_IB_QPS_PER_CONNECTION and the fused devices the same on both ends?",
            peer.qps.len()
        )));
    }
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

/// RTR + RTS of QP i against the peer's QP i.
pub fn bring_up(
    devs: &[LocalDev],
    qps: Vec<QueuePair>,
    peer: &EndpointRepr,
    tc: u8,
    sl: u8,
    cfg: &Config,
) -> Result<Vec<ConnQp>> {
    let mut out = Vec::with_capacity(qps.len());
    for (i, qp) in qps.into_iter().enumerate() {
        let dev = i % devs.len();
        let remote_dev = connect_qp(&devs[dev].dev, &qp, i, peer, tc, sl, cfg)?;
        out.push(ConnQp { qp, dev, remote_dev });
    }
    Ok(out)
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
}

/// Everything a live connection holds besides its data-path buffers. Field order is drop
/// order: QPs are destroyed before the CQs and before the caller's registered buffers.
pub struct Conn {
    pub qps: Vec<ConnQp>,
    pub devs: Vec<LocalDev>,
    pub peer: EndpointRepr,
    pub chan: Channel,
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
        remote
    }

    /// New QPs in INIT, made like the destroyed ones (a recovery), after their CQs were
    /// drained. A fused device's QPs go to the members whose ports are up
    /// (NCCL_IB_RESILIENCY_PORT_FAILOVER; striped as at the start once all are up again).
    pub fn create_qps_again(&mut self, remote: Vec<usize>) -> Result<()> {
        let placement = self.placement(remote.len());
        self.fit_cqs(&placement)?;
        let qps = create_placed_qps(&self.devs, &placement, self.spec.caps, self.spec.access, config::get())?;
        self.qps = qps
            .into_iter()
            .zip(placement)
            .zip(remote)
            .map(|((qp, dev), remote_dev)| ConnQp { qp, dev, remote_dev })
            .collect();
        Ok(())
    }

    /// Where a recovery puts the connection's `nqps` QPs: striped over the members whose
    /// ports are up (all of them when none is, so that the attempt fails and is retried). A
    /// member left out is marked failed over, with its port's `port_actives` then.
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
        let answering: Vec<usize> = (0..self.devs.len())
            .filter(|&i| up[i] && self.devs[i].path_retry_at.is_none())
            .collect();
        let chosen = if !answering.is_empty() {
            answering
        } else {
            (0..self.devs.len()).filter(|&i| up[i]).collect()
        };
        for (i, d) in self.devs.iter_mut().enumerate() {
            d.failed_over = (!chosen.is_empty() && !chosen.contains(&i)).then_some(actives[i]);
        }
        if chosen.is_empty() {
            return striped(self.devs.len(), nqps);
        }
        (0..nqps).map(|i| chosen[i % chosen.len()]).collect()
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
    pub fn member_back(&self) -> Option<(String, &'static str)> {
        let now = Instant::now();
        self.devs.iter().find_map(|d| {
            let base = d.failed_over?;
            let why = match d.path_retry_at {
                Some(t) if now >= t => "the wait after its path stopped answering is over",
                Some(_) => return None,
                None if port_actives(&d.dev) != base => "its port is up again (IBV_EVENT_PORT_ACTIVE)",
                None => return None,
            };
            port_is_active(&d.dev).then(|| (d.dev.label(), why))
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

    /// Our new QPs and member devices as a recovery's Hello tells the peer.
    pub fn qps_record(&self) -> EndpointRepr {
        let mut e = endpoint(&self.devs, &[], 0, self.spec.tc, self.spec.sl, 0, 0, &[]);
        e.qps = self
            .qps
            .iter()
            .map(|q| handshake::QpRepr {
                qpn: q.qp.qpn(),
                dev: q.dev as u8,
            })
            .collect();
        e
    }

    /// Connect our (new) QPs to the peer's new ones (its Hello's record); the peer's record
    /// takes its new QP numbers and device addresses (its buffers and keys are unchanged).
    pub fn connect_new_qps(&mut self, peer: &EndpointRepr) -> Result<()> {
        if peer.qps.len() != self.qps.len() || peer.devs.len() != self.peer.devs.len() {
            return Err(Error::remote(format!(
                "the peer's recovery names {} QPs on {} devices; the connection has {} on {}",
                peer.qps.len(),
                peer.devs.len(),
                self.qps.len(),
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
        Ok(())
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
            // A member the QPs left (its port was down) holds none of ours: its port going
            // down again changes nothing.
            let port_down = port_errors(&d.dev) != d.port_error_base && d.failed_over.is_none();
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
