//! Side-channel frames: the 16-byte header ([`HeaderRepr`]), the messages ([`Message`]) whose
//! bodies the module docs of [`super`] list, and [`FrameReader`], which reassembles frames from
//! a byte stream. Parsing never panics: anything malformed is a [`WireError`].

use super::super::limits::MAX_QPS;
use super::{
    speaks, u16_at, u32_at, u64_at, EndpointRepr, WireError, CLOSE_VERSION, HEADER_BYTES, LINK_VERSION, MAX_BODY,
    WIRE_MAGIC,
};

mod field {
    use std::ops::Range;
    // frame header
    pub(super) const MAGIC: Range<usize> = 0..8;
    pub(super) const VERSION: Range<usize> = 8..10;
    pub(super) const KIND: usize = 10;
    pub(super) const LEN: Range<usize> = 12..16;
    // `Ready` body
    pub(super) const READY_NONCE: Range<usize> = 0..8;
    // `Reject` body: the code, then the text
    pub(super) const REJECT_CODE: Range<usize> = 0..4;
    pub(super) const REJECT_TEXT: usize = 4;
    // `RecoverHello` body: then `COUNT` u64s from `TAKEN`, then an endpoint
    pub(super) const HELLO_EPOCH: Range<usize> = 0..4;
    pub(super) const HELLO_HEAD: Range<usize> = 4..12;
    pub(super) const HELLO_COUNT: Range<usize> = 12..16;
    pub(super) const HELLO_TAKEN: usize = 16;
    // `RecoverReady` body
    pub(super) const READY_EPOCH: Range<usize> = 0..4;
    // route of `OnComm` (then the inner body) and `CommClosed`
    pub(super) const ROUTE_COMM: Range<usize> = 0..8;
    pub(super) const ROUTE_TO_RECV: usize = 8;
    pub(super) const ROUTE_INNER: usize = 9;
    pub(super) const ROUTE_END: usize = 12;
    // `RecvClosed` body: then `COUNT` u64s from `TAKEN`
    pub(super) const CLOSED_RECEIVES: Range<usize> = 0..8;
    pub(super) const CLOSED_IN_FLIGHT: Range<usize> = 8..12;
    pub(super) const CLOSED_COUNT: Range<usize> = 12..16;
    pub(super) const CLOSED_TAKEN: usize = 16;
}

/// The longest `Reject` text sent (bytes; a longer one is cut).
const REJECT_TEXT_MAX: usize = 1024;
/// Bytes of one completion count in a `RecoverHello`.
const TAKEN_BYTES: usize = 8;

/// Message kinds; unknown values are kept, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ConnectReq,
    ConnectResp,
    Ready,
    Reject,
    RecoverHello,
    RecoverReady,
    OnComm,
    CommClosed,
    RecvClosed,
    Unknown(u8),
}

/// Each known kind's code on the wire.
const KIND_CODES: [(Kind, u8); 9] = [
    (Kind::ConnectReq, 1),
    (Kind::ConnectResp, 2),
    (Kind::Ready, 3),
    (Kind::Reject, 4),
    (Kind::RecoverHello, 5),
    (Kind::RecoverReady, 6),
    (Kind::OnComm, 7),
    (Kind::CommClosed, 8),
    (Kind::RecvClosed, 9),
];

impl From<u8> for Kind {
    fn from(v: u8) -> Kind {
        KIND_CODES
            .iter()
            .find(|&&(_, code)| code == v)
            .map_or(Kind::Unknown(v), |&(k, _)| k)
    }
}

impl From<Kind> for u8 {
    fn from(k: Kind) -> u8 {
        match k {
            Kind::Unknown(x) => x,
            k => KIND_CODES
                .iter()
                .find(|&&(known, _)| known == k)
                .map_or(0, |&(_, code)| code),
        }
    }
}

/// A checked header: magic, version and length are valid, kind is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRepr {
    /// A wire version this build speaks.
    pub version: u16,
    pub kind: Kind,
    pub body_len: usize,
}

