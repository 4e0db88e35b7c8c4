//! The one TCP listener a process's listen comms share (the I/O around
//! [`proto::setup::Unidentified`](crate::transport::proto::setup::Unidentified)).
//!
//! NCCL opens a listen comm per connection and closes it once accepted; with a listener each, a
//! process setting up thousands of connections held a descriptor per pending one. Here every
//! handle names the same address, told apart by its nonce: a connection that arrives is read
//! until its first message, and a `ConnectReq` waits, filed under its nonce, for the listen
//! comm whose handle carries it (as requests on a shared link wait, `sidechannel::shared_link`). Anything else is
//! refused as a listener of its own refused it. The listener opens with the first listen comm
//! and closes with the last one (and the connections still unidentified with it). No thread of
//! its own: every listen comm's accept moves it on.

use crate::error::{Error, Result};
use crate::transport::proto::handshake::{EndpointRepr, Message};
use crate::transport::proto::setup::{reject, Refusal, SetupError, Unidentified};
use crate::transport::proto::time::Time;
use crate::transport::sidechannel::shared_link::{self, SideChannel};
use crate::transport::sidechannel::{self, Channel, ChannelError};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// Unidentified connections kept beyond one per listen comm (the oldest is dropped beyond):
/// room for junk without refusing a burst of honest connects.
const UNIDENTIFIED_SLACK: usize = 64;

/// A connection whose first message has not arrived yet.
struct Pending {
    chan: Channel,
    state: Unidentified,
}

/// A request that came on the listener for one listen comm: its connection and the request.
pub type Arrival = (Channel, EndpointRepr);

/// The process's listener while any listen comm is open.
struct ProcessListener {
    listener: TcpListener,
    addr: SocketAddr,
    pending: Vec<Pending>,
    /// When the last round ran.
    last_round: Option<Instant>,
    /// Per listen comm (its nonce): the requests it has not taken yet.
    waiting: HashMap<u64, VecDeque<Arrival>>,
}

static LISTENER: Lazy<Mutex<Option<ProcessListener>>> = Lazy::new(|| Mutex::new(None));

/// A listen comm's place at the process's listener: requests for its nonce wait for it there.
/// Dropping it refuses the ones it did not take.
pub struct Entrance {
    nonce: u64,
    addr: SocketAddr,
}

/// Join the process's listener (opened now if no listen comm has it open) as the listen comm of
/// `nonce`: its handle carries the returned entrance's address.
pub fn enter(nonce: u64) -> Result<Entrance> {
    let mut shared = LISTENER.lock();
    if shared.is_none() {
        let ifa = sidechannel::side_channel_interface()?;
        let listener = sidechannel::bind_listener(ifa)?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::system(format!("getsockname on the listener: {e}")))?;
        *shared = Some(ProcessListener {
            listener,
            addr,
            pending: Vec::new(),
            last_round: None,
            waiting: HashMap::new(),
        });
    }
    let Some(d) = shared.as_mut() else {
        return Err(Error::internal("the process's listener is not open"));
    };
    d.waiting.entry(nonce).or_default();
    Ok(Entrance { nonce, addr: d.addr })
}

impl Entrance {
    /// The address every handle of this process names.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next request for this listen comm; when none is filed, a round of the listener at
    /// `now` first (take new connections, read their first messages, drop those older than
    /// `timeout` without one): at most one per [`ACCEPT_ROUND`](crate::transport::clock::ACCEPT_ROUND),
    /// unless `final_round` (the caller is about to give up, and should not before the
    /// connections that timed out with it are told).
    pub fn take(&self, now: Time, timeout: Duration, final_round: bool) -> Result<Option<Arrival>> {
        let mut shared = LISTENER.lock();
        let Some(d) = shared.as_mut() else {
            return Ok(None);
        };
        if let Some(a) = d.waiting.get_mut(&self.nonce).and_then(VecDeque::pop_front) {
            return Ok(Some(a));
        }
        if !crate::transport::clock::due(&mut d.last_round, crate::transport::clock::ACCEPT_ROUND) && !final_round {
            return Ok(None);
        }
        d.take_connections(now, timeout)?;
        d.identify(now);
        Ok(d.waiting.get_mut(&self.nonce).and_then(VecDeque::pop_front))
    }
}

impl Drop for Entrance {
    /// The requests this listen comm did not take are refused; the last listen comm closes the
    /// listener.
    fn drop(&mut self) {
        let mut shared = LISTENER.lock();
        let Some(d) = shared.as_mut() else {
            return;
        };
        for (mut chan, _) in d.waiting.remove(&self.nonce).unwrap_or_default() {
            refuse_with(
                &mut chan,
                reject::NONCE_MISMATCH,
                "the listen comm closed before it accepted",
            );
        }
        if d.waiting.is_empty() {
            *shared = None;
        } else if d.waiting.len() * 4 < d.waiting.capacity() {
            // NCCL closes a listen comm once accepted: after a burst, give the table back.
            d.waiting.shrink_to_fit();
        }
    }
}

