//! Connection handle and side-channel handshake wire formats (pure: no I/O, no unsafe; the
//! listener's address is a [`ListenAddr`], which the I/O layer converts to a socket address).
//!
//! Two levels, in the smoltcp style: fixed byte ranges in `mod field`, and `Repr` types with
//! `parse` (checked: after it no accessor can panic) and `emit`. Every integer is little-endian
//! except the TCP port in the handle, which is kept in network order like a `sockaddr`.
//!
//! # The handle (128 bytes, written by `listen`, delivered verbatim to `connect`)
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic [`HANDLE_MAGIC`] |
//! | 8 | 2 | oldest wire version the listener speaks ([`OLDEST_WIRE_VERSION`]) |
//! | 10 | 1 | address family: 4 or 6 |
//! | 11 | 1 | listener's member-device count (1..=8) |
//! | 12 | 2 | TCP port (big-endian) |
//! | 14 | 2 | newest wire version the listener speaks (0 in a version-4 handle: only 4) |
//! | 16 | 16 | IP address (IPv4 in the first 4 bytes) |
//! | 32 | 4 | IPv6 scope id |
//! | 40 | 8 | nonce: identifies this listener; the connector echoes it |
//! | 48 | 8 | the listener's process id (version 6 on; 0: none), to share a link with it |
//! | 64 | 8 | connect stage magic (0 as written by `listen`) |
//! | 72 | 8 | connect stage id (the connector's in-progress record) |
//!
//! # Side-channel frames
//!
//! Each frame is a 16-byte header — magic [`WIRE_MAGIC`] (u64), version (u16), kind (u8),
//! reserved (u8), body length (u32, at most [`MAX_BODY`]) — and a body:
//!
//! # Versions
//!
//! A connection runs one wire version, the connector's choice: the newest both ends speak
//! ([`HandleRepr::negotiate`]: the handle says which versions the listener speaks). The
//! connector's `ConnectReq` frame carries it and every later frame of the connection carries
//! the same. A version-4 build reads only the handle's first version field (4 here too), so it
//! connects at version 4; and a handle of a version-4 build says nothing newer, so a newer
//! connector speaks version 4 to it. What a version adds is used only on connections of that
//! version (an older peer gets the protocol it knows).
//!
//! * `ConnectReq` (connector → listener) and `ConnectResp` (listener → connector): an
//!   [`EndpointRepr`]: nonce, member devices (GID, LID, port, link layer, MTU, GID index, rkey,
//!   name), every QP (number, device), the FIFO / completion-record address, tc, sl, flags;
//!   from version 5 ([`EAGER_VERSION`]) a 16-byte trailer, the receiver's eager landing ring
//!   ([`EagerOffer`]: address u64, slot bytes u32, largest payload u32; zero: none); from
//!   version 6 ([`LINK_VERSION`]) 32 more bytes, the side-channel link ([`LinkOffer`]: process
//!   id, attach key, found key, comm id, each u64).
//! * `Ready` (connector → listener): the nonce; sent once the connector's QPs are in RTS.
//! * `Reject` (either way): a reason code and a UTF-8 text, sent before closing on a mismatch.
//! * `RecoverHello` (either way, after setup; `proto::recovery`): the epoch (u32), the
//!   sender's next FIFO entry (u64), the count n (u32) of the receiver's completions taken per
//!   QP and those n u64s (n = 0 from a sender), then the new QPs as an [`EndpointRepr`].
//! * `RecoverReady` (either way): the epoch (u32).
//! * `OnComm` (version 6, on a shared link, `proto::link`): a comm's message — the comm id
//!   (u64), whether it goes to the receiving end's recv comm (u8: 1) or send comm (0), the
//!   inner kind (u8: any but `OnComm` and `CommClosed`, so a comm is also set up over the
//!   link), 2 bytes zero, the inner body.
//! * `CommClosed` (version 6, on a shared link): the comm id (u64) and direction (u8) as in
//!   `OnComm`, 3 bytes zero: that end closed its comm.
//!
//! Anything else — wrong magic, version, kind, oversize length, inconsistent counts — is a
//! [`WireError`]; the listener WARNs and drops that TCP connection only.

use super::limits::{MAX_DEVS, MAX_QPS};

/// "ferroceH" handle magic.
pub const HANDLE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceH");
/// "ferroceW" frame magic.
pub const WIRE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceW");
/// "ferroceS" connect-stage magic (connector's bytes in the handle).
pub const STAGE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceS");
/// Newest wire version this build speaks (peers negotiate, see the module docs). 2: the receiver's completion record
/// `[slot]` lies `slot × fifo::SLOT_BYTES` past the advertised address (inside its CTS staging).
/// 3: the CTS FIFO is a ring of 64 entries (4 KiB) that groups fill in posting order (NCCL's
/// slots of 8 entries no longer); the completion record of the group at ring position `p`
/// lies `p × fifo::ENTRY_BYTES` past the advertised address. 4: the side channel also carries
/// `RecoverHello` and `RecoverReady` after setup (a peer of version 3 could not take part in a
/// recovery, so it is refused at setup with a clear reason). 5: versions are negotiated (the
/// handle's newest-version field). 6: one side-channel link per pair of processes, shared by
/// their comms (`proto::link`: the handle's process id, the endpoint's link trailer, `OnComm`
/// and `CommClosed` frames).
pub const WIRE_VERSION: u16 = 6;
/// Oldest wire version this build speaks.
pub const OLDEST_WIRE_VERSION: u16 = 4;
/// The first version with the eager path (`proto::eager`): the endpoint's eager trailer, the
/// eager bits of CTS entries, eager writes.
pub const EAGER_VERSION: u16 = 5;
/// Bytes of the endpoint's eager trailer.
const EAGER_TRAILER_BYTES: usize = 16;
/// The first version whose comms share one side-channel link per pair of processes.
pub const LINK_VERSION: u16 = 6;
/// Bytes of the endpoint's link trailer (after the eager one).
const LINK_TRAILER_BYTES: usize = 32;

/// The newest version this process speaks when `FERROCE_WIRE_VERSION` is `setting` (0: this
/// build's newest; else that, within the versions this build speaks).
pub fn local_max_version(setting: u16) -> u16 {
    match setting {
        0 => WIRE_VERSION,
        v => v.clamp(OLDEST_WIRE_VERSION, WIRE_VERSION),
    }
}

