//! Listen and accept (docs/nccl-net-abi.md#connection-setup, the receiver's side): a listen comm's
//! place at the
//! process's listener (`process_listener`, shared by every listen comm) and on its links, the
//! connection it accepts in its setup states, and the receiver's resources built for it. The
//! protocol decisions are [`proto::setup`](crate::transport::proto::setup)'s.
//!
//! Malformed or foreign connections are WARNed and dropped; the listener keeps working.

use super::process_listener::{self, refuse, Entrance};
use crate::config;
use crate::device::{NetDevice, VirtualDevice};
use crate::error::{Error, Result};
use crate::ibv::qp::QpCaps;
use crate::ibv::{sys, QueuePair};
use crate::transport::conn::{self, Conn, LocalDev, RegBuf};
use crate::transport::datapath::watch::Guarded;
use crate::transport::proto::eager;
use crate::transport::proto::handshake::{self, EndpointRepr, HandleRepr, Message, FLAG_SPLIT};
use crate::transport::proto::recv as recv_core;
use crate::transport::proto::setup::{AwaitReady, AwaitRequest, Incoming, Refusal, SetupError};
use crate::transport::proto::split;
use crate::transport::proto::time::Time;
use crate::transport::sidechannel::shared_link::{self, Joining, Port, SideChannel};
use crate::transport::sidechannel::{self, ChannelError};
use crate::transport::{clock, datapath::recv, RecvComm};
use std::sync::Arc;

// Queue and CQ sizes of the receiver, from what can be outstanding at once (see
// `setup::connect`: no CQ can overflow, even when a failed QP flushes every WR it holds).

/// Send WRs per receiver QP: CTS writes (bound: unretired ≤ recv::CTS_DEPTH, only on the first
/// QP of each device).
const RECEIVER_SEND_WR: u32 = crate::transport::proto::recv::CTS_DEPTH as u32;
// Receive WRs per receiver QP (recv::rq_depth): one per receive in flight that uses the QP
// (≤ RECVS_IN_FLIGHT; a receive's WRs complete before test() reports it), fewer than one batch
// posted ahead, and with the eager path one per eager message in flight. As many CQ entries per
// receiver QP: its receive WRs, every one of them when the QP fails and flushes them (nothing
// else of the QP is signaled but the CTS writes, counted per device below).
/// CQ entries per receiver device besides the per-QP ones: the CTS writes of its one CTS QP
/// (≤ recv::CTS_DEPTH unretired). Flush reads complete elsewhere (FLUSH_CQE), so the receive
/// CQ of a device holds m·rq_depth + CTS_DEPTH for its m QPs.
const RECEIVER_CQE_CTS: usize = crate::transport::proto::recv::CTS_DEPTH;

/// A request for this listen comm, before it is taken as the one being accepted.
struct Pending {
    chan: SideChannel,
    state: AwaitRequest,
}

/// The connection that sent a valid request: our end is up, `ConnectResp` queued.
struct Accepting {
    chan: SideChannel,
    state: AwaitReady,
    parts: RecvParts,
}

/// The one connection a listener accepts at a time.
enum Slot {
    Free,
    Accepting(Box<Accepting>),
}

/// When `accept` was first called: the listener gives up a timeout after it.
enum Polled {
    Never,
    Since(Time),
}

/// A listening endpoint: its place at the process's listener plus the handshake in progress.
pub struct ListenComm {
    entrance: Entrance,
    nonce: u64,
    members: Vec<Arc<NetDevice>>,
    slot: Slot,
    polled: Polled,
}

/// Take a place at the process's listener and write the handle (≤ 128 bytes).
/// Never blocks; always returns a comm on success.
pub fn listen(dev: &Arc<VirtualDevice>, handle: &mut [u8; 128]) -> Result<Box<ListenComm>> {
    conn::check_members(dev)?;
    let nonce = sidechannel::random_nonzero();
    let entrance = process_listener::enter(nonce)?;
    HandleRepr {
        addr: sidechannel::listen_addr(entrance.addr()),
        ndevs: dev.members.len() as u8,
        nonce,
        min_version: handshake::OLDEST_WIRE_VERSION,
        max_version: handshake::local_max_version(crate::config::get().wire_version),
        process: shared_link::process_id(),
    }
    .emit(handle);
    // Connects from processes this one has a link with send their request on it.
    shared_link::listen_on(nonce);
    Ok(Box::new(ListenComm {
        entrance,
        nonce,
        members: dev.members.clone(),
        slot: Slot::Free,
        polled: Polled::Never,
    }))
}

