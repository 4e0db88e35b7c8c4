//! Connect (docs/nccl-net-abi.md#connection-setup, the sender's side): dial the listener's side
//! channel, build the
//! sender's resources, exchange `ConnectReq` / `ConnectResp` / `Ready`, and hand the result to
//! the data path. Non-blocking: NCCL re-enters [`connect`] with the same handle until it
//! returns a comm. The protocol decisions are [`proto::setup`](crate::transport::proto::setup)'s.

use super::foreign;
use crate::config;
use crate::device::{NetDevice, VirtualDevice};
use crate::error::{Error, Result};
use crate::ibv::qp::QpCaps;
use crate::ibv::{sys, QueuePair};
use crate::transport::conn::{self, Conn, ConnQp, LocalDev, Probe, RegBuf};
use crate::transport::proto::handshake::{
    self, EndpointRepr, HandleRepr, LinkOffer, Message, FLAG_SPLIT, FLAG_STANDBY,
};
use crate::transport::proto::link::{Outcome, Plan};
use crate::transport::proto::setup::{AwaitResponse, Dialing, Finishing, SetupError};
use crate::transport::proto::time::Time;
use crate::transport::proto::{request, split};
use crate::transport::sidechannel::shared_link::{self, FoundingMark, Joining, Link, Port, SideChannel};
use crate::transport::sidechannel::{self, ChannelError, Connector};
use crate::transport::{clock, datapath::send, SendComm};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

// Queue and CQ sizes of the sender, from what can be outstanding at once (no CQ can overflow,
// even when a failed QP flushes every WR it holds: softroce and the verbs spec give a flushed
// WR a completion whether it was signaled or not, and an overrun CQ is a device-fatal event).

/// Send WRs per sender data QP: its credits (bound: WRs not yet retired ≤ send::SQ_DEPTH).
const SENDER_SEND_WR: u32 = crate::transport::proto::send::SQ_DEPTH as u32;
/// CQ entries per sender data QP: ≤ one per unretired WR (send::SQ_DEPTH); nothing else
/// completes on the sender's CQ.
const SENDER_CQE_PER_QP: usize = crate::transport::proto::send::SQ_DEPTH;
/// Inline bytes the sender's QPs ask for when the eager path may be used: an eager header and
/// a payload of up to the default `FERROCE_EAGER_MAX` in one inline write.
const EAGER_INLINE: u32 = 256;
// Every QP of a connection has an index a send wr_id can carry.
const _: () = assert!(crate::transport::proto::limits::MAX_QPS <= request::WR_ID_QPS);

/// The sender's resources, made once the TCP connection is up; QPs in INIT.
struct Requested {
    chan: SideChannel,
    state: AwaitResponse,
    devs: Vec<LocalDev>,
    qps: Vec<QueuePair>,
    /// The member of each QP.
    placement: Vec<usize>,
    probes: Vec<Probe>,
    bufs: RegBuf,
    qps_per_req: usize,
    /// The QPs' `max_inline_data` as asked for (a recovery's new QPs get the same).
    inline: u32,
}

/// The listener answered and our QPs are in RTS; `Ready` is queued.
struct Answered {
    chan: SideChannel,
    state: Finishing,
    devs: Vec<LocalDev>,
    qps: Vec<ConnQp>,
    probes: Vec<Probe>,
    peer: EndpointRepr,
    bufs: RegBuf,
    qps_per_req: usize,
    inline: u32,
    /// Where the comm's side channel goes once `Ready` is out.
    side: Joining,
}

/// What one step of awaiting the answer came to.
enum Awaited {
    Answered(Box<Answered>),
    Waiting(Box<Requested>),
    /// The link the request went on ended before the answer: found one instead.
    LinkLost,
}

/// Where a connect is; each state holds what exists by then.
enum Stage {
    /// Another connect of this process founds the link to the listener's process: wait for
    /// it (at most `proto::link::FOUNDING_WAIT`).
    AwaitLink,
    Dialing {
        connector: Connector,
        state: Dialing,
    },
    AwaitResponse(Box<Requested>),
    Finishing(Box<Answered>),
}

/// Whom a connect is for, fixed by its first call.
struct Target {
    /// Recorded in the handle's stage bytes; finds the connect again.
    id: u64,
    listener: HandleRepr,
    /// The wire version the connection runs: the newest both ends speak.
    version: u16,
    members: Vec<Arc<NetDevice>>,
    traffic_class: i32,
    link: LinkPlan,
}

