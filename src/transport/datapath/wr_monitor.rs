//! The work-request latency monitor of a comm (`NCCL_IB_WQE_LATENCY_THRESHOLD_NS`,
//! `NCCL_IB_WQE_LATENCY_REPORT`): the driver's side of [`WrLatency`]. It stamps each signaled
//! send work request at its post and its completion, records the time in the QP's statistics
//! (p50/p90/p99/p99.9 in the statistics file and the close summary), and WARNs for the first slow
//! request of a QP and for every request that has waited past the threshold with no completion,
//! naming both ends of the QP.
//!
//! Off (both variables unset, the default) a comm has no monitor: the data path tests one
//! `Option` per post and per completion and reads no clock for it ([`clock_reads`] counts the
//! monitor's reads for the tests).

use crate::transport::clock;
use crate::transport::conn::Conn;
use crate::transport::proto::plan::WorkRequest;
use crate::transport::proto::time::Time;
use crate::transport::proto::wr_latency::{Done, Stall, WrLatency};
use crate::transport::stats::CommStats;
use std::sync::atomic::{AtomicU64, Ordering};

static CLOCK_READS: AtomicU64 = AtomicU64::new(0);

/// Clock reads the latency monitors of the process made so far.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub fn clock_reads() -> u64 {
    CLOCK_READS.load(Ordering::Relaxed)
}

/// The monitor's one clock read.
fn stamp() -> Time {
    CLOCK_READS.fetch_add(1, Ordering::Relaxed);
    clock::now()
}

/// One comm's monitor.
pub(crate) struct WrMonitor {
    track: WrLatency,
    threshold_ns: u64,
}

/// A monitor for a comm with `qps` QPs, when the variables ask for one.
pub(crate) fn for_comm(qps: usize) -> Option<Box<WrMonitor>> {
    let cfg = crate::config::get();
    let threshold_ns = cfg.wqe_latency_threshold_ns;
    (cfg.wqe_latency_report || threshold_ns > 0).then(|| {
        Box::new(WrMonitor {
            track: WrLatency::new(threshold_ns, qps),
            threshold_ns,
        })
    })
}

impl WrMonitor {
    /// A chain about to be posted on QP `qp`: its signaled requests start their clocks.
    pub(crate) fn posted(&mut self, qp: usize, chain: &[WorkRequest]) {
        let mut now = None;
        for w in chain.iter().filter(|w| w.signaled) {
            let t = *now.get_or_insert_with(stamp);
            self.track.posted(qp, w.wr_id, t);
        }
    }

    /// A completion of request `wr_id` on the comm's QP `qp` (`None`: of a replaced QP); `now` is
    /// read at most once per poll (shared by its completions).
    pub(crate) fn completed(
        &mut self,
        conn: &Conn,
        qp: Option<usize>,
        wr_id: u64,
        now: &mut Option<Time>,
        stats: Option<&CommStats>,
        kind: &str,
    ) {
        let Some(qp) = qp.filter(|&q| self.track.tracks(q, wr_id)) else {
            return;
        };
        let t = *now.get_or_insert_with(stamp);
        let Some(Done {
            ns, slow, first_slow, ..
        }) = self.track.completed(qp, wr_id, t)
        else {
            return;
        };
        if let Some(q) = stats.and_then(|s| s.qps.get(qp)) {
            q.wr_latency.record(ns);
            if slow {
                q.slow_wrs.fetch_add(1, Ordering::Relaxed);
            }
        }
        if first_slow {
            crate::log_warn!(
                "{kind} comm with {}: work request {wr_id:#x} on {} completed {} us after its post (NCCL_IB_WQE_LATENCY_THRESHOLD_NS={}); later slow ones on this QP are counted in the statistics, not logged",
                conn.chan.peer(),
                ends(conn, qp),
                ns / 1000,
                self.threshold_ns
            );
        }
    }

    /// Every request waiting past the threshold with no completion: a WARN each (once).
    pub(crate) fn check_stalls(&mut self, conn: &Conn, stats: Option<&CommStats>, kind: &str) {
        for Stall { qp, wr_id, waited_ns } in self.track.stalls(stamp()) {
            if let Some(q) = stats.and_then(|s| s.qps.get(qp)) {
                q.stalled_wrs.fetch_add(1, Ordering::Relaxed);
            }
            crate::log_warn!(
                "{kind} comm with {}: work request {wr_id:#x} on {} has had no completion for {} ms (NCCL_IB_WQE_LATENCY_THRESHOLD_NS={}): the peer or the path is not acknowledging",
                conn.chan.peer(),
                ends(conn, qp),
                waited_ns / 1_000_000,
                self.threshold_ns
            );
        }
    }

    /// A recovery replaced the QPs.
    pub(crate) fn reset(&mut self) {
        self.track.reset();
    }
}

/// Both ends of the comm's QP `qp`: `QP 0x1a (softroce0:1 GID ::ffff:10.0.0.1) -> QP 0x2b (GID
/// ::ffff:10.0.0.2)`, with LIDs instead of GIDs on InfiniBand.
fn ends(conn: &Conn, qp: usize) -> String {
    let Some(q) = conn.qps.get(qp) else {
        return format!("QP index {qp}");
    };
    let Some(local) = conn.devs.get(q.dev).map(|d| &d.dev) else {
        return format!("QP {:#x}", q.qp.qpn());
    };
    let ib = local.link_layer == crate::device::LinkLayer::InfiniBand;
    let addr = |gid: &[u8; 16], lid: u16| {
        if ib {
            format!("LID {lid:#x}")
        } else {
            format!("GID {}", crate::device::format_gid(gid))
        }
    };
    let local_gid = local.gid_now().map_or(local.gid, |g| g.1);
    let remote = match (conn.peer.qps.get(qp), conn.peer.devs.get(q.remote_dev)) {
        (Some(rq), Some(rd)) => format!("QP {:#x} ({})", rq.qpn, addr(&rd.gid, rd.lid)),
        _ => "the peer's QP (unknown)".to_string(),
    };
    format!(
        "QP {:#x} ({} {}) -> {remote}",
        q.qp.qpn(),
        local.label(),
        addr(&local_gid, local.lid)
    )
}