/// A message read off a channel (a framing error is a message the protocol refuses), or why
/// the channel ended.
fn read(chan: &mut SideChannel) -> std::result::Result<Option<Incoming>, ChannelError> {
    match chan.poll_recv() {
        Ok(m) => Ok(m.map(Ok)),
        Err(ChannelError::Wire(e)) => Ok(Some(Err(e))),
        Err(e) => Err(e),
    }
}

impl Drop for ListenComm {
    /// Requests that came on links for this listener and were not accepted are refused.
    fn drop(&mut self) {
        shared_link::unlisten(self.nonce);
    }
}

impl ListenComm {
    /// Non-blocking accept; `None` while no peer has completed the handshake.
    pub fn accept(&mut self) -> Result<Option<Box<RecvComm>>> {
        let timeout = conn::setup_timeout();
        let now = clock::now();
        let first = match self.polled {
            Polled::Never => {
                self.polled = Polled::Since(now);
                now
            }
            Polled::Since(t) => t,
        };
        let expired = now.saturating_since(first) > timeout;
        self.take_requests(now, timeout, expired)?;
        if let Some(comm) = self.progress_accepting(now)? {
            return Ok(Some(comm));
        }
        if matches!(self.slot, Slot::Free) && expired {
            return Err(Error::remote(format!(
                "no peer completed a connection to this listener ({}) within {timeout:?} — is the sending rank alive, can it reach this address, and does it run ferroce ({})? (FERROCE_CONNECT_TIMEOUT_SEC sets the limit)",
                self.entrance.addr(),
                super::foreign::SAME_PLUGIN
            )));
        }
        Ok(None)
    }

    /// Requests for this listen comm, from the process's listener (`final_round`: a round of it
    /// now, whatever the rate limit) and from its links: taken as a connection's first message
    /// is (a busy listen comm refuses them).
    fn take_requests(&mut self, now: Time, timeout: std::time::Duration, final_round: bool) -> Result<()> {
        while let Some((chan, req)) = self.entrance.take(now, timeout, final_round)? {
            self.take(SideChannel::Own(chan), req, now, timeout)?;
        }
        shared_link::pump_links();
        while let Some((port, req)) = shared_link::take_request(self.nonce) {
            self.take(SideChannel::Shared(port), req, now, timeout)?;
        }
        Ok(())
    }

    fn take(&mut self, chan: SideChannel, req: EndpointRepr, now: Time, timeout: std::time::Duration) -> Result<()> {
        let p = Pending {
            chan,
            state: AwaitRequest::new(self.nonce, now, timeout),
        };
        let busy = matches!(self.slot, Slot::Accepting(_));
        match p.state.handle_message(Ok(Message::ConnectReq(req)), busy) {
            Ok(req) => self.start_accepting(p, &req, now),
            Err(r) => {
                refuse(p.chan, r);
                Ok(())
            }
        }
    }

    /// Build our end for a valid request and answer it. A failure is told to the peer and
    /// fails this accept (the listener itself stays usable).
    fn start_accepting(&mut self, p: Pending, req: &EndpointRepr, now: Time) -> Result<()> {
        let Pending { mut chan, state } = p;
        match build_recv(&self.members, req, self.nonce, chan.version()) {
            Ok((mut parts, mut resp)) => {
                let (answer, side) = answer_link(req, &chan);
                resp.link = answer;
                parts.side = side;
                chan.queue(&Message::ConnectResp(resp));
                self.slot = Slot::Accepting(Box::new(Accepting {
                    chan,
                    state: state.handle_built(now),
                    parts,
                }));
                Ok(())
            }
            Err(e) => {
                chan.queue(&state.handle_build_failed(&e.to_string()));
                let _ = chan.flush();
                Err(e.context(format!("accepting the connection from {}", chan.peer())))
            }
        }
    }

