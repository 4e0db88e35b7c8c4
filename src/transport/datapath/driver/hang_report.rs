//! The hang report of a comm (docs/observability.md#hang-reports): one WARN per
//! FERROCE_HANG_WARN_SEC while nothing completes, with the facts the cause is decided from
//! (`proto::hang`).

use super::Driver;
use crate::transport::proto::hang::{self, QpEvents};
use std::time::{Duration, Instant};

impl Driver {
    /// The QPs' transport events summed, where the NIC counts them per QP.
    fn qp_events(&self) -> Option<QpEvents> {
        self.conn
            .qps
            .iter()
            .try_fold(QpEvents::default(), |sum, q| Some(sum.plus(q.qp.transport_events()?)))
    }

    /// The hang report: one WARN per FERROCE_HANG_WARN_SEC while nothing completes.
    /// `peer_closed`: the side channel says the peer's comm is gone.
    pub(super) fn check_hang(
        &mut self,
        now: Instant,
        peer_closed: bool,
        waiting_for: impl FnOnce(&hang::Facts) -> String,
    ) {
        let every = crate::config::get().hang_warn_sec;
        if every == 0 {
            return;
        }
        if self.idle_since.is_none() {
            self.wait_events = self.qp_events();
        }
        let since = *self.idle_since.get_or_insert(now);
        let interval = Duration::from_secs(every);
        let stuck = now.duration_since(since);
        if stuck < interval || self.hang_warned.is_some_and(|t| now.duration_since(t) < interval) {
            return;
        }
        self.hang_warned = Some(now);
        let facts = hang::Facts {
            peer_closed,
            qp: self.qp_events().zip(self.wait_events).map(|(e, w)| e.since(w)),
        };
        let c = &self.conn;
        let qps = c
            .qps
            .iter()
            .map(|q| format!("{:#x}", q.qp.qpn()))
            .collect::<Vec<_>>()
            .join(",");
        let devices = c.devs.iter().map(|d| d.dev.label()).collect::<Vec<_>>().join("+");
        crate::log_warn!(
            "{} comm with {} on {} (QPs {qps}) made no progress for {} s: waiting for {}; {} work requests posted, {} completions polled (FERROCE_HANG_WARN_SEC={every} sets this report)",
            self.kind,
            c.chan.peer(),
            devices,
            stuck.as_secs(),
            waiting_for(&facts),
            self.wrs_posted,
            self.completions,
        );
    }
}