/// Whether this build speaks wire version `v`.
pub fn speaks(v: u16) -> bool {
    (OLDEST_WIRE_VERSION..=WIRE_VERSION).contains(&v)
}
/// Size of the handle NCCL allocates.
pub const HANDLE_BYTES: usize = 128;
/// Largest frame body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// Frame header bytes.
pub const HEADER_BYTES: usize = 16;
/// Bytes of one per-device record.
pub const DEV_BYTES: usize = 48;
/// Bytes of one per-QP record.
pub const QP_BYTES: usize = 8;
/// Longest device name carried (NUL-padded).
pub const NAME_BYTES: usize = 20;

mod field {
    use std::ops::Range;
    // handle
    pub const H_MAGIC: Range<usize> = 0..8;
    pub const H_VERSION: Range<usize> = 8..10;
    pub const H_FAMILY: usize = 10;
    pub const H_NDEVS: usize = 11;
    pub const H_PORT: Range<usize> = 12..14;
    pub const H_MAX_VERSION: Range<usize> = 14..16;
    pub const H_ADDR: Range<usize> = 16..32;
    pub const H_SCOPE: Range<usize> = 32..36;
    pub const H_NONCE: Range<usize> = 40..48;
    pub const H_PROCESS: Range<usize> = 48..56;
    pub const H_STAGE_MAGIC: Range<usize> = 64..72;
    pub const H_STAGE_ID: Range<usize> = 72..80;
    // frame header
    pub const F_MAGIC: Range<usize> = 0..8;
    pub const F_VERSION: Range<usize> = 8..10;
    pub const F_KIND: usize = 10;
    pub const F_LEN: Range<usize> = 12..16;
    // endpoint body
    pub const E_NONCE: Range<usize> = 0..8;
    pub const E_NDEVS: usize = 8;
    pub const E_TC: usize = 9;
    pub const E_SL: usize = 10;
    pub const E_FLAGS: usize = 11;
    pub const E_NQPS: Range<usize> = 12..14;
    pub const E_ADDR: Range<usize> = 16..24;
    pub const E_DEVS: usize = 24;
    // device record
    pub const D_GID: Range<usize> = 0..16;
    pub const D_LID: Range<usize> = 16..18;
    pub const D_PORT: usize = 18;
    pub const D_LINK: usize = 19;
    pub const D_MTU: usize = 20;
    pub const D_GID_INDEX: usize = 21;
    pub const D_RKEY: Range<usize> = 24..28;
    pub const D_NAME: Range<usize> = 28..48;
    // qp record
    pub const Q_QPN: Range<usize> = 0..4;
    pub const Q_DEV: usize = 4;
}

/// Why bytes were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    Truncated { need: usize, got: usize },
    BadMagic(u64),
    BadVersion(u16),
    BadKind(u8),
    TooLong(u32),
    BadField(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated { need, got } => write!(f, "truncated: need {need} bytes, got {got}"),
            WireError::BadMagic(m) => write!(f, "bad magic {m:#018x} (not a ferroce peer)"),
            WireError::BadVersion(v) => write!(
                f,
                "unsupported version {v} (this side speaks {OLDEST_WIRE_VERSION} to {WIRE_VERSION})"
            ),
            WireError::BadKind(k) => write!(f, "unknown message kind {k}"),
            WireError::TooLong(n) => write!(f, "message body of {n} bytes exceeds {MAX_BODY}"),
            WireError::BadField(s) => write!(f, "invalid field: {s}"),
        }
    }
}

fn u16_at(b: &[u8], r: std::ops::Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_le_bytes(a)
}
fn u32_at(b: &[u8], r: std::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], r: std::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}

// ---------------------------------------------------------------------------------------------
// Handle
// ---------------------------------------------------------------------------------------------

/// A listener's IP address and TCP port as the handle carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    V4 { ip: [u8; 4], port: u16 },
    V6 { ip: [u8; 16], port: u16, scope_id: u32 },
}

impl ListenAddr {
    pub fn port(&self) -> u16 {
        match *self {
            ListenAddr::V4 { port, .. } | ListenAddr::V6 { port, .. } => port,
        }
    }
}

/// What `listen` publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleRepr {
    pub addr: ListenAddr,
    pub ndevs: u8,
    pub nonce: u64,
    /// The wire versions the listener speaks: every one from `min_version` to `max_version`.
    pub min_version: u16,
    pub max_version: u16,
    /// The listener's process id (0: an older listener, or none): connects to it may share a
    /// link with other comms between the two processes.
    pub process: u64,
}

impl HandleRepr {
    /// Parse the listener part of a handle. The connect-stage bytes are ignored here. A
    /// handle is refused only when the listener speaks no version this build does.
    pub fn parse(h: &[u8; HANDLE_BYTES]) -> Result<HandleRepr, WireError> {
        let magic = u64_at(h, field::H_MAGIC);
        if magic != HANDLE_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let min_version = u16_at(h, field::H_VERSION);
        let max_version = match u16_at(h, field::H_MAX_VERSION) {
            0 => min_version,
            v => v,
        };
        if max_version < min_version {
            return Err(WireError::BadField("handle version range"));
        }
        if max_version.min(WIRE_VERSION) < min_version.max(OLDEST_WIRE_VERSION) {
            return Err(WireError::BadVersion(min_version));
        }
        let ndevs = h[field::H_NDEVS];
        if ndevs == 0 || ndevs as usize > MAX_DEVS {
            return Err(WireError::BadField("handle device count"));
        }
        let port = u16::from_be_bytes([h[field::H_PORT.start], h[field::H_PORT.start + 1]]);
        if port == 0 {
            return Err(WireError::BadField("handle port"));
        }
        let mut a = [0u8; 16];
        a.copy_from_slice(&h[field::H_ADDR]);
        let addr = match h[field::H_FAMILY] {
            4 => ListenAddr::V4 {
                ip: [a[0], a[1], a[2], a[3]],
                port,
            },
            6 => ListenAddr::V6 {
                ip: a,
                port,
                scope_id: u32_at(h, field::H_SCOPE),
            },
            _ => return Err(WireError::BadField("handle address family")),
        };
        Ok(HandleRepr {
            addr,
            ndevs,
            nonce: u64_at(h, field::H_NONCE),
            min_version,
            max_version,
            process: if max_version >= LINK_VERSION {
                u64_at(h, field::H_PROCESS)
            } else {
                0
            },
        })
    }