/// What a connect asks about the side-channel link (wire version 6 on, see `proto::link`).
#[derive(Default)]
struct LinkPlan {
    /// What `ConnectReq` carries (all zero: no link).
    offer: LinkOffer,
    /// The link offered for attaching, held open until the answer.
    attach: Option<Arc<Link>>,
    /// This connect founds the link to the listener's process.
    _founding: Option<FoundingMark>,
}

/// Whether a connect at wire `version` to `listener` may share a link: a listener of version
/// 6 on in another process.
fn shares_link(listener: &HandleRepr, version: u16) -> bool {
    version >= handshake::LINK_VERSION && listener.process != 0 && listener.process != shared_link::process_id()
}

/// The link plan of connect `ticket` to the listener's process at `now`; `None`: wait for
/// the founding another connect has in progress.
fn plan_link(listener: &HandleRepr, ticket: u64, now: Time) -> Option<LinkPlan> {
    let (plan, attach, founding) = shared_link::plan_connect(listener.process, ticket, now);
    let attach_key = match (plan, &attach) {
        (Plan::Attach { key }, Some(_)) => key,
        _ => 0,
    };
    match plan {
        Plan::Wait => None,
        Plan::Attach { .. } | Plan::Found => Some(LinkPlan {
            offer: LinkOffer {
                process: shared_link::process_id(),
                attach: attach_key,
                // Offered also when attaching: the listener may no longer have that link.
                found: shared_link::new_key(),
                comm: shared_link::next_comm_id(),
            },
            attach,
            _founding: founding,
        }),
    }
}

/// Start dialing the listener.
fn dial(listener: &HandleRepr, now: Time, timeout: Duration) -> Stage {
    Stage::Dialing {
        connector: Connector::new(sidechannel::socket_addr(listener.addr), timeout),
        state: Dialing::new(listener.nonce, now, timeout),
    }
}

/// A connect in progress.
struct Connecting {
    target: Target,
    stage: Stage,
    touched: Time,
}

/// What one call achieved.
enum Progress {
    Pending(Box<Connecting>),
    Done(Box<SendComm>),
}

/// The connects in progress, process-wide. NCCL re-enters `connect` with the same handle (a
/// copy of the 128 bytes, not a pointer we could hang state on), and may call it from any
/// thread, so the in-progress state lives here, keyed by an id the first call writes into
/// the handle's stage bytes.
static CONNECTING: Mutex<Vec<Connecting>> = Mutex::new(Vec::new());
static NEXT_CONNECT_ID: AtomicU64 = AtomicU64::new(1);

/// Drop every connect NCCL started and abandoned (never re-entered). They hold device
/// references, so the last `finalize` calls this before closing the devices.
pub fn forget_pending_connects() -> usize {
    let mut all = CONNECTING.lock();
    let n = all.len();
    all.clear();
    n
}

/// Non-blocking connect. Re-entered with the same handle until it returns `Some`; the
/// in-progress state lives in `CONNECTING`, keyed by an id recorded in the handle.
/// `traffic_class`: the communicator's (`ncclNetCommConfig.trafficClass`, -1 when unset).
pub fn connect(traffic_class: i32, dev: &Arc<VirtualDevice>, handle: &mut [u8; 128]) -> Result<Option<Box<SendComm>>> {
    let listener = HandleRepr::parse(handle).map_err(|e| {
        if foreign::is_foreign(&e) {
            return Error::internal(foreign::foreign_handle(handle, &e));
        }
        Error::internal(format!(
            "connect: the handle is not a ferroce listen handle ({e}); do both ranks load the same plugin?"
        ))
    })?;
    let version = listener
        .negotiate(handshake::local_max_version(config::get().wire_version))
        .map_err(|e| {
            Error::internal(format!(
                "connect: the listener speaks wire versions {}..={} and this side {}..={} (FERROCE_WIRE_VERSION={}): {e}; run the same ferroce on both ranks",
                listener.min_version,
                listener.max_version,
                handshake::OLDEST_WIRE_VERSION,
                handshake::WIRE_VERSION,
                config::get().wire_version
            ))
        })?;
    conn::check_members(dev)?;
    let timeout = conn::setup_timeout();
    let now = clock::now();
    let mut c = {
        let mut all = CONNECTING.lock();
        // Connects NCCL abandoned (it never called again) are reclaimed after twice the timeout.
        all.retain(|c| now.saturating_since(c.touched) < 2 * timeout);
        let found = handshake::read_stage(handle).and_then(|id| {
            all.iter()
                .position(|c| c.target.id == id && c.target.listener == listener)
        });
        match found {
            Some(i) => all.swap_remove(i),
            None => Connecting {
                target: Target {
                    id: NEXT_CONNECT_ID.fetch_add(1, Ordering::Relaxed),
                    listener,
                    version,
                    members: dev.members.clone(),
                    traffic_class,
                    link: LinkPlan::default(),
                },
                stage: if shares_link(&listener, version) {
                    Stage::AwaitLink
                } else {
                    dial(&listener, now, timeout)
                },
                touched: now,
            },
        }
    };
    c.touched = now;
    let id = c.target.id;
    match progress_connect(c, now) {
        Ok(Progress::Done(comm)) => {
            handshake::write_stage(handle, None);
            Ok(Some(comm))
        }
        Ok(Progress::Pending(c)) => {
            handshake::write_stage(handle, Some(id));
            CONNECTING.lock().push(*c);
            Ok(None)
        }
        Err(e) => {
            handshake::write_stage(handle, None);
            Err(e)
        }
    }
}