impl HeaderRepr {
    pub fn parse(b: &[u8]) -> Result<HeaderRepr, WireError> {
        if b.len() < HEADER_BYTES {
            return Err(WireError::Truncated {
                need: HEADER_BYTES,
                got: b.len(),
            });
        }
        let magic = u64_at(b, field::MAGIC);
        if magic != WIRE_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let v = u16_at(b, field::VERSION);
        if !speaks(v) {
            return Err(WireError::BadVersion(v));
        }
        let kind = Kind::from(b[field::KIND]);
        match kind {
            Kind::Unknown(k) => return Err(WireError::BadKind(k)),
            // Link frames exist from the version that has links.
            Kind::OnComm | Kind::CommClosed if v < LINK_VERSION => return Err(WireError::BadKind(b[field::KIND])),
            Kind::RecvClosed if v < CLOSE_VERSION => return Err(WireError::BadKind(b[field::KIND])),
            _ => {}
        }
        let len = u32_at(b, field::LEN);
        if len as usize > MAX_BODY {
            return Err(WireError::TooLong(len));
        }
        Ok(HeaderRepr {
            version: v,
            kind,
            body_len: len as usize,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + HEADER_BYTES, 0);
        let b = &mut out[start..];
        b[field::MAGIC].copy_from_slice(&WIRE_MAGIC.to_le_bytes());
        b[field::VERSION].copy_from_slice(&self.version.to_le_bytes());
        b[field::KIND] = self.kind.into();
        b[field::LEN].copy_from_slice(&(self.body_len as u32).to_le_bytes());
    }
}
/// Which comm of a shared link a frame is for: the id the connector gave it, and which end of
/// it receives the frame (the recv comm: from the send comm; else the other way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub comm: u64,
    pub to_recv: bool,
}

/// A whole side-channel message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    ConnectReq(EndpointRepr),
    ConnectResp(EndpointRepr),
    Ready {
        nonce: u64,
    },
    Reject {
        code: u32,
        text: String,
    },
    /// A recovery's Hello: its epoch, the sender's next FIFO entry (`head`), the receiver's
    /// completions taken per QP (`taken`, empty from a sender), and the new QPs.
    RecoverHello {
        epoch: u32,
        head: u64,
        taken: Vec<u64>,
        qps: Box<EndpointRepr>,
    },
    RecoverReady {
        epoch: u32,
    },
    /// On a shared link: `message` (a recovery message) for the comm `route` names.
    OnComm {
        route: Route,
        message: Box<Message>,
    },
    /// On a shared link: the sending end closed the comm `route` names.
    CommClosed {
        route: Route,
    },
    /// From a closing recv comm (version 7), before its QPs go: the receives it took
    /// (`receives`), the receives posted it never took (`in_flight`), and per QP the
    /// write-with-immediate completions it took since the connection was made (`taken`).
    RecvClosed {
        receives: u64,
        in_flight: u32,
        taken: Vec<u64>,
    },
}

/// Bytes of an `OnComm` body before the inner body, and of a `CommClosed` body.
const ROUTE_BYTES: usize = field::ROUTE_END;

fn emit_route(r: &Route, inner: u8, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + ROUTE_BYTES, 0);
    let b = &mut out[start..];
    b[field::ROUTE_COMM].copy_from_slice(&r.comm.to_le_bytes());
    b[field::ROUTE_TO_RECV] = u8::from(r.to_recv);
    b[field::ROUTE_INNER] = inner;
}

fn parse_route(body: &[u8]) -> Result<(Route, u8), WireError> {
    at_least(body, ROUTE_BYTES)?;
    let to_recv = match body[field::ROUTE_TO_RECV] {
        0 => false,
        1 => true,
        _ => return Err(WireError::BadField("link route direction")),
    };
    let comm = u64_at(body, field::ROUTE_COMM);
    Ok((Route { comm, to_recv }, body[field::ROUTE_INNER]))
}

/// `Truncated` unless `body` has at least `need` bytes.
fn at_least(body: &[u8], need: usize) -> Result<(), WireError> {
    if body.len() < need {
        return Err(WireError::Truncated { need, got: body.len() });
    }
    Ok(())
}

