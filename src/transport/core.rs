//! Progress shared by both ends: poll every CQ of the comm, dispatch successful completions,
//! turn the first failed one into the comm's error (one WARN), and notice a dead peer or a
//! failed NIC when nothing completes.

use super::conn::Conn;
use super::errors::{wc_error, WcErrorReport};
use super::request::RequestPool;
use crate::error::{Error, Result};
use crate::ibv::cq::{Completed, Failed};
use crate::ibv::WorkCompletion;
use std::time::{Duration, Instant};

/// Completions taken per `ibv_poll_cq` call (NCCL takes 4; the loop goes on while a batch
/// comes back full). Each comm keeps this many `ibv_wc` (48 bytes each).
const POLL_BATCH: usize = 8;
/// Idle calls between two liveness probes (each probe reads the clock first).
const PROBE_EVERY: u32 = 64;
/// Minimum time between two probe syscalls.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);

pub struct Core {
    /// First field: dropped (QPs destroyed) before anything the QPs point into.
    pub conn: Conn,
    pub pool: RequestPool,
    /// Set at the first fatal error; every later call returns it (already logged).
    pub failed: Option<Error>,
    idle: u32,
    last_probe: Instant,
    wcs: [WorkCompletion; POLL_BATCH],
}

impl Core {
    pub fn new(conn: Conn, pool: RequestPool) -> Core {
        Core {
            conn,
            pool,
            failed: None,
            idle: 0,
            last_probe: Instant::now(),
            wcs: std::array::from_fn(|_| WorkCompletion::default()),
        }
    }

    /// The comm's error if it failed.
    pub fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Record `e` as the comm's fatal error and WARN it once; returns the (logged) error.
    pub fn fail(&mut self, e: Error) -> Error {
        if let Some(old) = &self.failed {
            return old.clone();
        }
        crate::log_warn!("{e}");
        let e = e.mark_logged();
        for r in self.pool.busy_mut() {
            r.set_failed();
        }
        self.failed = Some(e.clone());
        e
    }

    /// Poll every CQ until empty. `on_ok` gets each successful completion; `describe` names the
    /// operation and byte count of a `wr_id` for the error report. Returns whether anything
    /// completed.
    pub fn poll(
        &mut self,
        mut on_ok: impl FnMut(&mut RequestPool, u64, Completed),
        describe: impl Fn(&RequestPool, u64) -> (&'static str, usize),
    ) -> Result<bool> {
        self.check()?;
        let mut progressed = false;
        let mut error: Option<Error> = None;
        {
            let Core { conn, pool, wcs, .. } = self;
            'devs: for d in conn.devs.iter() {
                loop {
                    let got = match d.cq.poll(wcs) {
                        Ok(g) => g,
                        Err(e) => {
                            error = Some(e);
                            break 'devs;
                        }
                    };
                    if got.is_empty() {
                        break;
                    }
                    progressed = true;
                    let full = got.len() == POLL_BATCH;
                    for wc in got {
                        match wc.result() {
                            Ok(c) => on_ok(pool, wc.wr_id(), c),
                            Err(f) => {
                                let (op, bytes) = describe(pool, wc.wr_id());
                                error = Some(report(conn, &f, op, bytes));
                                if f.status == super::errors::status::WR_FLUSH_ERR {
                                    // A flushed WR is a consequence; look for the cause.
                                    error = Some(
                                        root_cause(conn, wcs, &describe, pool)
                                            .unwrap_or_else(|| error.take().expect("set above")),
                                    );
                                }
                                break 'devs;
                            }
                        }
                    }
                    if !full {
                        break;
                    }
                }
            }
        }
        if let Some(e) = error {
            return Err(self.fail(e));
        }
        if progressed {
            self.idle = 0;
        }
        Ok(progressed)
    }

    /// Called when a request is not done yet: every so often, check that no fatal NIC event
    /// happened and whether the peer's side channel is still open. Returns `Ok(true)` when
    /// the peer is gone; the caller polls once more (completions that raced with the peer's
    /// exit still count) and then calls [`Core::fail_peer_gone`].
    pub fn idle_probe(&mut self) -> Result<bool> {
        self.check()?;
        self.idle = self.idle.wrapping_add(1);
        if !self.idle.is_multiple_of(PROBE_EVERY) {
            return Ok(false);
        }
        let now = Instant::now();
        if now.duration_since(self.last_probe) < PROBE_INTERVAL {
            return Ok(false);
        }
        self.last_probe = now;
        if crate::config::get().return_async_events {
            if let Some(d) = self.conn.fatal_event() {
                let e = Error::system(format!(
                    "device {} reported a fatal asynchronous event for this connection or the whole NIC (see the WARN above); the connection to {} cannot continue",
                    d.dev.label(),
                    self.conn.chan.peer
                ));
                return Err(self.fail(e));
            }
        }
        Ok(self.conn.chan.peer_gone())
    }

    /// Fail the comm because the peer closed its side channel.
    pub fn fail_peer_gone(&mut self, what: &str) -> Error {
        let e = Error::remote(format!(
            "the peer {} closed the connection while {what} was in flight (the peer process exited, crashed or closed its comm) — check the peer's log",
            self.conn.chan.peer
        ));
        self.fail(e)
    }
}

/// After a flushed WR: drain the CQs (bounded) for the error that moved the QP to ERR.
fn root_cause(
    conn: &Conn,
    wcs: &mut [WorkCompletion; POLL_BATCH],
    describe: &impl Fn(&RequestPool, u64) -> (&'static str, usize),
    pool: &RequestPool,
) -> Option<Error> {
    for _ in 0..64 {
        let mut any = false;
        for d in conn.devs.iter() {
            let Ok(got) = d.cq.poll(wcs) else { continue };
            any |= !got.is_empty();
            for wc in got {
                if let Err(f) = wc.result() {
                    if f.status != super::errors::status::WR_FLUSH_ERR {
                        let (op, bytes) = describe(pool, wc.wr_id());
                        return Some(report(conn, &f, op, bytes));
                    }
                }
            }
        }
        if !any {
            break;
        }
    }
    None
}

fn report(conn: &Conn, f: &Failed, op: &str, bytes: usize) -> Error {
    let qp = conn.qp_by_num(f.qp_num);
    let ldev = qp.map(|q| q.dev).unwrap_or(0);
    let dev = &conn.devs[ldev.min(conn.devs.len() - 1)].dev;
    let peer_gid = qp
        .and_then(|q| conn.peer.devs.get(q.remote_dev))
        .or_else(|| conn.peer.devs.first())
        .map(|d| d.gid)
        .unwrap_or([0; 16]);
    let status_str = dev.verbs().wc_status_str(f.status);
    wc_error(&WcErrorReport {
        device: &dev.name,
        port: dev.port,
        local_gid: &dev.gid,
        peer_gid: &peer_gid,
        peer_addr: &conn.chan.peer.to_string(),
        qp_num: f.qp_num,
        operation: op,
        bytes,
        status: f.status,
        status_str: &status_str,
        vendor_err: f.vendor_err,
    })
}
