//! The member devices of a connection as it uses them ([`LocalDev`]: the device, the CQ its
//! QPs share, the event counts the comm started from) and buffers registered on every member
//! ([`RegBuf`]).

use crate::device::NetDevice;
use crate::error::Result;
use crate::ibv::mr::MemoryRegion;
use crate::ibv::CompletionQueue;
use crate::memory::AlignedBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

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
    /// `fatal_generation` when [`Conn::fatal_event`](super::Conn::fatal_event) last looked (the data path compares it
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

pub(super) fn cq_entries(qps: usize, cqe_per_qp: usize, extra: usize) -> i32 {
    (qps * cqe_per_qp + extra).min(i32::MAX as usize) as i32
}

/// `IBV_EVENT_PORT_ERR`s seen so far on the port `dev` uses.
pub(super) fn port_errors(dev: &NetDevice) -> u32 {
    dev.context
        .port_errors
        .get(usize::from(dev.port))
        .map_or(0, |c| c.load(Ordering::Acquire))
}

/// `IBV_EVENT_PORT_ACTIVE`s seen so far on the port `dev` uses.
pub(super) fn port_actives(dev: &NetDevice) -> u32 {
    dev.context
        .port_actives
        .get(usize::from(dev.port))
        .map_or(0, |c| c.load(Ordering::Acquire))
}

/// Whether `ibv_query_port` says the port `dev` uses is ACTIVE now.
pub(super) fn port_is_active(dev: &NetDevice) -> bool {
    dev.context
        .query_port(dev.port)
        .is_ok_and(|p| p.state == crate::device::PORT_ACTIVE)
}