    /// The identified connection: send our answer, wait for `Ready`; the comm once it came.
    /// `Err`: its connector gave up and said why (it does not try again: NCCL got its error),
    /// so this accept fails now with that reason rather than after its whole timeout.
    fn progress_accepting(&mut self, now: Time) -> Result<Option<Box<RecvComm>>> {
        let Slot::Accepting(mut a) = std::mem::replace(&mut self.slot, Slot::Free) else {
            return Ok(None);
        };
        // Read even when the answer cannot be sent: a connector that gave up sent its reason
        // (a `Reject`) before closing, and that reason is worth more than our write's error.
        let flushed = a.chan.flush();
        let incoming = match read(&mut a.chan) {
            Ok(Some(m)) => Ok(Some(m)),
            r => flushed.and(r),
        };
        let incoming = match incoming {
            Ok(m) => m,
            Err(e) => {
                crate::log_warn!("listener: {} failed during the handshake: {e}; dropped", a.chan.peer());
                return Ok(None);
            }
        };
        let verdict = match incoming {
            Some(m) => a.state.handle_message(m),
            None => match a.state.handle_timeout(now) {
                Ok(()) => {
                    self.slot = Slot::Accepting(a);
                    return Ok(None);
                }
                Err(e) => Err(Refusal { error: e, reject: None }),
            },
        };
        match verdict {
            Ok(()) => {
                let Accepting { chan, parts, .. } = *a;
                Ok(Some(Box::new(RecvComm { dp: parts.finish(chan) })))
            }
            Err(r) => {
                let peer = a.chan.peer();
                let gave_up = match &r.error {
                    SetupError::ConnectorFailed { text } => Some(text.clone()),
                    _ => None,
                };
                refuse(a.chan, r);
                match gave_up {
                    Some(text) => Err(Error::remote(format!(
                        "the connector at {peer} gave up after this listener answered: {text} (see that process's log)"
                    ))),
                    None => Ok(None),
                }
            }
        }
    }
}

/// Receiver resources built on a valid request, before the connector's Ready.
struct RecvParts {
    devs: Vec<LocalDev>,
    qps: Vec<conn::ConnQp>,
    probes: Vec<conn::Probe>,
    /// iflush issues reads (its flush QPs are made by the first one).
    flush: bool,
    bufs: RegBuf,
    peer: EndpointRepr,
    qps_per_req: usize,
    spec: conn::QpSpec,
    /// The largest eager payload the landing ring after the staging ring takes (0: none).
    eager_max: usize,
    /// Where the comm's side channel goes once `Ready` came.
    side: Joining,
}

/// The answer to a request's link offer (`proto::link::answer`) that came on `chan`, and what
/// this end does about it. A request on a link is on the link it names (else the connector
/// refuses the answer).
fn answer_link(req: &EndpointRepr, chan: &SideChannel) -> (handshake::LinkOffer, Joining) {
    let asked = &req.link;
    if let Some(key) = chan.link_key() {
        let answer = handshake::LinkOffer {
            process: shared_link::process_id(),
            attach: key,
            found: 0,
            comm: asked.comm,
        };
        return (answer, Joining::Keep);
    }
    let share = chan.version() >= handshake::LINK_VERSION;
    let open = (share && asked.attach != 0)
        .then(|| shared_link::attachable(asked.attach, asked.process))
        .flatten();
    let answer = crate::transport::proto::link::answer(asked, shared_link::process_id(), share, open.is_some());
    let side = match (open, answer.attach, answer.found) {
        (Some(l), a, _) if a != 0 => Joining::Attached(Port::attach(l, asked.comm, true, chan.peer())),
        (_, _, f) if f != 0 => Joining::Founded(f),
        _ => Joining::Keep,
    };
    (answer, side)
}

impl RecvParts {
    fn finish(self, mut chan: SideChannel) -> Box<Guarded<recv::RecvDp>> {
        let p = self;
        chan.release_buffers();
        let chan = p.side.side_channel(chan, p.peer.link.process, p.peer.link.comm, true);
        let conn = Conn {
            qps: p.qps,
            probes: p.probes,
            devs: p.devs,
            peer: p.peer,
            chan,
            qps_per_req: p.qps_per_req,
            spec: p.spec,
        };
        recv::RecvDp::new(conn, p.flush, p.bufs, config::get().use_inline, p.eager_max)
    }
}