    /// The version a connector that speaks up to `local_max` runs with this listener: the
    /// newest both speak.
    pub fn negotiate(&self, local_max: u16) -> Result<u16, WireError> {
        let v = self.max_version.min(local_max).min(WIRE_VERSION);
        if speaks(v) && v >= self.min_version {
            Ok(v)
        } else {
            Err(WireError::BadVersion(self.max_version))
        }
    }

    /// Write a fresh handle (all other bytes zero, so no stage is recorded).
    pub fn emit(&self, h: &mut [u8; HANDLE_BYTES]) {
        h.fill(0);
        h[field::H_MAGIC].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        h[field::H_VERSION].copy_from_slice(&self.min_version.to_le_bytes());
        h[field::H_MAX_VERSION].copy_from_slice(&self.max_version.to_le_bytes());
        h[field::H_NDEVS] = self.ndevs;
        h[field::H_PORT].copy_from_slice(&self.addr.port().to_be_bytes());
        match self.addr {
            ListenAddr::V4 { ip, .. } => {
                h[field::H_FAMILY] = 4;
                h[field::H_ADDR.start..field::H_ADDR.start + 4].copy_from_slice(&ip);
            }
            ListenAddr::V6 { ip, scope_id, .. } => {
                h[field::H_FAMILY] = 6;
                h[field::H_ADDR].copy_from_slice(&ip);
                h[field::H_SCOPE].copy_from_slice(&scope_id.to_le_bytes());
            }
        }
        h[field::H_NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        h[field::H_PROCESS].copy_from_slice(&self.process.to_le_bytes());
    }
}

/// The connector's in-progress id stored in the handle, if any.
pub fn read_stage(h: &[u8; HANDLE_BYTES]) -> Option<u64> {
    (u64_at(h, field::H_STAGE_MAGIC) == STAGE_MAGIC).then(|| u64_at(h, field::H_STAGE_ID))
}

/// Record (`Some`) or clear (`None`) the connector's in-progress id in the handle.
pub fn write_stage(h: &mut [u8; HANDLE_BYTES], id: Option<u64>) {
    let (m, i) = match id {
        Some(i) => (STAGE_MAGIC, i),
        None => (0, 0),
    };
    h[field::H_STAGE_MAGIC].copy_from_slice(&m.to_le_bytes());
    h[field::H_STAGE_ID].copy_from_slice(&i.to_le_bytes());
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------

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
    Unknown(u8),
}

impl From<u8> for Kind {
    fn from(v: u8) -> Kind {
        match v {
            1 => Kind::ConnectReq,
            2 => Kind::ConnectResp,
            3 => Kind::Ready,
            4 => Kind::Reject,
            5 => Kind::RecoverHello,
            6 => Kind::RecoverReady,
            7 => Kind::OnComm,
            8 => Kind::CommClosed,
            x => Kind::Unknown(x),
        }
    }
}

impl From<Kind> for u8 {
    fn from(k: Kind) -> u8 {
        match k {
            Kind::ConnectReq => 1,
            Kind::ConnectResp => 2,
            Kind::Ready => 3,
            Kind::Reject => 4,
            Kind::RecoverHello => 5,
            Kind::RecoverReady => 6,
            Kind::OnComm => 7,
            Kind::CommClosed => 8,
            Kind::Unknown(x) => x,
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
        let magic = u64_at(b, field::F_MAGIC);
        if magic != WIRE_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let v = u16_at(b, field::F_VERSION);
        if !speaks(v) {
            return Err(WireError::BadVersion(v));
        }
        let kind = Kind::from(b[field::F_KIND]);
        match kind {
            Kind::Unknown(k) => return Err(WireError::BadKind(k)),
            // Link frames exist from the version that has links.
            Kind::OnComm | Kind::CommClosed if v < LINK_VERSION => return Err(WireError::BadKind(b[field::F_KIND])),
            _ => {}
        }
        let len = u32_at(b, field::F_LEN);
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
        b[field::F_MAGIC].copy_from_slice(&WIRE_MAGIC.to_le_bytes());
        b[field::F_VERSION].copy_from_slice(&self.version.to_le_bytes());
        b[field::F_KIND] = self.kind.into();
        b[field::F_LEN].copy_from_slice(&(self.body_len as u32).to_le_bytes());
    }
}

/// Link layer of a port as carried on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unknown(u8),
}

impl From<u8> for LinkLayer {
    fn from(v: u8) -> Self {
        match v {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            x => LinkLayer::Unknown(x),
        }
    }
}
impl From<LinkLayer> for u8 {
    fn from(v: LinkLayer) -> u8 {
        match v {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => 2,
            LinkLayer::Unknown(x) => x,
        }
    }
}

/// One member device of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevRepr {
    pub gid: [u8; 16],
    pub lid: u16,
    pub port: u8,
    pub link_layer: LinkLayer,
    /// `ibv_mtu` enum value, 1 (256) ..= 5 (4096).
    pub mtu: u8,
    pub gid_index: u8,
    /// Sender: rkey of its CTS FIFO. Receiver: rkey of its completion records.
    pub rkey: u32,
    pub name: [u8; NAME_BYTES],
}

impl DevRepr {
    pub fn name_str(&self) -> String {
        let end = self.name.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
    pub fn set_name(&mut self, s: &str) {
        self.name = [0; NAME_BYTES];
        let b = s.as_bytes();
        let n = b.len().min(NAME_BYTES - 1);
        self.name[..n].copy_from_slice(&b[..n]);
    }
}

/// One QP of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRepr {
    pub qpn: u32,
    /// Index into the endpoint's device list.
    pub dev: u8,
}

/// Flag: the connector splits every message over all QPs (NCCL_IB_SPLIT_DATA_ON_QPS=1).
pub const FLAG_SPLIT: u8 = 1;
/// Flag: active-standby (FERROCE_ACTIVE_STANDBY): the QP list ends with one probe QP per
/// member device after the first (member 1, 2, …), which carries no data; the data QPs come
/// first.
pub const FLAG_STANDBY: u8 = 2;

/// A receiver's eager landing ring (all zero: it offers none, or a sender's endpoint).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EagerOffer {
    /// Slot 0 (in the registered block whose rkeys the device records carry).
    pub landing: u64,
    /// Bytes per slot: header and payload, a multiple of 64.
    pub slot_bytes: u32,
    /// The largest payload a slot takes.
    pub max: u32,
}