/// `Truncated` unless `body` has exactly `need` bytes.
fn exactly(body: &[u8], need: usize) -> Result<(), WireError> {
    if body.len() != need {
        return Err(WireError::Truncated { need, got: body.len() });
    }
    Ok(())
}

/// A message and the wire version its frame carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub version: u16,
    pub message: Message,
}

impl Message {
    /// Append header + body to `out`, as wire version `version`.
    pub fn emit(&self, version: u16, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        let kind = match self {
            Message::ConnectReq(e) => {
                e.emit(version, &mut body);
                Kind::ConnectReq
            }
            Message::ConnectResp(e) => {
                e.emit(version, &mut body);
                Kind::ConnectResp
            }
            Message::Ready { nonce } => {
                body.extend_from_slice(&nonce.to_le_bytes());
                Kind::Ready
            }
            Message::Reject { code, text } => {
                body.extend_from_slice(&code.to_le_bytes());
                let t = text.as_bytes();
                body.extend_from_slice(&t[..t.len().min(REJECT_TEXT_MAX)]);
                Kind::Reject
            }
            Message::RecoverHello {
                epoch,
                head,
                taken,
                qps,
            } => {
                body.extend_from_slice(&epoch.to_le_bytes());
                body.extend_from_slice(&head.to_le_bytes());
                body.extend_from_slice(&(taken.len() as u32).to_le_bytes());
                for t in taken {
                    body.extend_from_slice(&t.to_le_bytes());
                }
                qps.emit(version, &mut body);
                Kind::RecoverHello
            }
            Message::RecoverReady { epoch } => {
                body.extend_from_slice(&epoch.to_le_bytes());
                Kind::RecoverReady
            }
            Message::OnComm { route, message } => {
                let mut inner = Vec::new();
                message.emit(version, &mut inner);
                let inner_kind = inner[field::KIND];
                emit_route(route, inner_kind, &mut body);
                body.extend_from_slice(&inner[HEADER_BYTES..]);
                Kind::OnComm
            }
            Message::CommClosed { route } => {
                emit_route(route, 0, &mut body);
                Kind::CommClosed
            }
            Message::RecvClosed {
                receives,
                in_flight,
                taken,
            } => {
                body.extend_from_slice(&receives.to_le_bytes());
                body.extend_from_slice(&in_flight.to_le_bytes());
                body.extend_from_slice(&(taken.len() as u32).to_le_bytes());
                for t in taken {
                    body.extend_from_slice(&t.to_le_bytes());
                }
                Kind::RecvClosed
            }
        };
        HeaderRepr {
            version,
            kind,
            body_len: body.len(),
        }
        .emit(out);
        out.extend_from_slice(&body);
    }

    /// The body of a frame of `kind` at wire `version`.
    pub fn parse(version: u16, kind: Kind, body: &[u8]) -> Result<Message, WireError> {
        if matches!(kind, Kind::OnComm | Kind::CommClosed) && version < LINK_VERSION
            || kind == Kind::RecvClosed && version < CLOSE_VERSION
        {
            return Err(WireError::BadKind(kind.into()));
        }
        match kind {
            Kind::ConnectReq => Ok(Message::ConnectReq(EndpointRepr::parse(version, body)?)),
            Kind::ConnectResp => Ok(Message::ConnectResp(EndpointRepr::parse(version, body)?)),
            Kind::Ready => {
                exactly(body, field::READY_NONCE.end)?;
                Ok(Message::Ready {
                    nonce: u64_at(body, field::READY_NONCE),
                })
            }
            Kind::Reject => {
                at_least(body, field::REJECT_TEXT)?;
                Ok(Message::Reject {
                    code: u32_at(body, field::REJECT_CODE),
                    text: String::from_utf8_lossy(&body[field::REJECT_TEXT..]).into_owned(),
                })
            }
            Kind::RecoverHello => Message::parse_recover_hello(version, body),
            Kind::RecoverReady => {
                exactly(body, field::READY_EPOCH.end)?;
                Ok(Message::RecoverReady {
                    epoch: u32_at(body, field::READY_EPOCH),
                })
            }
            Kind::OnComm => Message::parse_on_comm(version, body),
            Kind::CommClosed => {
                exactly(body, ROUTE_BYTES)?;
                let (route, _) = parse_route(body)?;
                Ok(Message::CommClosed { route })
            }
            Kind::RecvClosed => Message::parse_recv_closed(body),
            Kind::Unknown(k) => Err(WireError::BadKind(k)),
        }
    }

