//! A connection's verbs resources, what both ends build and hold: its member devices with
//! their CQs ([`devices`]), its RC QPs and their bring-up (docs/nccl-net-abi.md#qp-attributes,
//! [`qps`]), the handshake records describing this side (docs/nccl-net-abi.md#connection-setup,
//! [`records`]), which members a recovery puts the QPs on ([`failover`]), and the fatal async
//! events that end it ([`fatal_events`]). [`Conn`] is what a live connection holds.

pub mod devices;
pub mod failover;
pub mod fatal_events;
pub mod qps;
pub mod records;

// The items' paths before they moved into this folder's files (setup, the data path, the
// recovery and the integration tests use them).
pub use devices::{local_devs, LocalDev, RegBuf};
pub use failover::initial_placement;
pub use fatal_events::FatalKind;
pub use qps::{bring_up, create_probes, create_qps, modify_retry, tc_sl, ConnQp, Probe, QpSpec};
pub use records::{check_peer, endpoint, qp_list};

use crate::config;
use crate::device::VirtualDevice;
use crate::error::{Error, Result};
use crate::ibv::CompletionQueue;
use crate::transport::proto::handshake::{EndpointRepr, FLAG_STANDBY};
use crate::transport::proto::plan::QpRoute;
use crate::transport::proto::{fifo, limits, request};
use crate::transport::sidechannel::shared_link::SideChannel;
use devices::cq_entries;
use qps::{connect_probes, connect_qp};
use std::time::Duration;

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

    /// Our new QPs (data, then probes) and member devices as a recovery's Hello tells the peer.
    pub fn qps_record(&self) -> Result<EndpointRepr> {
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

    /// The P_Key index of each local QP, in QP order, as the device reports it.
    pub fn qp_pkey_indices(&self) -> Result<Vec<u16>> {
        self.qps.iter().map(|q| q.qp.pkey_index()).collect()
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
}
