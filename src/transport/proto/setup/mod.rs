//! The connection-setup protocol of both ends as pure state machines
//! (docs/nccl-net-abi.md#connection-setup): which side
//! channel message each state expects, the nonce checks and the setup timeout. The I/O layer
//! (transport/listen.rs, transport/connect.rs) owns the sockets and the verbs resources, feeds
//! every message (or framing error) it reads to `handle_*`, and acts on what comes back;
//! time is an argument.
//!
//! ```text
//! connector                                listener (one connection)
//! Dialing --TCP up--> AwaitResponse        AwaitRequest --ConnectReq, nonce ok--> (build)
//!   ConnectReq ------------------------------->                                      |
//!   <------------------------------------------ ConnectResp      AwaitReady <--------+
//! AwaitResponse --ConnectResp--> (bring up) --> Finishing
//!   Ready ------------------------------------> AwaitReady --Ready, nonce ok--> done
//! Finishing --Ready sent--> done
//! ```
//!
//! Every other message, a nonce that is not the listener's, a framing error or the timeout is
//! an error ([`SetupError`]); nothing here panics on peer input. The listener drops only the
//! offending connection and keeps listening (its caller decides); the connector fails.

use super::handshake::{EndpointRepr, Message, WireError};
use super::time::Time;
use std::fmt;
use std::time::Duration;

/// Reason codes of the `Reject` message the listener sends (never renumbered).
pub mod reject {
    /// The request carries another listener's nonce (a stale or foreign handle).
    pub const NONCE_MISMATCH: u32 = 1;
    /// The listener is already accepting another connection.
    pub const BUSY: u32 = 2;
    /// The listener could not build its end (verbs resources).
    pub const SETUP_FAILED: u32 = 3;
    /// (Connector to listener.) The connector gave up after its request went out (the text
    /// says why): the listener drops the connection at once, naming that reason, instead of
    /// seeing only a closed connection.
    pub const CONNECTOR_FAILED: u32 = 4;
}

/// Why setup failed (or, on the listener, why one connection is dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupError {
    /// The bytes were not a valid frame.
    Malformed(WireError),
    /// A valid message the current state does not expect.
    Unexpected { state: &'static str, got: &'static str },
    /// A message naming a nonce that is not the listener's.
    WrongNonce { got: u64 },
    /// The listener refuses the connection.
    Rejected { code: u32, text: String },
    /// (Listener.) The connector gave up after our answer and said why.
    ConnectorFailed { text: String },
    /// The state did not advance within the setup timeout.
    TimedOut { state: &'static str, after: Duration },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Malformed(e) => write!(f, "malformed message: {e}"),
            SetupError::Unexpected { state, got } => write!(f, "sent {got} while this side was in {state}"),
            SetupError::WrongNonce { got } => {
                write!(
                    f,
                    "nonce {got:#018x} is not this listener's (a stale or foreign handle)"
                )
            }
            SetupError::Rejected { code, text } => write!(f, "rejected the connection (code {code}): {text}"),
            SetupError::ConnectorFailed { text } => write!(f, "the connector gave up: {text}"),
            SetupError::TimedOut { state, after } => write!(f, "no progress in {state} within {after:?}"),
        }
    }
}

/// The name of a message kind, for errors and logs.
pub fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::ConnectReq(_) => "ConnectReq",
        Message::ConnectResp(_) => "ConnectResp",
        Message::Ready { .. } => "Ready",
        Message::Reject { .. } => "Reject",
        Message::RecoverHello { .. } => "RecoverHello",
        Message::RecoverReady { .. } => "RecoverReady",
        Message::OnComm { .. } => "OnComm",
        Message::CommClosed { .. } => "CommClosed",
        Message::RecvClosed { .. } => "RecvClosed",
    }
}

/// A message as read off the side channel: whole, or a framing error.
pub type Incoming = Result<Message, WireError>;

/// The timeout of one state: entered at `since`, given up `timeout` later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTimer {
    since: Time,
    timeout: Duration,
}

impl StateTimer {
    pub fn new(now: Time, timeout: Duration) -> StateTimer {
        StateTimer { since: now, timeout }
    }

    /// When the state gives up.
    pub fn poll_timeout(&self) -> Time {
        self.since + self.timeout
    }