/// One step of every state that can advance now.
fn progress_connect(c: Connecting, now: Time) -> Result<Progress> {
    let Connecting {
        mut target,
        mut stage,
        touched,
    } = c;
    if let Stage::AwaitLink = stage {
        if let Some(mut plan) = plan_link(&target.listener, target.id, now) {
            let timeout = conn::setup_timeout();
            stage = match plan.attach.take() {
                // A link to the listener's process: the handshake goes on it, no socket.
                Some(l) => {
                    plan.offer.found = 0;
                    let port = Port::attach(Arc::clone(&l), plan.offer.comm, false, l.peer());
                    target.link = plan;
                    let state = Dialing::new(target.listener.nonce, now, timeout);
                    Stage::AwaitResponse(request(&target, SideChannel::Shared(port), state)?)
                }
                None => {
                    target.link = plan;
                    dial(&target.listener, now, timeout)
                }
            };
        }
    }
    if let Stage::Dialing { mut connector, state } = stage {
        stage = match connector.poll()? {
            Some(chan) => Stage::AwaitResponse(request(&target, SideChannel::Own(chan), state)?),
            // The connector gives up at its own deadline (the setup timeout).
            None => Stage::Dialing { connector, state },
        };
    }
    if let Stage::AwaitResponse(r) = stage {
        stage = match await_response(r, &mut target.link, target.listener.process, now)? {
            Awaited::Answered(answered) => Stage::Finishing(answered),
            Awaited::Waiting(waiting) => Stage::AwaitResponse(waiting),
            Awaited::LinkLost => {
                crate::log_info!(
                    crate::log::subsys::NET,
                    "connect: the side-channel link to {} ended before the listener answered; connecting again",
                    target.listener.process
                );
                target.link = LinkPlan::default();
                Stage::AwaitLink
            }
        };
    }
    if let Stage::Finishing(f) = stage {
        stage = match finish(f, &target, now)? {
            Ok(comm) => return Ok(Progress::Done(comm)),
            Err(f) => Stage::Finishing(f),
        };
    }
    Ok(Progress::Pending(Box::new(Connecting { target, stage, touched })))
}

/// The sender's QPs (with the peer's traffic class and service level once known), taking
/// `inline` bytes inline.
fn sender_qp_spec(tc: u8, sl: u8, standby: bool, inline: u32) -> conn::QpSpec {
    conn::QpSpec {
        caps: QpCaps {
            max_send_wr: SENDER_SEND_WR,
            max_recv_wr: 0,
            max_inline_data: inline,
            // An eager write gathers its inline header and its payload (QPs with eager's
            // inline bytes: see `request`).
            max_send_sge: if inline > conn::inline_bytes() { 2 } else { 1 },
        },
        access: sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
        tc,
        sl,
        standby,
    }
}