impl EagerOffer {
    pub fn offered(&self) -> bool {
        self.slot_bytes != 0
    }
}

/// The side-channel link of a connection (version 6 on; all zero: none, or a recovery's QPs).
/// In a `ConnectReq` the connector asks: attach to its link `attach` (0: it has none to the
/// listener's process), or else make this TCP connection the link `found` (0: keep it to this
/// comm alone). In a `ConnectResp` the listener answers with the one it did (both 0: this comm
/// keeps the connection to itself). `comm` is the connector's id of the comm on the link,
/// echoed; `process` is the sender's process id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkOffer {
    pub process: u64,
    pub attach: u64,
    pub found: u64,
    pub comm: u64,
}

/// Which comm of a shared link a frame is for: the id the connector gave it, and which end of
/// it receives the frame (the recv comm: from the send comm; else the other way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub comm: u64,
    pub to_recv: bool,
}

/// Everything one side needs to know about the other to bring QPs up and move data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRepr {
    pub nonce: u64,
    pub tc: u8,
    pub sl: u8,
    pub flags: u8,
    /// Sender: CTS FIFO address. Receiver: completion-records address.
    pub addr: u64,
    pub devs: Vec<DevRepr>,
    pub qps: Vec<QpRepr>,
    /// Version 5 on: the receiver's eager landing ring.
    pub eager: EagerOffer,
    /// Version 6 on: the side-channel link.
    pub link: LinkOffer,
}

impl EndpointRepr {
    /// The probe QPs at the end of the QP list (active-standby; none otherwise).
    pub fn probe_count(&self) -> usize {
        if self.flags & FLAG_STANDBY != 0 {
            self.devs.len().saturating_sub(1)
        } else {
            0
        }
    }

    /// The QPs that carry data: the list before the probes.
    pub fn data_qp_count(&self) -> usize {
        self.qps.len().saturating_sub(self.probe_count())
    }

    /// Bytes of the body at wire `version`.
    pub fn buffer_len(&self, version: u16) -> usize {
        field::E_DEVS + self.devs.len() * DEV_BYTES + self.qps.len() * QP_BYTES + trailer_len(version)
    }