impl ProcessListener {
    /// New TCP connections join the unidentified ones (the oldest is dropped when full).
    fn take_connections(&mut self, now: Time, timeout: Duration) -> Result<()> {
        while let Some(chan) = sidechannel::try_accept(&self.listener)? {
            if self.pending.len() >= self.waiting.len() + UNIDENTIFIED_SLACK {
                let old = self.pending.remove(0);
                crate::log_warn!(
                    "listener: too many unidentified connections, dropping the one from {}",
                    old.chan.peer
                );
            }
            self.pending.push(Pending {
                chan,
                state: Unidentified::new(now, timeout),
            });
        }
        Ok(())
    }

    /// Unidentified connections: a request is filed for the listen comm its nonce names.
    fn identify(&mut self, now: Time) {
        let mut i = 0;
        while i < self.pending.len() {
            let incoming = match self.pending[i].chan.poll_recv() {
                Ok(Some(m)) => Ok(m),
                Err(ChannelError::Wire(e)) => Err(e),
                Ok(None) => {
                    if let Err(e) = self.pending[i].state.handle_timeout(now) {
                        let p = self.pending.remove(i);
                        refuse(SideChannel::Own(p.chan), Refusal { error: e, reject: None });
                    } else {
                        i += 1;
                    }
                    continue;
                }
                Err(e) => {
                    let p = self.pending.remove(i);
                    crate::log_info!(
                        crate::log::subsys::NET,
                        "listener: connection from {} went away before identifying itself: {e}",
                        p.chan.peer
                    );
                    continue;
                }
            };
            let p = self.pending.remove(i);
            let waiting = &mut self.waiting;
            match p.state.handle_message(incoming, |n| waiting.contains_key(&n)) {
                Ok(req) => match waiting.get_mut(&req.nonce) {
                    Some(q) if q.len() < shared_link::MAX_REQUESTS => q.push_back((p.chan, req)),
                    _ => {
                        let mut chan = p.chan;
                        crate::log_warn!(
                            "listener: too many connection requests waiting for one listen comm; rejected the one from {}",
                            chan.peer
                        );
                        refuse_with(
                            &mut chan,
                            reject::BUSY,
                            "too many connection requests waiting for this listener",
                        );
                    }
                },
                Err(r) => refuse(SideChannel::Own(p.chan), r),
            }
        }
    }
}

/// Tell the peer of `chan` why it is refused (best effort), then close it.
fn refuse_with(chan: &mut Channel, code: u32, text: &str) {
    chan.queue(&Message::Reject {
        code,
        text: text.into(),
    });
    let _ = chan.flush();
}

/// Drop a connection the protocol refused: WARN, and tell the peer why if the refusal says so.
pub fn refuse(mut chan: SideChannel, r: Refusal) {
    let peer = chan.peer();
    match &r.error {
        SetupError::Malformed(e) if super::foreign::is_foreign(e) => {
            crate::log_warn!("{}", super::foreign::foreign_connector(peer, e))
        }
        SetupError::Malformed(e) => crate::log_warn!("listener: rejected a connection from {peer}: {e}"),
        SetupError::WrongNonce { .. } if r.reject.is_some() => crate::log_warn!(
            "listener: connection from {peer} carries another listener's handle (nonce mismatch: a stale or foreign handle); rejected"
        ),
        SetupError::WrongNonce { .. } => {
            crate::log_warn!("listener: {peer} sent Ready with another listener's nonce; dropped")
        }
        SetupError::ConnectorFailed { text } => {
            crate::log_warn!("listener: {peer} gave up the handshake after our answer: {text}; dropped")
        }
        SetupError::Rejected { .. } => crate::log_warn!(
            "listener: second connection attempt from {peer} while one is being accepted; rejected"
        ),
        SetupError::Unexpected { state: "AwaitRequest", got } => {
            crate::log_warn!("listener: unexpected first message from {peer}: {got:?}; dropped")
        }
        SetupError::Unexpected { got, .. } => {
            crate::log_warn!("listener: {peer} sent {got:?} instead of Ready; dropped")
        }
        SetupError::TimedOut {
            state: "AwaitRequest",
            after,
        } => crate::log_warn!(
            "listener: {peer} connected but sent no complete connection request within {after:?} (nothing, or part of one: is it ferroce? {}); dropped",
            super::foreign::SAME_PLUGIN
        ),
        SetupError::TimedOut { after, .. } => {
            crate::log_warn!("listener: {peer} did not finish the handshake within {after:?}; dropped")
        }
    }
    if let Some(m) = r.reject {
        chan.queue(&m);
        let _ = chan.flush();
    }
}