/// The TCP connection is up: build the sender's end and queue `ConnectReq`.
fn request(c: &Target, mut chan: SideChannel, state: Dialing) -> Result<Box<Requested>> {
    let cfg = config::get();
    let standby = cfg.active_standby_for(c.members.len());
    // Active-standby, one member carries the data: one member's QPs.
    let ndata = if standby {
        1
    } else {
        c.members.len().max(c.listener.ndevs as usize)
    };
    let nqps = (cfg.qps_per_connection.clamp(1, 128) as usize) * ndata;
    let placement = conn::initial_placement(&c.members, nqps);
    let devs = conn::local_devs(&c.members, &placement, SENDER_CQE_PER_QP, 0)?;
    // The eager path writes its header inline (and small payloads with it): ask for
    // EAGER_INLINE bytes when it may be used, and go without it if the NIC cannot.
    let eager = c.version >= handshake::EAGER_VERSION && cfg.eager_max > 0;
    let plain = conn::inline_bytes();
    let mut inline = if eager { plain.max(EAGER_INLINE) } else { plain };
    let spec = sender_qp_spec(0, 0, standby, inline);
    let qps = match conn::create_qps(&devs, &placement, spec.caps, spec.access, cfg) {
        Err(e) if inline != plain => {
            crate::log_info!(
                crate::log::subsys::NET,
                "connect: QPs with {inline} inline bytes failed ({}); without them (no eager path on this connection)",
                e.message
            );
            inline = plain;
            let spec = sender_qp_spec(0, 0, standby, inline);
            conn::create_qps(&devs, &placement, spec.caps, spec.access, cfg)?
        }
        r => r?,
    };
    let probes = conn::create_probes(&devs, standby, cfg)?;
    // The FIFO (remote-writable) and the grouped-send sizes in one registration.
    let bufs = RegBuf::new(&devs, send::SEND_BLOCK_BYTES, conn::remote_access())?;
    let (tc, sl) = conn::tc_sl(cfg, c.traffic_class);
    let rkeys: Vec<u32> = bufs.mrs.iter().map(|m| m.rkey()).collect();
    let mut flags = if cfg.split_data_on_qps { FLAG_SPLIT } else { 0 };
    if standby {
        flags |= FLAG_STANDBY;
    }
    let list = conn::qp_list(qps.iter().map(QueuePair::qpn).zip(placement.iter().copied()), &probes);
    let mut req = conn::endpoint(&devs, list, state.nonce(), tc, sl, flags, bufs.addr() as u64, &rkeys)?;
    req.link = c.link.offer;
    chan.set_version(c.version);
    chan.queue(&Message::ConnectReq(req));
    Ok(Box::new(Requested {
        chan,
        state: state.handle_dialed(),
        devs,
        qps,
        placement,
        probes,
        bufs,
        qps_per_req: split::qps_per_request(cfg.split_data_on_qps, nqps, ndata),
        inline,
    }))
}

/// Send the request, read the answer; on a valid one bring our QPs up and queue `Ready`.
fn await_response(mut r: Box<Requested>, plan: &mut LinkPlan, listener_process: u64, now: Time) -> Result<Awaited> {
    let peer = r.chan.peer();
    let read = r.chan.flush().and_then(|_| r.chan.poll_recv());
    let incoming = match read {
        Ok(None) => {
            if let Err(e) = r.state.handle_timeout(now) {
                return Err(give_up(&mut r.chan, &r.state, setup_error(peer, e)));
            }
            return Ok(Awaited::Waiting(r));
        }
        Ok(Some(m)) => Ok(m),
        Err(ChannelError::Wire(e)) => Err(e),
        // The link went away (its peer process closed its last comm on it as we asked):
        // not the listener's answer.
        Err(_) if r.chan.link_ended() => return Ok(Awaited::LinkLost),
        Err(e) => return Err(channel_error(peer, e)),
    };
    let resp = r.state.handle_message(incoming).map_err(|e| setup_error(peer, e))?;
    let Requested {
        mut chan,
        state,
        devs,
        qps,
        placement,
        probes,
        bufs,
        qps_per_req,
        inline,
    } = *r;
    let brought_up = conn::check_peer(&devs, qps.len(), !probes.is_empty(), &resp, true).and_then(|_| {
        let side = join(plan, listener_process, &resp.link, peer).map_err(|e| {
            Error::remote(format!(
                "{peer} answered the side-channel link offer with one that does not fit ({e}): a corrupt or incompatible peer"
            ))
        })?;
        Ok((side, conn::bring_up(&devs, qps, &placement, &probes, &resp, resp.tc, resp.sl)?))
    });
    let (side, qps) = brought_up.map_err(|e| give_up(&mut chan, &state, e))?;
    let (state, ready) = state.handle_brought_up();
    chan.queue(&ready);
    Ok(Awaited::Answered(Box::new(Answered {
        chan,
        state,
        devs,
        qps,
        probes,
        peer: resp,
        bufs,
        qps_per_req,
        inline,
        side,
    })))
}