    /// The body of a frame of wire `version`.
    pub fn parse(version: u16, b: &[u8]) -> Result<EndpointRepr, WireError> {
        if b.len() < field::E_DEVS {
            return Err(WireError::Truncated {
                need: field::E_DEVS,
                got: b.len(),
            });
        }
        let ndevs = b[field::E_NDEVS] as usize;
        if ndevs == 0 || ndevs > MAX_DEVS {
            return Err(WireError::BadField("device count"));
        }
        let nqps = u16_at(b, field::E_NQPS) as usize;
        if nqps == 0 || nqps > MAX_QPS || nqps < ndevs {
            return Err(WireError::BadField("QP count"));
        }
        let need = field::E_DEVS + ndevs * DEV_BYTES + nqps * QP_BYTES + trailer_len(version);
        if b.len() != need {
            return Err(WireError::Truncated { need, got: b.len() });
        }
        let mut devs = Vec::with_capacity(ndevs);
        for i in 0..ndevs {
            let d = &b[field::E_DEVS + i * DEV_BYTES..field::E_DEVS + (i + 1) * DEV_BYTES];
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&d[field::D_GID]);
            let mut name = [0u8; NAME_BYTES];
            name.copy_from_slice(&d[field::D_NAME]);
            let mtu = d[field::D_MTU];
            if !(1..=5).contains(&mtu) {
                return Err(WireError::BadField("MTU"));
            }
            let link_layer = LinkLayer::from(d[field::D_LINK]);
            if let LinkLayer::Unknown(_) = link_layer {
                return Err(WireError::BadField("link layer"));
            }
            devs.push(DevRepr {
                gid,
                lid: u16_at(d, field::D_LID),
                port: d[field::D_PORT],
                link_layer,
                mtu,
                gid_index: d[field::D_GID_INDEX],
                rkey: u32_at(d, field::D_RKEY),
                name,
            });
        }
        let qbase = field::E_DEVS + ndevs * DEV_BYTES;
        let mut qps = Vec::with_capacity(nqps);
        for i in 0..nqps {
            let q = &b[qbase + i * QP_BYTES..qbase + (i + 1) * QP_BYTES];
            let qpn = u32_at(q, field::Q_QPN);
            if qpn == 0 || qpn >= 1 << 24 {
                return Err(WireError::BadField("QP number"));
            }
            let dev = q[field::Q_DEV];
            if dev as usize >= ndevs {
                return Err(WireError::BadField("QP device index"));
            }
            qps.push(QpRepr { qpn, dev });
        }
        let t = qbase + nqps * QP_BYTES;
        let link = if version >= LINK_VERSION {
            let l = t + EAGER_TRAILER_BYTES;
            LinkOffer {
                process: u64_at(b, l..l + 8),
                attach: u64_at(b, l + 8..l + 16),
                found: u64_at(b, l + 16..l + 24),
                comm: u64_at(b, l + 24..l + 32),
            }
        } else {
            LinkOffer::default()
        };
        let eager = if trailer_len(version) > 0 {
            let e = EagerOffer {
                landing: u64_at(b, t..t + 8),
                slot_bytes: u32_at(b, t + 8..t + 12),
                max: u32_at(b, t + 12..t + 16),
            };
            let whole = e.slot_bytes.is_multiple_of(64) && e.slot_bytes <= 4096;
            if !whole || e.max as usize + super::eager::EAGER_HEADER_BYTES > e.slot_bytes as usize && e.offered() {
                return Err(WireError::BadField("eager landing ring"));
            }
            e
        } else {
            EagerOffer::default()
        };
        Ok(EndpointRepr {
            nonce: u64_at(b, field::E_NONCE),
            tc: b[field::E_TC],
            sl: b[field::E_SL],
            flags: b[field::E_FLAGS],
            addr: u64_at(b, field::E_ADDR),
            devs,
            qps,
            eager,
            link,
        })
    }

    /// Append the body at wire `version` to `out` (the eager offer only from version 5).
    pub fn emit(&self, version: u16, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.buffer_len(version), 0);
        let b = &mut out[start..];
        b[field::E_NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        b[field::E_NDEVS] = self.devs.len() as u8;
        b[field::E_TC] = self.tc;
        b[field::E_SL] = self.sl;
        b[field::E_FLAGS] = self.flags;
        b[field::E_NQPS].copy_from_slice(&(self.qps.len() as u16).to_le_bytes());
        b[field::E_ADDR].copy_from_slice(&self.addr.to_le_bytes());
        for (i, dv) in self.devs.iter().enumerate() {
            let d = &mut b[field::E_DEVS + i * DEV_BYTES..field::E_DEVS + (i + 1) * DEV_BYTES];
            d[field::D_GID].copy_from_slice(&dv.gid);
            d[field::D_LID].copy_from_slice(&dv.lid.to_le_bytes());
            d[field::D_PORT] = dv.port;
            d[field::D_LINK] = dv.link_layer.into();
            d[field::D_MTU] = dv.mtu;
            d[field::D_GID_INDEX] = dv.gid_index;
            d[field::D_RKEY].copy_from_slice(&dv.rkey.to_le_bytes());
            d[field::D_NAME].copy_from_slice(&dv.name);
        }
        let qbase = field::E_DEVS + self.devs.len() * DEV_BYTES;
        for (i, qp) in self.qps.iter().enumerate() {
            let q = &mut b[qbase + i * QP_BYTES..qbase + (i + 1) * QP_BYTES];
            q[field::Q_QPN].copy_from_slice(&qp.qpn.to_le_bytes());
            q[field::Q_DEV] = qp.dev;
        }
        if trailer_len(version) > 0 {
            let t = qbase + self.qps.len() * QP_BYTES;
            b[t..t + 8].copy_from_slice(&self.eager.landing.to_le_bytes());
            b[t + 8..t + 12].copy_from_slice(&self.eager.slot_bytes.to_le_bytes());
            b[t + 12..t + 16].copy_from_slice(&self.eager.max.to_le_bytes());
        }
        if version >= LINK_VERSION {
            let l = qbase + self.qps.len() * QP_BYTES + EAGER_TRAILER_BYTES;
            let k = &self.link;
            for (i, v) in [k.process, k.attach, k.found, k.comm].into_iter().enumerate() {
                b[l + 8 * i..l + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Bytes of the endpoint's trailer at wire `version`.
fn trailer_len(version: u16) -> usize {
    match version {
        v if v >= LINK_VERSION => EAGER_TRAILER_BYTES + LINK_TRAILER_BYTES,
        v if v >= EAGER_VERSION => EAGER_TRAILER_BYTES,
        _ => 0,
    }
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
}

/// Bytes of an `OnComm` body before the inner body, and of a `CommClosed` body.
const ROUTE_BYTES: usize = 12;

fn emit_route(r: &Route, inner: u8, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.comm.to_le_bytes());
    out.extend_from_slice(&[u8::from(r.to_recv), inner, 0, 0]);
}

fn parse_route(body: &[u8]) -> Result<(Route, u8), WireError> {
    if body.len() < ROUTE_BYTES {
        return Err(WireError::Truncated {
            need: ROUTE_BYTES,
            got: body.len(),
        });
    }
    let to_recv = match body[8] {
        0 => false,
        1 => true,
        _ => return Err(WireError::BadField("link route direction")),
    };
    Ok((
        Route {
            comm: u64_at(body, 0..8),
            to_recv,
        },
        body[9],
    ))
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
                body.extend_from_slice(&t[..t.len().min(1024)]);
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
                let inner_kind = inner[field::F_KIND];
                emit_route(route, inner_kind, &mut body);
                body.extend_from_slice(&inner[HEADER_BYTES..]);
                Kind::OnComm
            }
            Message::CommClosed { route } => {
                emit_route(route, 0, &mut body);
                Kind::CommClosed
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
        if matches!(kind, Kind::OnComm | Kind::CommClosed) && version < LINK_VERSION {
            return Err(WireError::BadKind(kind.into()));
        }
        match kind {
            Kind::ConnectReq => Ok(Message::ConnectReq(EndpointRepr::parse(version, body)?)),
            Kind::ConnectResp => Ok(Message::ConnectResp(EndpointRepr::parse(version, body)?)),
            Kind::Ready => {
                if body.len() != 8 {
                    return Err(WireError::Truncated {
                        need: 8,
                        got: body.len(),
                    });
                }
                Ok(Message::Ready {
                    nonce: u64_at(body, 0..8),
                })
            }
            Kind::Reject => {
                if body.len() < 4 {
                    return Err(WireError::Truncated {
                        need: 4,
                        got: body.len(),
                    });
                }
                Ok(Message::Reject {
                    code: u32_at(body, 0..4),
                    text: String::from_utf8_lossy(&body[4..]).into_owned(),
                })
            }
            Kind::RecoverHello => {
                if body.len() < 16 {
                    return Err(WireError::Truncated {
                        need: 16,
                        got: body.len(),
                    });
                }
                let n = u32_at(body, 12..16) as usize;
                if n > MAX_QPS {
                    return Err(WireError::BadField(
                        "recovery completion count past the most QPs of a connection",
                    ));
                }
                let end = 16 + n * 8;
                if body.len() < end {
                    return Err(WireError::Truncated {
                        need: end,
                        got: body.len(),
                    });
                }
                Ok(Message::RecoverHello {
                    epoch: u32_at(body, 0..4),
                    head: u64_at(body, 4..12),
                    taken: (0..n).map(|i| u64_at(body, 16 + i * 8..24 + i * 8)).collect(),
                    qps: Box::new(EndpointRepr::parse(version, &body[end..])?),
                })
            }
            Kind::RecoverReady => {
                if body.len() != 4 {
                    return Err(WireError::Truncated {
                        need: 4,
                        got: body.len(),
                    });
                }
                Ok(Message::RecoverReady {
                    epoch: u32_at(body, 0..4),
                })
            }
            Kind::OnComm => {
                let (route, inner) = parse_route(body)?;
                // A comm's own messages travel on a link (its setup too); link frames do not nest.
                let inner = match Kind::from(inner) {
                    Kind::OnComm | Kind::CommClosed | Kind::Unknown(_) => {
                        return Err(WireError::BadField("link message kind"))
                    }
                    k => k,
                };
                let message = Box::new(Message::parse(version, inner, &body[ROUTE_BYTES..])?);
                Ok(Message::OnComm { route, message })
            }
            Kind::CommClosed => {
                if body.len() != ROUTE_BYTES {
                    return Err(WireError::Truncated {
                        need: ROUTE_BYTES,
                        got: body.len(),
                    });
                }
                let (route, _) = parse_route(body)?;
                Ok(Message::CommClosed { route })
            }
            Kind::Unknown(k) => Err(WireError::BadKind(k)),
        }
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

#[cfg(test)]
mod tests {
    #[test]
    fn recovery_messages_round_trip_and_a_lying_count_is_refused() {
        let qps = EndpointRepr {
            nonce: 0,
            tc: 0,
            sl: 0,
            flags: 0,
            addr: 0,
            devs: vec![DevRepr {
                gid: [7; 16],
                lid: 0,
                port: 1,
                link_layer: LinkLayer::Ethernet,
                mtu: 3,
                gid_index: 1,
                rkey: 0,
                name: [0; NAME_BYTES],
            }],
            qps: vec![QpRepr { qpn: 0x33, dev: 0 }],
            eager: EagerOffer::default(),
            link: LinkOffer::default(),
        };
        for m in [
            Message::RecoverHello {
                epoch: 3,
                head: 77,
                taken: vec![5, 1 << 40],
                qps: Box::new(qps.clone()),
            },
            Message::RecoverReady { epoch: 9 },
        ] {
            let mut out = Vec::new();
            m.emit(WIRE_VERSION, &mut out);
            let h = HeaderRepr::parse(&out).unwrap();
            assert_eq!(Message::parse(h.version, h.kind, &out[HEADER_BYTES..]).unwrap(), m);
        }
        let mut body = vec![0u8; 16];
        body[12..16].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert!(Message::parse(WIRE_VERSION, Kind::RecoverHello, &body).is_err());
        assert!(Message::parse(WIRE_VERSION, Kind::RecoverHello, &body[..10]).is_err());
        assert!(Message::parse(WIRE_VERSION, Kind::RecoverReady, &[1, 2]).is_err());
    }

    use super::*;

    fn endpoint(ndevs: usize, nqps: usize) -> EndpointRepr {
        let devs = (0..ndevs)
            .map(|i| {
                let mut d = DevRepr {
                    gid: [i as u8; 16],
                    lid: 0x100 + i as u16,
                    port: 1,
                    link_layer: LinkLayer::Ethernet,
                    mtu: 3,
                    gid_index: 3,
                    rkey: 0xabc0 + i as u32,
                    name: [0; NAME_BYTES],
                };
                d.set_name(&format!("softroce{i}"));
                d
            })
            .collect();
        let qps = (0..nqps)
            .map(|i| QpRepr {
                qpn: 0x11 + i as u32,
                dev: (i % ndevs) as u8,
            })
            .collect();
        EndpointRepr {
            nonce: 0x1234_5678_9abc_def0,
            tc: 106,
            sl: 3,
            flags: FLAG_SPLIT,
            addr: 0x7f00_dead_b000,
            devs,
            qps,
            eager: EagerOffer {
                landing: 0x7f00_dead_c000,
                slot_bytes: 256,
                max: 224,
            },
            link: LinkOffer {
                process: 9,
                attach: 0,
                found: 0x5eed,
                comm: 77,
            },
        }
    }

    #[test]
    fn handle_round_trip_v4_v6() {
        let mut fe80_1 = [0u8; 16];
        fe80_1[0] = 0xfe;
        fe80_1[1] = 0x80;
        fe80_1[15] = 1;
        for addr in [
            ListenAddr::V4 {
                ip: [127, 0, 40, 1],
                port: 45678,
            },
            ListenAddr::V6 {
                ip: fe80_1,
                port: 1000,
                scope_id: 3,
            },
        ] {
            let r = HandleRepr {
                addr,
                ndevs: 2,
                nonce: 77,
                min_version: OLDEST_WIRE_VERSION,
                max_version: WIRE_VERSION,
                process: 0xabc,
            };
            let mut h = [0xffu8; HANDLE_BYTES];
            r.emit(&mut h);
            assert_eq!(HandleRepr::parse(&h), Ok(r));
            assert_eq!(read_stage(&h), None);
            write_stage(&mut h, Some(5));
            assert_eq!(read_stage(&h), Some(5));
            assert_eq!(
                HandleRepr::parse(&h),
                Ok(r),
                "stage bytes do not disturb the listener part"
            );
            write_stage(&mut h, None);
            assert_eq!(read_stage(&h), None);
        }
    }

    /// A handle as a version-4 build writes it: version 4 at byte 8, nothing at 14..16.
    fn handle_of(min: u16, max: u16) -> [u8; HANDLE_BYTES] {
        let mut h = [0u8; HANDLE_BYTES];
        HandleRepr {
            addr: ListenAddr::V4 {
                ip: [127, 0, 0, 1],
                port: 9,
            },
            ndevs: 1,
            nonce: 1,
            min_version: min,
            max_version: max,
            process: 0,
        }
        .emit(&mut h);
        h
    }

    #[test]
    fn versions_are_negotiated_to_the_newest_both_ends_speak() {
        let mut v4_build = handle_of(4, 4);
        v4_build[14..16].fill(0);
        let listener = HandleRepr::parse(&v4_build).expect("a version-4 build's handle");
        assert_eq!((listener.min_version, listener.max_version), (4, 4));
        assert_eq!(
            listener.negotiate(WIRE_VERSION),
            Ok(4),
            "an older listener gets its version"
        );
        let ours = HandleRepr::parse(&handle_of(4, WIRE_VERSION)).unwrap();
        assert_eq!(ours.negotiate(WIRE_VERSION), Ok(WIRE_VERSION));
        assert_eq!(
            ours.negotiate(4),
            Ok(4),
            "a connector held at 4 (FERROCE_WIRE_VERSION=4)"
        );
        assert_eq!(
            &handle_of(4, WIRE_VERSION)[8..10],
            &[4, 0],
            "what a version-4 build checks"
        );
        let newer = HandleRepr::parse(&handle_of(4, 9)).expect("a newer build that still speaks 4");
        assert_eq!(newer.negotiate(WIRE_VERSION), Ok(WIRE_VERSION));
        assert_eq!(HandleRepr::parse(&handle_of(8, 9)), Err(WireError::BadVersion(8)));
        assert_eq!(local_max_version(0), WIRE_VERSION);
        assert_eq!(local_max_version(1), OLDEST_WIRE_VERSION);
        assert_eq!(local_max_version(99), WIRE_VERSION);
    }

    #[test]
    fn handle_literal_bytes() {
        let r = HandleRepr {
            addr: ListenAddr::V4 {
                ip: [10, 1, 2, 3],
                port: 4660,
            },
            ndevs: 1,
            nonce: 0x0102030405060708,
            min_version: 4,
            max_version: 5,
            process: 0,
        };
        let mut h = [0u8; HANDLE_BYTES];
        r.emit(&mut h);
        assert_eq!(&h[0..8], b"ferroceH");
        assert_eq!(&h[8..16], &[4, 0, 4, 1, 0x12, 0x34, 5, 0]);
        assert_eq!(&h[16..20], &[10, 1, 2, 3]);
        assert_eq!(&h[40..48], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert!(h[48..].iter().all(|&b| b == 0));
        // Version 6: the listener's process id at 48..56; a handle that says only 5 has none.
        let v6 = HandleRepr {
            max_version: 6,
            process: 0x1112131415161718,
            ..r
        };
        v6.emit(&mut h);
        assert_eq!(&h[14..16], &[6, 0]);
        assert_eq!(&h[48..56], &[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]);
        assert_eq!(HandleRepr::parse(&h), Ok(v6));
        h[14] = 5;
        assert_eq!(HandleRepr::parse(&h).map(|p| p.process), Ok(0));
    }

    #[test]
    fn handle_garbage_rejected() {
        let h = [0u8; HANDLE_BYTES];
        assert!(matches!(HandleRepr::parse(&h), Err(WireError::BadMagic(0))));
        let mut h = [0u8; HANDLE_BYTES];
        HandleRepr {
            addr: ListenAddr::V4 {
                ip: [1, 2, 3, 4],
                port: 5,
            },
            ndevs: 1,
            nonce: 0,
            min_version: OLDEST_WIRE_VERSION,
            max_version: WIRE_VERSION,
            process: 0,
        }
        .emit(&mut h);
        let mut bad = h;
        bad[8] = 9;
        bad[14] = 9;
        assert!(matches!(HandleRepr::parse(&bad), Err(WireError::BadVersion(9))));
        let mut bad = h;
        bad[8] = 5;
        bad[14] = 4;
        assert!(
            HandleRepr::parse(&bad).is_err(),
            "a version range that ends before it starts"
        );
        let mut bad = h;
        bad[10] = 5;
        assert!(HandleRepr::parse(&bad).is_err());
        let mut bad = h;
        bad[11] = 0;
        assert!(HandleRepr::parse(&bad).is_err());
        let mut bad = h;
        bad[12] = 0;
        bad[13] = 0;
        assert!(HandleRepr::parse(&bad).is_err());
    }

    #[test]
    fn endpoint_round_trip() {
        for (nd, nq) in [(1, 1), (2, 4), (8, 1024)] {
            let e = endpoint(nd, nq);
            let mut out = Vec::new();
            Message::ConnectReq(e.clone()).emit(WIRE_VERSION, &mut out);
            assert_eq!(out.len(), HEADER_BYTES + e.buffer_len(WIRE_VERSION));
            let mut r = FrameReader::default();
            // Byte-by-byte delivery.
            let mut got = None;
            for b in &out {
                assert!(r.want() >= 1);
                r.handle_bytes(std::slice::from_ref(b));
                if let Some(m) = r.poll_message().unwrap() {
                    got = Some(m);
                }
            }
            assert_eq!(got.map(|f| f.message), Some(Message::ConnectReq(e.clone())));
            assert_eq!(e.devs[0].name_str(), "softroce0");
        }
    }

    #[test]
    fn small_messages_round_trip() {
        for m in [
            Message::Ready { nonce: 9 },
            Message::Reject {
                code: 2,
                text: "nonce mismatch".into(),
            },
        ] {
            let mut out = Vec::new();
            m.emit(WIRE_VERSION, &mut out);
            let mut r = FrameReader::default();
            r.handle_bytes(&out);
            assert_eq!(
                r.poll_message().unwrap(),
                Some(Frame {
                    version: WIRE_VERSION,
                    message: m
                })
            );
            assert_eq!(r.poll_message().unwrap(), None);
        }
    }

    #[test]
    fn link_frames_round_trip_and_only_carry_a_comm_s_messages() {
        let route = Route {
            comm: 0x0102_0304_0506_0708,
            to_recv: true,
        };
        let on = Message::OnComm {
            route,
            message: Box::new(Message::RecoverReady { epoch: 3 }),
        };
        let mut out = Vec::new();
        on.emit(WIRE_VERSION, &mut out);
        // kind 7, body: comm, direction 1, inner kind 6 (RecoverReady), 2 zero bytes, epoch.
        assert_eq!(out[10], 7);
        assert_eq!(&out[16..], &[8, 7, 6, 5, 4, 3, 2, 1, 1, 6, 0, 0, 3, 0, 0, 0]);
        let closed = Message::CommClosed {
            route: Route {
                to_recv: false,
                ..route
            },
        };
        closed.emit(WIRE_VERSION, &mut out);
        let mut r = FrameReader::default();
        r.handle_bytes(&out);
        assert_eq!(r.poll_message().unwrap().map(|f| f.message), Some(on.clone()));
        assert_eq!(r.poll_message().unwrap().map(|f| f.message), Some(closed));
        // A link frame inside OnComm, a bad direction, and link frames before version 6.
        let mut body = out[16..32].to_vec();
        body[9] = 8;
        assert!(Message::parse(WIRE_VERSION, Kind::OnComm, &body).is_err());
        body[9] = 6;
        body[8] = 2;
        assert!(Message::parse(WIRE_VERSION, Kind::OnComm, &body).is_err());
        let mut v5 = Vec::new();
        on.emit(WIRE_VERSION, &mut v5);
        v5[8] = 5;
        assert_eq!(HeaderRepr::parse(&v5), Err(WireError::BadKind(7)));
        assert_eq!(
            Message::parse(5, Kind::CommClosed, &[0; 12]),
            Err(WireError::BadKind(8))
        );
    }

    #[test]
    fn the_link_trailer_follows_the_eager_one_from_version_6() {
        let e = endpoint(1, 2);
        for (v, trailer) in [(4u16, 0usize), (5, 16), (6, 48)] {
            let mut out = Vec::new();
            e.emit(v, &mut out);
            assert_eq!(out.len(), 24 + 48 + 2 * 8 + trailer);
            let back = EndpointRepr::parse(v, &out).unwrap();
            assert_eq!(back.link, if v >= 6 { e.link } else { LinkOffer::default() });
        }
    }

    #[test]
    fn frame_header_literal() {
        let mut out = Vec::new();
        Message::Ready { nonce: 1 }.emit(WIRE_VERSION, &mut out);
        assert_eq!(&out[..16], b"ferroceW\x06\x00\x03\x00\x08\x00\x00\x00");
        let mut out = Vec::new();
        Message::Ready { nonce: 1 }.emit(4, &mut out);
        assert_eq!(
            &out[..16],
            b"ferroceW\x04\x00\x03\x00\x08\x00\x00\x00",
            "a version-4 frame"
        );
    }

    #[test]
    fn garbage_frames_rejected_early() {
        // An HTTP request, NCCL's own socket magic, random bytes.
        let nccl = 0x564ab9f2fc4b9d6cu64.to_le_bytes();
        for junk in [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &nccl[..], &[0xffu8; 64][..]] {
            let mut r = FrameReader::default();
            r.handle_bytes(junk);
            if junk.len() >= HEADER_BYTES {
                assert!(r.poll_message().is_err());
            } else {
                assert_eq!(r.poll_message(), Ok(None));
            }
        }
        // Valid header, unknown kind / wrong version / oversize.
        let mut out = Vec::new();
        Message::Ready { nonce: 1 }.emit(WIRE_VERSION, &mut out);
        let mut k = out.clone();
        k[10] = 99;
        assert_eq!(HeaderRepr::parse(&k), Err(WireError::BadKind(99)));
        let mut v = out.clone();
        v[8] = 1;
        assert_eq!(
            HeaderRepr::parse(&v),
            Err(WireError::BadVersion(1)),
            "version 1 (records apart) is rejected"
        );
        v[8] = 2;
        assert_eq!(
            HeaderRepr::parse(&v),
            Err(WireError::BadVersion(2)),
            "version 2 (FIFO slots of 8 entries) is rejected"
        );
        let mut l = out.clone();
        l[12..16].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(matches!(HeaderRepr::parse(&l), Err(WireError::TooLong(_))));
    }

    #[test]
    fn the_eager_offer_travels_from_version_5_only() {
        let e = endpoint(1, 2);
        for (v, trailer) in [(4u16, 0usize), (5, 16)] {
            let mut body = Vec::new();
            e.emit(v, &mut body);
            assert_eq!(body.len(), 24 + DEV_BYTES + 2 * QP_BYTES + trailer, "version {v}");
            let back = EndpointRepr::parse(v, &body).expect("parses at its version");
            let want = if v >= EAGER_VERSION {
                e.eager
            } else {
                EagerOffer::default()
            };
            assert_eq!(back.eager, want, "version {v}");
            assert!(
                EndpointRepr::parse(9 - v, &body).is_err(),
                "a body of version {v} is not one of the other"
            );
        }
        let mut body = Vec::new();
        e.emit(5, &mut body);
        let t = body.len() - 16;
        assert_eq!(&body[t..t + 8], &0x7f00_dead_c000u64.to_le_bytes());
        assert_eq!(&body[t + 8..], &[0, 1, 0, 0, 224, 0, 0, 0]);
        let mut bad = body.clone();
        bad[t + 8] = 65;
        assert_eq!(
            EndpointRepr::parse(5, &bad),
            Err(WireError::BadField("eager landing ring"))
        );
        let mut bad = body;
        bad[t + 12] = 225;
        assert_eq!(
            EndpointRepr::parse(5, &bad),
            Err(WireError::BadField("eager landing ring")),
            "a payload past its slot"
        );
    }

    #[test]
    fn endpoint_inconsistent_rejected() {
        let e = endpoint(2, 4);
        let mut body = Vec::new();
        e.emit(WIRE_VERSION, &mut body);
        // Truncated.
        assert!(EndpointRepr::parse(WIRE_VERSION, &body[..body.len() - 1]).is_err());
        // Trailing junk.
        let mut long = body.clone();
        long.push(0);
        assert!(EndpointRepr::parse(WIRE_VERSION, &long).is_err());
        // QP pointing at a device that does not exist.
        let mut bad = body.clone();
        let qoff = 24 + 2 * DEV_BYTES + 4;
        bad[qoff] = 2;
        assert_eq!(
            EndpointRepr::parse(WIRE_VERSION, &bad),
            Err(WireError::BadField("QP device index"))
        );
        // QP number 0 / ≥ 2^24.
        let mut bad = body.clone();
        bad[24 + 2 * DEV_BYTES..24 + 2 * DEV_BYTES + 4].copy_from_slice(&(1u32 << 24).to_le_bytes());
        assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
        // MTU out of range.
        let mut bad = body.clone();
        bad[24 + 20] = 9;
        assert_eq!(EndpointRepr::parse(WIRE_VERSION, &bad), Err(WireError::BadField("MTU")));
        // Zero devices, too few QPs.
        let mut bad = body.clone();
        bad[8] = 0;
        assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
        let mut bad = body;
        bad[12..14].copy_from_slice(&1u16.to_le_bytes());
        assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
    }

    #[test]
    fn fuzz_never_panics() {
        let mut seed = 0x2545f4914f6cdd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut good = Vec::new();
        Message::ConnectReq(endpoint(2, 4)).emit(WIRE_VERSION, &mut good);
        for _ in 0..20000 {
            let mut b = good.clone();
            let flips = rnd() % 4 + 1;
            for _ in 0..flips {
                let i = (rnd() as usize) % b.len();
                b[i] = rnd() as u8;
            }
            b.truncate((rnd() as usize) % (b.len() + 1));
            let mut r = FrameReader::default();
            r.handle_bytes(&b);
            let _ = r.poll_message();
            let _ = r.want();
            let mut h = [0u8; HANDLE_BYTES];
            for x in h.iter_mut() {
                *x = rnd() as u8;
            }
            let _ = HandleRepr::parse(&h);
        }
    }
}
