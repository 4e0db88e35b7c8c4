//! The NCCL connection handle: the [`HANDLE_BYTES`] bytes `listen` writes and NCCL delivers
//! verbatim to `connect` (layout: the table in [`super`]'s docs). The connector records its
//! in-progress stage in the handle's last bytes ([`read_stage`], [`write_stage`]).

use super::super::limits::MAX_DEVS;
use super::{
    speaks, u16_at, u32_at, u64_at, WireError, HANDLE_BYTES, HANDLE_MAGIC, LINK_VERSION, OLDEST_WIRE_VERSION,
    STAGE_MAGIC, WIRE_VERSION,
};

mod field {
    use std::ops::Range;
    pub(super) const MAGIC: Range<usize> = 0..8;
    pub(super) const VERSION: Range<usize> = 8..10;
    pub(super) const FAMILY: usize = 10;
    pub(super) const NDEVS: usize = 11;
    pub(super) const PORT: Range<usize> = 12..14;
    pub(super) const MAX_VERSION: Range<usize> = 14..16;
    pub(super) const ADDR: Range<usize> = 16..32;
    /// The first 4 bytes of `ADDR`: an IPv4 address.
    pub(super) const ADDR_V4: Range<usize> = 16..20;
    pub(super) const SCOPE: Range<usize> = 32..36;
    pub(super) const NONCE: Range<usize> = 40..48;
    pub(super) const PROCESS: Range<usize> = 48..56;
    pub(super) const STAGE_MAGIC: Range<usize> = 64..72;
    pub(super) const STAGE_ID: Range<usize> = 72..80;
    /// The listener's RoCE GIDs for subnet-aware routing, two of 16 bytes.
    pub(super) const LISTEN_GIDS: Range<usize> = 80..112;
}

/// Address family codes of the handle's family byte.
const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

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
        let magic = u64_at(h, field::MAGIC);
        if magic != HANDLE_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let min_version = u16_at(h, field::VERSION);
        let max_version = match u16_at(h, field::MAX_VERSION) {
            0 => min_version,
            v => v,
        };
        if max_version < min_version {
            return Err(WireError::BadField("handle version range"));
        }
        if max_version.min(WIRE_VERSION) < min_version.max(OLDEST_WIRE_VERSION) {
            return Err(WireError::BadVersion(min_version));
        }
        let ndevs = h[field::NDEVS];
        if ndevs == 0 || ndevs as usize > MAX_DEVS {
            return Err(WireError::BadField("handle device count"));
        }
        let port = u16::from_be_bytes([h[field::PORT][0], h[field::PORT][1]]);
        if port == 0 {
            return Err(WireError::BadField("handle port"));
        }
        let mut a = [0u8; 16];
        a.copy_from_slice(&h[field::ADDR]);
        let addr = match h[field::FAMILY] {
            FAMILY_V4 => ListenAddr::V4 {
                ip: [a[0], a[1], a[2], a[3]],
                port,
            },
            FAMILY_V6 => ListenAddr::V6 {
                ip: a,
                port,
                scope_id: u32_at(h, field::SCOPE),
            },
            _ => return Err(WireError::BadField("handle address family")),
        };
        Ok(HandleRepr {
            addr,
            ndevs,
            nonce: u64_at(h, field::NONCE),
            min_version,
            max_version,
            process: if max_version >= LINK_VERSION {
                u64_at(h, field::PROCESS)
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
        h[field::MAGIC].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        h[field::VERSION].copy_from_slice(&self.min_version.to_le_bytes());
        h[field::MAX_VERSION].copy_from_slice(&self.max_version.to_le_bytes());
        h[field::NDEVS] = self.ndevs;
        h[field::PORT].copy_from_slice(&self.addr.port().to_be_bytes());
        match self.addr {
            ListenAddr::V4 { ip, .. } => {
                h[field::FAMILY] = FAMILY_V4;
                h[field::ADDR_V4].copy_from_slice(&ip);
            }
            ListenAddr::V6 { ip, scope_id, .. } => {
                h[field::FAMILY] = FAMILY_V6;
                h[field::ADDR].copy_from_slice(&ip);
                h[field::SCOPE].copy_from_slice(&scope_id.to_le_bytes());
            }
        }
        h[field::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        h[field::PROCESS].copy_from_slice(&self.process.to_le_bytes());
    }
}

/// The connector's in-progress id stored in the handle, if any.
pub fn read_stage(h: &[u8; HANDLE_BYTES]) -> Option<u64> {
    (u64_at(h, field::STAGE_MAGIC) == STAGE_MAGIC).then(|| u64_at(h, field::STAGE_ID))
}

/// Record (`Some`) or clear (`None`) the connector's in-progress id in the handle.
pub fn write_stage(h: &mut [u8; HANDLE_BYTES], id: Option<u64>) {
    let (m, i) = match id {
        Some(i) => (STAGE_MAGIC, i),
        None => (0, 0),
    };
    h[field::STAGE_MAGIC].copy_from_slice(&m.to_le_bytes());
    h[field::STAGE_ID].copy_from_slice(&i.to_le_bytes());
}

/// The listener's RoCE GIDs in the handle (subnet-aware routing): two slots, all-zero when empty
/// (a listener without subnet-aware routing, on InfiniBand, or of an older build writes none).
pub fn read_listen_gids(h: &[u8; HANDLE_BYTES]) -> [[u8; 16]; 2] {
    let mut g = [[0u8; 16]; 2];
    for (i, slot) in g.iter_mut().enumerate() {
        let at = field::LISTEN_GIDS.start + 16 * i;
        slot.copy_from_slice(&h[at..at + 16]);
    }
    g
}

/// Write the first two of `gids` into the handle's GID slots (the rest stay zero).
pub fn write_listen_gids(h: &mut [u8; HANDLE_BYTES], gids: &[[u8; 16]]) {
    h[field::LISTEN_GIDS].fill(0);
    for (i, g) in gids.iter().take(2).enumerate() {
        let at = field::LISTEN_GIDS.start + 16 * i;
        h[at..at + 16].copy_from_slice(g);
    }
}