/// The connector gives up with its request out: tell the listener why before the channel
/// closes (it may have answered and be waiting for `Ready`; without this it would see only a
/// closed connection), best effort, then fail with `e`.
fn give_up(chan: &mut SideChannel, state: &AwaitResponse, e: Error) -> Error {
    chan.queue(&state.handle_failed(&e.message));
    let _ = chan.flush();
    e
}

/// What the listener's link answer `got` means for this comm (the port it joins now).
fn join(
    plan: &mut LinkPlan,
    process: u64,
    got: &LinkOffer,
    peer: SocketAddr,
) -> std::result::Result<Joining, &'static str> {
    Ok(match crate::transport::proto::link::outcome(&plan.offer, got)? {
        // Asked on a connection of its own: join the link now. Asked on the link: stay.
        Outcome::Attached { .. } => match plan.attach.take() {
            Some(l) => Joining::Attached(Port::attach(l, plan.offer.comm, false, peer)),
            None => Joining::Keep,
        },
        Outcome::Founded { key } => Joining::Founded(key),
        Outcome::Own => {
            if plan.offer.found != 0 {
                shared_link::keeps_own(process);
            }
            Joining::Keep
        }
    })
}

/// Send `Ready`; once it is out, the connection goes to the data path. `Ok(Err(f))`: still
/// sending.
fn finish(
    mut f: Box<Answered>,
    target: &Target,
    now: Time,
) -> Result<std::result::Result<Box<SendComm>, Box<Answered>>> {
    let peer = f.chan.peer();
    if !f.chan.flush().map_err(|e| channel_error(peer, e))? {
        f.state.handle_timeout(now).map_err(|e| setup_error(peer, e))?;
        return Ok(Err(f));
    }
    let cfg = config::get();
    let Answered {
        mut chan,
        devs,
        qps,
        probes,
        peer,
        bufs,
        qps_per_req,
        inline,
        side,
        ..
    } = *f;
    chan.release_buffers();
    let chan = side.side_channel(chan, target.listener.process, target.link.offer.comm, false);
    let members = &target.members;
    let spec = sender_qp_spec(peer.tc, peer.sl, !probes.is_empty(), inline);
    let conn = Conn {
        qps,
        probes,
        devs,
        peer,
        chan,
        qps_per_req,
        spec,
    };
    let ar = match cfg.adaptive_routing {
        0 => false,
        v if v > 0 => true,
        _ => members.iter().all(|m| m.adaptive_routing),
    };
    let dp = send::SendDp::new(conn, bufs, ar, cfg.ar_threshold);
    Ok(Ok(Box::new(SendComm { dp })))
}

fn channel_error(peer: SocketAddr, e: ChannelError) -> Error {
    if let ChannelError::Wire(w) = &e {
        if foreign::is_foreign(w) {
            return Error::remote(foreign::foreign_listener(peer, w));
        }
    }
    Error::remote(format!(
        "connection setup with {peer} failed: {e} — did the peer process exit or reject us? (see its log)"
    ))
}

fn setup_error(peer: SocketAddr, e: SetupError) -> Error {
    Error::remote(match e {
        SetupError::Malformed(w) => return channel_error(peer, ChannelError::Wire(w)),
        SetupError::WrongNonce { .. } => {
            format!("{peer} answered with another nonce: not the listener of this handle")
        }
        SetupError::Rejected { code, text } => format!("{peer} rejected the connection (code {code}): {text}"),
        // (The listener's error; a connector never sees it.)
        SetupError::ConnectorFailed { text } => format!("{peer}: the connector gave up: {text}"),
        SetupError::Unexpected { got, .. } => format!("{peer} sent {got} during connection setup"),
        SetupError::TimedOut { after, .. } => timed_out(peer, after),
    })
}

fn timed_out(peer: SocketAddr, after: Duration) -> String {
    format!(
        "connection setup with {peer} did not finish within {after:?} — the peer accepted the TCP connection but never answered: is its proxy thread stuck, or is it not ferroce ({})? (FERROCE_CONNECT_TIMEOUT_SEC sets the limit)",
        foreign::SAME_PLUGIN
    )
}