/// Whether receives need the GPU flush (docs/nccl-net-abi.md#gpudirect-detection): peer memory or
/// DMA-BUF, and not disabled.
fn flush_wanted(members: &[Arc<NetDevice>]) -> bool {
    static PEER_MEMORY: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    let peer = *PEER_MEMORY.get_or_init(crate::device::peer_memory_present);
    !config::get().gdr_flush_disable && (peer || members.iter().all(|m| m.dmabuf))
}

/// How the receiver's QPs are made and connected: `rq_depth` receives each, and the traffic
/// class of the CTS writes they carry.
fn receiver_spec(req: &EndpointRepr, rq_depth: usize, standby: bool) -> conn::QpSpec {
    let cfg = config::get();
    // Our QPs carry the CTS writes: NCCL_IB_FIFO_TC if set, else the sender's data tc.
    let tc = if cfg.fifo_tc >= 0 {
        (cfg.fifo_tc & 0xff) as u8
    } else {
        req.tc
    };
    conn::QpSpec {
        caps: QpCaps {
            max_send_wr: RECEIVER_SEND_WR,
            max_recv_wr: rq_depth as u32,
            max_inline_data: conn::inline_bytes(),
            max_send_sge: 1,
        },
        access: sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        tc,
        sl: req.sl,
        standby,
    }
}

/// Build the receiver's end for a valid request at wire `version`.
fn build_recv(
    members: &[Arc<NetDevice>],
    req: &EndpointRepr,
    nonce: u64,
    version: u16,
) -> Result<(RecvParts, EndpointRepr)> {
    let cfg = config::get();
    // The eager landing ring: on connections of a version that has it, unless turned off.
    let eager_max = if version >= handshake::EAGER_VERSION {
        cfg.eager_max.min(eager::MAX_EAGER_BYTES)
    } else {
        0
    };
    let nl = members.len();
    let nr = req.devs.len();
    let nqps = req.data_qp_count();
    let standby = cfg.active_standby_for(nl);
    // Active-standby (checked against the sender's below), one member carries the data.
    let ndata = if standby { 1 } else { nl.max(nr) };
    let flush = flush_wanted(members);
    let placement = conn::initial_placement(members, nqps);
    let rq_depth = recv_core::rq_depth(eager_max > 0);
    let devs = conn::local_devs(members, &placement, rq_depth, RECEIVER_CQE_CTS)?;
    let spec = receiver_spec(req, rq_depth, standby);
    conn::check_peer(&devs, nqps, standby, req, false)?;
    if nqps < ndata {
        return Err(Error::remote(format!(
            "the sender offers {nqps} QPs for {ndata} device pairs"
        )));
    }
    let qps = conn::create_qps(&devs, &placement, spec.caps, spec.access, cfg)?;
    let probes = conn::create_probes(&devs, standby, cfg)?;
    // The CTS staging, which also holds the completion records, and the eager landing ring in
    // one registration; the peer is told the completion records' and the ring's addresses.
    let bufs = RegBuf::new(
        &devs,
        recv::RECV_BLOCK_BYTES + eager::ring_bytes(eager_max),
        conn::remote_access(),
    )?;
    let rkeys: Vec<u32> = bufs.mrs.iter().map(|m| m.rkey()).collect();
    let list = conn::qp_list(qps.iter().map(QueuePair::qpn).zip(placement.iter().copied()), &probes);
    let mut resp = conn::endpoint(
        &devs,
        list,
        nonce,
        req.tc,
        req.sl,
        req.flags,
        (bufs.addr() + recv::CMPL_OFF) as u64,
        &rkeys,
    )?;
    if eager_max > 0 {
        resp.eager = handshake::EagerOffer {
            landing: (bufs.addr() + recv::RECV_BLOCK_BYTES) as u64,
            slot_bytes: eager::slot_bytes(eager_max) as u32,
            max: eager_max as u32,
        };
    }
    let qps = conn::bring_up(&devs, qps, &placement, &probes, req, spec.tc, req.sl)?;
    let split = req.flags & FLAG_SPLIT != 0;
    let parts = RecvParts {
        devs,
        qps,
        probes,
        flush,
        bufs,
        peer: req.clone(),
        qps_per_req: split::qps_per_request(split, nqps, ndata),
        spec,
        eager_max,
        side: Joining::Keep,
    };
    Ok((parts, resp))
}