    /// A `RecvClosed` body: a completion count no connection has is refused before the counts
    /// are read.
    fn parse_recv_closed(body: &[u8]) -> Result<Message, WireError> {
        at_least(body, field::CLOSED_TAKEN)?;
        let n = u32_at(body, field::CLOSED_COUNT) as usize;
        if n > MAX_QPS {
            return Err(WireError::BadField(
                "close completion count past the most QPs of a connection",
            ));
        }
        exactly(body, field::CLOSED_TAKEN + n * TAKEN_BYTES)?;
        let taken = (0..n)
            .map(|i| field::CLOSED_TAKEN + i * TAKEN_BYTES)
            .map(|at| u64_at(body, at..at + TAKEN_BYTES))
            .collect();
        Ok(Message::RecvClosed {
            receives: u64_at(body, field::CLOSED_RECEIVES),
            in_flight: u32_at(body, field::CLOSED_IN_FLIGHT),
            taken,
        })
    }

    /// A `RecoverHello` body: a completion count no connection has is refused before the
    /// counts are read.
    fn parse_recover_hello(version: u16, body: &[u8]) -> Result<Message, WireError> {
        at_least(body, field::HELLO_TAKEN)?;
        let n = u32_at(body, field::HELLO_COUNT) as usize;
        if n > MAX_QPS {
            return Err(WireError::BadField(
                "recovery completion count past the most QPs of a connection",
            ));
        }
        let end = field::HELLO_TAKEN + n * TAKEN_BYTES;
        at_least(body, end)?;
        let taken = (0..n)
            .map(|i| field::HELLO_TAKEN + i * TAKEN_BYTES)
            .map(|at| u64_at(body, at..at + TAKEN_BYTES))
            .collect();
        Ok(Message::RecoverHello {
            epoch: u32_at(body, field::HELLO_EPOCH),
            head: u64_at(body, field::HELLO_HEAD),
            taken,
            qps: Box::new(EndpointRepr::parse(version, &body[end..])?),
        })
    }

    /// An `OnComm` body: a comm's own messages travel on a link (its setup too); link frames
    /// do not nest.
    fn parse_on_comm(version: u16, body: &[u8]) -> Result<Message, WireError> {
        let (route, inner) = parse_route(body)?;
        let inner = match Kind::from(inner) {
            Kind::OnComm | Kind::CommClosed | Kind::Unknown(_) => return Err(WireError::BadField("link message kind")),
            k => k,
        };
        let message = Box::new(Message::parse(version, inner, &body[ROUTE_BYTES..])?);
        Ok(Message::OnComm { route, message })
    }
}

/// Incremental frame reassembly: feed bytes as they arrive, take whole messages out.
/// A bad header is reported as soon as its 16 bytes are in (no waiting for a body).
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Bytes the reader wants next (at least 1): the rest of the header or of the body.
    pub fn want(&self) -> usize {
        if self.buf.len() < HEADER_BYTES {
            return HEADER_BYTES - self.buf.len();
        }
        match HeaderRepr::parse(&self.buf) {
            Ok(h) => (HEADER_BYTES + h.body_len).saturating_sub(self.buf.len()).max(1),
            Err(_) => 1,
        }
    }

    /// Free the buffer's memory when it holds nothing (it grows again if bytes arrive).
    pub fn release_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        }
    }

    pub fn handle_bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The next whole message, `Ok(None)` while incomplete.
    pub fn poll_message(&mut self) -> Result<Option<Frame>, WireError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let h = HeaderRepr::parse(&self.buf)?;
        let total = HEADER_BYTES + h.body_len;
        if self.buf.len() < total {
            return Ok(None);
        }
        let m = Message::parse(h.version, h.kind, &self.buf[HEADER_BYTES..total]);
        self.buf.drain(..total);
        m.map(|message| {
            Some(Frame {
                version: h.version,
                message,
            })
        })
    }
}
