//! What both ends of a connection share: member devices with their CQs, the RC QPs and how
//! they pair with the peer's, internally registered buffers, QP bring-up (spec §8.7) and the
//! handshake records describing this side (spec §8.5).

use super::proto::handshake::{self, DevRepr, EndpointRepr, LinkLayer as WireLinkLayer, QpRepr};
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
use std::time::Duration;

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

/// Access of the buffers the peer writes or reads (CTS FIFO, completion records).
pub fn remote_access() -> u32 {
    use crate::ibv::sys::ibv_access_flags as A;
    A::IBV_ACCESS_LOCAL_WRITE.0 | A::IBV_ACCESS_REMOTE_WRITE.0 | A::IBV_ACCESS_REMOTE_READ.0
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
    pub fn new(devs: &[LocalDev], len: usize, access: u32) -> Result<RegBuf> {
        let buf = AlignedBuf::new(len)?;
        let mut mrs = Vec::with_capacity(devs.len());
        for d in devs {
            // SAFETY: `buf` is owned by the same RegBuf and outlives the MRs (dropped after them).
            mrs.push(unsafe { MemoryRegion::register(d.dev.pd.clone(), buf.addr(), buf.len(), access)? });
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
            let cqe = (qps_here * cqe_per_qp + extra).min(i32::MAX as usize) as i32;
            let ctx = &dev.context;
            // The generation first: an event racing with the bases below is looked at again.
            let seen_generation = ctx.fatal_generation.load(Ordering::Acquire);
            Ok(LocalDev {
                dev: dev.clone(),
                cq: CompletionQueue::new(ctx.clone(), cqe)?,
                fatal_base: ctx.fatal_events.load(Ordering::Acquire),
                port_error_base: port_errors(dev),
                qp_failure_base: ctx.qp_failures.count.load(Ordering::Acquire),
                cq_failure_base: ctx.cq_failures.count.load(Ordering::Acquire),
                seen_generation,
            })
        })
        .collect()
}

/// Create `nqps` RC QPs striped over the local devices (QP i on device i mod ndevs), in INIT.
pub fn create_qps(devs: &[LocalDev], nqps: usize, caps: QpCaps, access: u32, cfg: &Config) -> Result<Vec<QueuePair>> {
    (0..nqps)
        .map(|i| {
            let d = &devs[i % devs.len()];
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
                dev: (i % devs.len()) as u8,
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
        let ldev = i % devs.len();
        let l = &devs[ldev].dev;
        let rq = peer.qps[i];
        let r = &peer.devs[rq.dev as usize];
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
        out.push(ConnQp {
            qp,
            dev: ldev,
            remote_dev: rq.dev as usize,
        });
    }
    Ok(out)
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

    /// The local QP numbers, in QP order.
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.qps.iter().map(|q| q.qp.qpn()).collect()
    }

    /// The device index and paired peer device of the QP with this number (for WARNs).
    pub fn qp_by_num(&self, qpn: u32) -> Option<&ConnQp> {
        self.qps.iter().find(|q| q.qp.qpn() == qpn)
    }

    /// A fatal async event hit one of our devices or its port, one of our own QPs or our
    /// CQ since the comm was made. Another comm's QP or CQ failing on the same device does
    /// not fail this one.
    pub fn fatal_event(&self) -> Option<&LocalDev> {
        self.devs.iter().enumerate().find_map(|(i, d)| {
            let ctx = &d.dev.context;
            let device_failed =
                ctx.fatal_events.load(Ordering::Acquire) != d.fatal_base || port_errors(&d.dev) != d.port_error_base;
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
            (device_failed || own_qp_failed() || own_cq_failed()).then_some(d)
        })
    }

    /// The cheap check the data path makes on every call: whether any device of the comm had
    /// a fatal event since the last look (one load per member device); if so, the full
    /// [`Self::fatal_event`].
    pub fn new_fatal_event(&mut self) -> Option<&LocalDev> {
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