    /// `Err` once `now` is past the deadline.
    fn check(&self, now: Time, state: &'static str) -> Result<(), SetupError> {
        if now > self.poll_timeout() {
            return Err(SetupError::TimedOut {
                state,
                after: self.timeout,
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Connector: Dialing -> AwaitResponse -> Finishing, each state a type; one timer for all.
// ---------------------------------------------------------------------------------------------

/// The TCP connection to the listener is not up yet; nothing is sent.
#[derive(Clone, Debug)]
pub struct Dialing {
    nonce: u64,
    timer: StateTimer,
}

impl Dialing {
    /// A connect to the listener whose handle carries `nonce`, started at `now`.
    pub fn new(nonce: u64, now: Time, timeout: Duration) -> Dialing {
        Dialing {
            nonce,
            timer: StateTimer::new(now, timeout),
        }
    }

    /// The listener's nonce, which `ConnectReq` carries.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The TCP connection is up and the caller queued its `ConnectReq`. (Dialing itself gives
    /// up at the TCP connector's deadline, the same timeout: it has no timer check here.)
    pub fn handle_dialed(self) -> AwaitResponse {
        AwaitResponse {
            nonce: self.nonce,
            timer: self.timer,
        }
    }
}

/// `ConnectReq` is queued; the listener's `ConnectResp` is awaited.
#[derive(Clone, Debug)]
pub struct AwaitResponse {
    nonce: u64,
    timer: StateTimer,
}

impl AwaitResponse {
    /// A message from the listener: `Ok` is its end; bring the QPs up against it, then call
    /// [`handle_brought_up`](Self::handle_brought_up).
    pub fn handle_message(&self, m: Incoming) -> Result<EndpointRepr, SetupError> {
        match m.map_err(SetupError::Malformed)? {
            Message::ConnectResp(resp) if resp.nonce == self.nonce => Ok(resp),
            Message::ConnectResp(resp) => Err(SetupError::WrongNonce { got: resp.nonce }),
            Message::Reject { code, text } => Err(SetupError::Rejected { code, text }),
            other => Err(SetupError::Unexpected {
                state: "AwaitResponse",
                got: kind_name(&other),
            }),
        }
    }

    /// Our QPs are in RTS: the next state and the message to queue (`Ready`).
    pub fn handle_brought_up(self) -> (Finishing, Message) {
        let ready = Message::Ready { nonce: self.nonce };
        (Finishing { timer: self.timer }, ready)
    }

    pub fn handle_timeout(&self, now: Time) -> Result<(), SetupError> {
        self.timer.check(now, "AwaitResponse")
    }

    /// The connector gives up (`why`: its error) with its request out: the `Reject` to send
    /// before closing, so the listener, which may have answered already, drops its end at
    /// once and says why rather than seeing only a closed connection.
    pub fn handle_failed(&self, why: &str) -> Message {
        Message::Reject {
            code: reject::CONNECTOR_FAILED,
            text: why.into(),
        }
    }
}

/// Our QPs are up and `Ready` is queued; setup is done once it is sent. Nothing more is read
/// (the channel is the liveness probe from here on).
#[derive(Clone, Debug)]
pub struct Finishing {
    timer: StateTimer,
}

impl Finishing {
    pub fn handle_timeout(&self, now: Time) -> Result<(), SetupError> {
        self.timer.check(now, "Finishing")
    }
}

// ---------------------------------------------------------------------------------------------
// Listener, per connection: AwaitRequest -> AwaitReady, each state a type with its own timer.
// ---------------------------------------------------------------------------------------------

/// How the listener refuses a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub error: SetupError,
    /// `Some`: tell the peer why (a `Reject` to send before closing); `None`: just close.
    pub reject: Option<Box<Message>>,
}

impl Refusal {
    fn silent(error: SetupError) -> Refusal {
        Refusal { error, reject: None }
    }
}

/// Accepted; the connection's first message (`ConnectReq`) is awaited.
#[derive(Clone, Debug)]
pub struct AwaitRequest {
    nonce: u64,
    timer: StateTimer,
}

impl AwaitRequest {
    /// A connection accepted at `now` on the listener whose handle carries `nonce`.
    pub fn new(nonce: u64, now: Time, timeout: Duration) -> AwaitRequest {
        AwaitRequest {
            nonce,
            timer: StateTimer::new(now, timeout),
        }
    }

    /// The connection's first message. `busy`: another connection of this listener is in
    /// [`AwaitReady`] (one is accepted at a time). `Ok`: a valid request, build our end for it
    /// and queue `ConnectResp`. `Err`: drop the connection, after sending the `Reject`, if any.
    pub fn handle_message(&self, m: Incoming, busy: bool) -> Result<EndpointRepr, Refusal> {
        match m.map_err(|e| Refusal::silent(SetupError::Malformed(e)))? {
            Message::ConnectReq(req) if req.nonce != self.nonce => Err(wrong_nonce(req.nonce)),
            Message::ConnectReq(_) if busy => Err(Refusal {
                error: SetupError::Rejected {
                    code: reject::BUSY,
                    text: "a second connection attempt while one is being accepted".into(),
                },
                reject: Some(Box::new(Message::Reject {
                    code: reject::BUSY,
                    text: "this listener is already accepting a connection".into(),
                })),
            }),
            Message::ConnectReq(req) => Ok(req),
            other => Err(Refusal::silent(SetupError::Unexpected {
                state: "AwaitRequest",
                got: kind_name(&other),
            })),
        }
    }

    /// Our end is built and `ConnectResp` queued at `now`: await `Ready`, with a fresh timer.
    pub fn handle_built(self, now: Time) -> AwaitReady {
        AwaitReady {
            nonce: self.nonce,
            timer: StateTimer::new(now, self.timer.timeout),
        }
    }

    /// Building our end failed: the `Reject` to send before closing.
    pub fn handle_build_failed(&self, why: &str) -> Message {
        Message::Reject {
            code: reject::SETUP_FAILED,
            text: format!("receiver setup failed: {why}"),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn handle_timeout(&self, now: Time) -> Result<(), SetupError> {
        self.timer.check(now, "AwaitRequest")
    }
}

/// The refusal of a request whose handle no listen comm here issued.
fn wrong_nonce(got: u64) -> Refusal {
    Refusal {
        error: SetupError::WrongNonce { got },
        reject: Some(Box::new(Message::Reject {
            code: reject::NONCE_MISMATCH,
            text: "nonce mismatch: this listener did not issue that handle".into(),
        })),
    }
}

/// A connection on the listener this process's listen comms share, its first message not
/// come yet: the nonce of its request says which listen comm it is for.
#[derive(Clone, Debug)]
pub struct Unidentified {
    timer: StateTimer,
}

impl Unidentified {
    /// A connection accepted at `now`.
    pub fn new(now: Time, timeout: Duration) -> Unidentified {
        Unidentified {
            timer: StateTimer::new(now, timeout),
        }
    }

    /// The connection's first message. `listening(nonce)`: whether a listen comm of this
    /// process issued the handle with that nonce. `Ok`: a request for that listen comm, which
    /// then takes it as its [`AwaitRequest`] would. `Err`: drop the connection, after sending
    /// the `Reject`, if any.
    pub fn handle_message(&self, m: Incoming, listening: impl Fn(u64) -> bool) -> Result<EndpointRepr, Refusal> {
        match m.map_err(|e| Refusal::silent(SetupError::Malformed(e)))? {
            Message::ConnectReq(req) if listening(req.nonce) => Ok(req),
            Message::ConnectReq(req) => Err(wrong_nonce(req.nonce)),
            other => Err(Refusal::silent(SetupError::Unexpected {
                state: "AwaitRequest",
                got: kind_name(&other),
            })),
        }
    }

    pub fn handle_timeout(&self, now: Time) -> Result<(), SetupError> {
        self.timer.check(now, "AwaitRequest")
    }
}

/// Our end is built and `ConnectResp` queued; the connector's `Ready` is awaited.
#[derive(Clone, Debug)]
pub struct AwaitReady {
    nonce: u64,
    timer: StateTimer,
}

impl AwaitReady {
    /// A message from the connector: `Ok` = `Ready` with our nonce, the connection is up. A
    /// `Reject`: the connector gave up (see [`AwaitResponse::handle_failed`]).
    pub fn handle_message(&self, m: Incoming) -> Result<(), Refusal> {
        match m.map_err(|e| Refusal::silent(SetupError::Malformed(e)))? {
            Message::Ready { nonce } if nonce == self.nonce => Ok(()),
            Message::Ready { nonce } => Err(Refusal::silent(SetupError::WrongNonce { got: nonce })),
            Message::Reject { code, text } => Err(Refusal::silent(SetupError::ConnectorFailed {
                text: format!("{text} (code {code})"),
            })),
            other => Err(Refusal::silent(SetupError::Unexpected {
                state: "AwaitReady",
                got: kind_name(&other),
            })),
        }
    }

    pub fn handle_timeout(&self, now: Time) -> Result<(), SetupError> {
        self.timer.check(now, "AwaitReady")
    }
}

#[cfg(test)]
mod tests;
