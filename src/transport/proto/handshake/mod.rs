//! Connection handle and side-channel handshake wire formats (pure: no I/O, no unsafe; the
//! listener's address is a [`ListenAddr`], which the I/O layer converts to a socket address).
//!
//! One concept per file: [`handle`] (the NCCL connection handle), [`endpoint`] (the endpoint
//! record of `ConnectReq`, `ConnectResp` and `RecoverHello`), [`frame`] (frames, messages and
//! the incremental reader). Two levels, in the smoltcp style: fixed byte ranges in each file's
//! `mod field`, and `Repr` types with `parse` (checked: after it no accessor can panic) and
//! `emit`. Every integer is little-endian
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
//! | 80 | 32 | the listener's RoCE GIDs, two slots (zero: none; written with `NCCL_IB_SUBNET_AWARE_ROUTING`) |
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
//! * `RecvClosed` (version 7, recv comm → send comm, in an `OnComm` frame on a link or alone on
//!   a connection of its own, before the recv comm's QPs are destroyed): the receives it took
//!   (u64), the receives posted it never took (u32), the count n (u32) of QPs and, per QP, the
//!   write-with-immediate completions it took since the connection was made (n u64s).
//!
//! Anything else — wrong magic, version, kind, oversize length, inconsistent counts — is a
//! [`WireError`]; the listener WARNs and drops that TCP connection only.

pub mod endpoint;
pub mod frame;
pub mod handle;
#[cfg(test)]
mod tests;

pub use endpoint::{DevRepr, EagerOffer, EndpointRepr, LinkLayer, LinkOffer, QpRepr, FLAG_SPLIT, FLAG_STANDBY};
pub use frame::{FrameReader, Message, Route};
pub use handle::{read_listen_gids, read_stage, write_listen_gids, write_stage, HandleRepr, ListenAddr};
#[cfg(any(test, feature = "testing"))]
pub use {
    endpoint::EndpointPacket,
    frame::{Frame, HeaderRepr, Kind},
};

/// "ferroceH" handle magic.
pub const HANDLE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceH");
/// "ferroceW" frame magic.
pub const WIRE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceW");
/// "ferroceS" connect-stage magic (connector's bytes in the handle).
pub const STAGE_MAGIC: u64 = u64::from_le_bytes(*b"ferroceS");
/// Newest wire version this build speaks (peers negotiate, see the module docs). What each
/// version adds to the one before (docs/design/wire-versions.md):
/// * 2: completion records in the receiver's CTS staging, one per FIFO slot.
/// * 3: the CTS FIFO is a ring of [`super::fifo::RING`] entries; a group's record is at its first entry.
/// * 4: `RecoverHello` and `RecoverReady` frames after setup (the oldest version spoken).
/// * 5: the handle's newest-version field (negotiation); the eager trailer, bits and writes.
/// * 6: one link per pair of processes: the handle's process id, the link trailer, `OnComm`, `CommClosed`.
/// * 7: `RecvClosed`: a closing receiver says what it took, so the sender completes those sends.
pub const WIRE_VERSION: u16 = 7;
/// Oldest wire version this build speaks.
pub const OLDEST_WIRE_VERSION: u16 = 4;
/// The first version with the eager path (`proto::eager`): the endpoint's eager trailer, the
/// eager bits of CTS entries, eager writes.
pub const EAGER_VERSION: u16 = 5;
/// The first version whose comms share one side-channel link per pair of processes.
pub const LINK_VERSION: u16 = 6;
/// The first version whose closing receiver tells the sender what it took (`RecvClosed`).
pub const CLOSE_VERSION: u16 = 7;

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
