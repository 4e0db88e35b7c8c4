//! Active-standby's probes (FERROCE_ACTIVE_STANDBY): while a comm is in use, each standby
//! member's probe QP carries one signalled zero-length RDMA WRITE every [`PROBE_WRITE_EVERY`]. A
//! probe that fails (retries exceeded: the standby's path or port does not answer) marks its
//! member as not answering, so that a failover passes it over, until the member's wait (1 s
//! doubling to 60 s, as for a broken data path) is over and a recovery gives it a new probe
//! QP ([`Conn::member_back`](crate::transport::conn::Conn::member_back)).

use crate::ibv::sys;
use crate::transport::datapath::driver::{to_ibv, Driver};
use crate::transport::proto::plan::{Op, Remote, WorkRequest};
use std::time::{Duration, Instant};

/// Time between two probe writes on a standby's QP (after the last one completed).
pub(crate) const PROBE_WRITE_EVERY: Duration = Duration::from_secs(1);

impl Driver {
    /// Take the probes' completions and post the writes that are due. The caller skips it
    /// while a recovery is pending or a side-channel message waits: the QPs, probes included,
    /// may then be going away, and a probe failing says nothing about the path.
    pub(crate) fn probe_standbys(&mut self, now: Instant) {
        let mut failed: Vec<(usize, String)> = Vec::new();
        let Driver { conn, wcs, .. } = self;
        let nqps = conn.qps.len();
        for (j, p) in conn.probes.iter_mut().enumerate() {
            if p.failed {
                continue;
            }
            let verbs = conn.devs[p.dev].dev.verbs();
            if p.in_flight {
                let got = match p.cq.poll(wcs) {
                    Ok(got) => got,
                    Err(e) => {
                        p.failed = true;
                        failed.push((p.dev, e.message));
                        continue;
                    }
                };
                for wc in got {
                    p.in_flight = false;
                    match wc.result() {
                        Ok(_) => p.next_at = now + PROBE_WRITE_EVERY,
                        Err(f) => {
                            p.failed = true;
                            failed.push((
                                p.dev,
                                format!("its probe write failed: {}", verbs.wc_status_str(f.status)),
                            ));
                        }
                    }
                }
            } else if now >= p.next_at {
                // The peer's probe of the same index, and its buffer's key on that member:
                // a zero-length write touches no memory, yet names a valid registration.
                let Some(remote) = conn.peer.qps.get(nqps + j) else {
                    continue;
                };
                let rkey = conn.peer.devs.get(usize::from(remote.dev)).map_or(0, |d| d.rkey);
                let plan = WorkRequest {
                    remote: Remote {
                        addr: conn.peer.addr,
                        rkey,
                    },
                    signaled: true,
                    op: Op::Write,
                    local: None,
                    ..WorkRequest::EMPTY
                };
                // SAFETY: ibv_send_wr and ibv_sge are plain data; zero is an empty value.
                let (mut wr, mut sges): (sys::ibv_send_wr, [sys::ibv_sge; 2]) =
                    unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
                to_ibv(&plan, &mut wr, &mut sges);
                // SAFETY: one WR with no SGE (it names no local memory), valid for the call.
                match unsafe { p.qp.post_send(&mut wr) } {
                    Ok(()) => p.in_flight = true,
                    Err(e) => {
                        p.failed = true;
                        failed.push((p.dev, format!("its probe write could not be posted: {}", e.message)));
                    }
                }
            }
        }
        for (dev, why) in failed {
            self.conn.note_path_failure(dev);
            let d = &self.conn.devs[dev];
            let again = d.path_retry_at.map_or(String::new(), |t| {
                format!(
                    "; it is probed again in {:.1} s",
                    t.saturating_duration_since(now).as_secs_f64()
                )
            });
            crate::log_warn!(
                "{} comm with {}: standby member {} of the fused device does not answer ({why}): check its port (ibv_devinfo) and its path to the peer; a failover passes it over while another member answers{again}",
                self.kind,
                self.conn.chan.peer(),
                d.dev.label()
            );
        }
    }
}
