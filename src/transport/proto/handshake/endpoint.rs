//! The endpoint record (the body of `ConnectReq` and `ConnectResp`, and the tail of
//! `RecoverHello`), in two levels: [`EndpointPacket`], a view over bytes whose ranges are named
//! in `mod field` (the fixed part, one device record, one QP record, the eager and the link
//! trailers), and [`EndpointRepr`] with `parse`, `emit` and `buffer_len`.
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | nonce |
//! | 8 | 1 | member devices n (1..=[`MAX_DEVS`]) |
//! | 9 | 1 | traffic class |
//! | 10 | 1 | service level |
//! | 11 | 1 | flags ([`FLAG_SPLIT`], [`FLAG_STANDBY`]) |
//! | 12 | 2 | QPs m (n..=[`MAX_QPS`]) |
//! | 16 | 8 | FIFO / completion-record address |
//! | 24 | n × [`DEV_BYTES`] | devices: GID 16, LID 2, port, link layer, MTU, GID index, 2 zero, rkey 4, name 20 |
//! | … | m × [`QP_BYTES`] | QP records: QP number 4, device index 1, 3 zero |
//! | … | 16 | version 5 on: eager trailer: landing address 8, slot bytes 4, largest payload 4 |
//! | … | 32 | version 6 on: link trailer: process 8, attach 8, found 8, comm 8 |

use super::super::eager::EAGER_HEADER_BYTES;
use super::super::limits::{MAX_DEVS, MAX_QPS};
use super::{u16_at, u32_at, u64_at, WireError, DEV_BYTES, EAGER_VERSION, LINK_VERSION, NAME_BYTES, QP_BYTES};

/// Bytes of the endpoint's eager trailer.
const EAGER_TRAILER_BYTES: usize = 16;
/// Bytes of the endpoint's link trailer (after the eager one).
const LINK_TRAILER_BYTES: usize = 32;

mod field {
    use std::ops::Range;
    // the fixed part
    pub(super) const NONCE: Range<usize> = 0..8;
    pub(super) const NDEVS: usize = 8;
    pub(super) const TC: usize = 9;
    pub(super) const SL: usize = 10;
    pub(super) const FLAGS: usize = 11;
    pub(super) const NQPS: Range<usize> = 12..14;
    pub(super) const ADDR: Range<usize> = 16..24;
    /// Where the device records start (the fixed part's length).
    pub(super) const DEVS: usize = 24;
    // a device record
    pub(super) const D_GID: Range<usize> = 0..16;
    pub(super) const D_LID: Range<usize> = 16..18;
    pub(super) const D_PORT: usize = 18;
    pub(super) const D_LINK: usize = 19;
    pub(super) const D_MTU: usize = 20;
    pub(super) const D_GID_INDEX: usize = 21;
    pub(super) const D_RKEY: Range<usize> = 24..28;
    pub(super) const D_NAME: Range<usize> = 28..48;
    // a QP record
    pub(super) const Q_QPN: Range<usize> = 0..4;
    pub(super) const Q_DEV: usize = 4;
    // the eager trailer (version 5 on), from its start
    pub(super) const E_LANDING: Range<usize> = 0..8;
    pub(super) const E_SLOT_BYTES: Range<usize> = 8..12;
    pub(super) const E_MAX: Range<usize> = 12..16;
    // the link trailer (version 6 on), from its start
    pub(super) const L_PROCESS: Range<usize> = 0..8;
    pub(super) const L_ATTACH: Range<usize> = 8..16;
    pub(super) const L_FOUND: Range<usize> = 16..24;
    pub(super) const L_COMM: Range<usize> = 24..32;
}
const _: () = assert!(field::D_NAME.end == DEV_BYTES && field::E_MAX.end == EAGER_TRAILER_BYTES);
const _: () = assert!(field::L_COMM.end == LINK_TRAILER_BYTES && field::Q_DEV < QP_BYTES);

/// `ibv_mtu` values a device record may carry: 1 (256 bytes) ..= 5 (4096).
const MTU_CODES: std::ops::RangeInclusive<u8> = 1..=5;
/// QP numbers are 24 bits; 0 is no QP.
const QPN_LIMIT: u32 = 1 << 24;
/// An eager slot is whole 64-byte lines, at most one page.
const EAGER_SLOT_ALIGN: u32 = 64;
const EAGER_SLOT_MAX: u32 = 4096;

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
}

/// A view of an endpoint record of wire `version` in `buffer`. After [`EndpointPacket::new_checked`]
/// no accessor panics: the counts are within bounds and the length is exactly theirs.
#[derive(Clone, Copy, Debug)]
pub struct EndpointPacket<T: AsRef<[u8]>> {
    buffer: T,
    version: u16,
}

/// Bytes of the endpoint's trailer at wire `version`.
fn trailer_len(version: u16) -> usize {
    match version {
        v if v >= LINK_VERSION => EAGER_TRAILER_BYTES + LINK_TRAILER_BYTES,
        v if v >= EAGER_VERSION => EAGER_TRAILER_BYTES,
        _ => 0,
    }
}

/// Bytes of a record of `ndevs` devices and `nqps` QPs at wire `version`.
fn record_len(version: u16, ndevs: usize, nqps: usize) -> usize {
    field::DEVS + ndevs * DEV_BYTES + nqps * QP_BYTES + trailer_len(version)
}

impl<T: AsRef<[u8]>> EndpointPacket<T> {
    /// A view without checks (to emit into a buffer of [`EndpointRepr::buffer_len`] bytes).
    pub fn new_unchecked(version: u16, buffer: T) -> EndpointPacket<T> {
        EndpointPacket { buffer, version }
    }

    /// A view whose accessors cannot panic: the fixed part is there, the device and QP counts
    /// are within bounds, and the length is exactly what they and `version`'s trailers take.
    pub fn new_checked(version: u16, buffer: T) -> Result<EndpointPacket<T>, WireError> {
        let p = EndpointPacket::new_unchecked(version, buffer);
        let b = p.buffer.as_ref();
        if b.len() < field::DEVS {
            return Err(WireError::Truncated {
                need: field::DEVS,
                got: b.len(),
            });
        }
        let (ndevs, nqps) = (p.ndevs(), p.nqps());
        if ndevs == 0 || ndevs > MAX_DEVS {
            return Err(WireError::BadField("device count"));
        }
        if nqps == 0 || nqps > MAX_QPS || nqps < ndevs {
            return Err(WireError::BadField("QP count"));
        }
        let need = record_len(version, ndevs, nqps);
        if b.len() != need {
            return Err(WireError::Truncated { need, got: b.len() });
        }
        Ok(p)
    }

    pub fn nonce(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::NONCE)
    }
    pub fn ndevs(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::NDEVS])
    }
    pub fn tc(&self) -> u8 {
        self.buffer.as_ref()[field::TC]
    }
    pub fn sl(&self) -> u8 {
        self.buffer.as_ref()[field::SL]
    }
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    pub fn nqps(&self) -> usize {
        usize::from(u16_at(self.buffer.as_ref(), field::NQPS))
    }
    pub fn addr(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::ADDR)
    }

    /// Offset of device record `i`.
    fn dev_at(&self, i: usize) -> usize {
        field::DEVS + i * DEV_BYTES
    }
    /// Offset of QP record `i`.
    fn qp_at(&self, i: usize) -> usize {
        self.dev_at(self.ndevs()) + i * QP_BYTES
    }
    /// Offset of the eager trailer (version 5 on), and of the link trailer after it.
    fn eager_at(&self) -> usize {
        self.qp_at(self.nqps())
    }
    fn link_at(&self) -> usize {
        self.eager_at() + EAGER_TRAILER_BYTES
    }

    /// Device record `i` (< `ndevs`).
    pub fn dev(&self, i: usize) -> &[u8] {
        let at = self.dev_at(i);
        &self.buffer.as_ref()[at..at + DEV_BYTES]
    }
    /// QP record `i` (< `nqps`).
    pub fn qp(&self, i: usize) -> &[u8] {
        let at = self.qp_at(i);
        &self.buffer.as_ref()[at..at + QP_BYTES]
    }
    /// The eager trailer (`None` before version 5).
    pub fn eager_trailer(&self) -> Option<&[u8]> {
        let at = self.eager_at();
        (self.version >= EAGER_VERSION).then(|| &self.buffer.as_ref()[at..at + EAGER_TRAILER_BYTES])
    }
    /// The link trailer (`None` before version 6).
    pub fn link_trailer(&self) -> Option<&[u8]> {
        let at = self.link_at();
        (self.version >= LINK_VERSION).then(|| &self.buffer.as_ref()[at..at + LINK_TRAILER_BYTES])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EndpointPacket<T> {
    /// Write the fixed part (the counts first: the records' offsets follow from them).
    fn set_fixed(&mut self, r: &EndpointRepr) {
        let b = self.buffer.as_mut();
        b[field::NONCE].copy_from_slice(&r.nonce.to_le_bytes());
        b[field::NDEVS] = r.devs.len() as u8;
        b[field::TC] = r.tc;
        b[field::SL] = r.sl;
        b[field::FLAGS] = r.flags;
        b[field::NQPS].copy_from_slice(&(r.qps.len() as u16).to_le_bytes());
        b[field::ADDR].copy_from_slice(&r.addr.to_le_bytes());
    }
    fn dev_mut(&mut self, i: usize) -> &mut [u8] {
        let at = self.dev_at(i);
        &mut self.buffer.as_mut()[at..at + DEV_BYTES]
    }
    fn qp_mut(&mut self, i: usize) -> &mut [u8] {
        let at = self.qp_at(i);
        &mut self.buffer.as_mut()[at..at + QP_BYTES]
    }
    fn eager_trailer_mut(&mut self) -> Option<&mut [u8]> {
        let (at, on) = (self.eager_at(), self.version >= EAGER_VERSION);
        on.then(|| &mut self.buffer.as_mut()[at..at + EAGER_TRAILER_BYTES])
    }
    fn link_trailer_mut(&mut self) -> Option<&mut [u8]> {
        let (at, on) = (self.link_at(), self.version >= LINK_VERSION);
        on.then(|| &mut self.buffer.as_mut()[at..at + LINK_TRAILER_BYTES])
    }
}

impl DevRepr {
    /// A checked device record: a known link layer and an MTU code `ibv_mtu` has.
    fn parse(d: &[u8]) -> Result<DevRepr, WireError> {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&d[field::D_GID]);
        let mut name = [0u8; NAME_BYTES];
        name.copy_from_slice(&d[field::D_NAME]);
        let mtu = d[field::D_MTU];
        if !MTU_CODES.contains(&mtu) {
            return Err(WireError::BadField("MTU"));
        }
        let link_layer = LinkLayer::from(d[field::D_LINK]);
        if let LinkLayer::Unknown(_) = link_layer {
            return Err(WireError::BadField("link layer"));
        }
        Ok(DevRepr {
            gid,
            lid: u16_at(d, field::D_LID),
            port: d[field::D_PORT],
            link_layer,
            mtu,
            gid_index: d[field::D_GID_INDEX],
            rkey: u32_at(d, field::D_RKEY),
            name,
        })
    }

    fn emit(&self, d: &mut [u8]) {
        d[field::D_GID].copy_from_slice(&self.gid);
        d[field::D_LID].copy_from_slice(&self.lid.to_le_bytes());
        d[field::D_PORT] = self.port;
        d[field::D_LINK] = self.link_layer.into();
        d[field::D_MTU] = self.mtu;
        d[field::D_GID_INDEX] = self.gid_index;
        d[field::D_RKEY].copy_from_slice(&self.rkey.to_le_bytes());
        d[field::D_NAME].copy_from_slice(&self.name);
    }
}

impl QpRepr {
    /// A checked QP record: a 24-bit QP number other than 0, on one of the `ndevs` devices.
    fn parse(q: &[u8], ndevs: usize) -> Result<QpRepr, WireError> {
        let qpn = u32_at(q, field::Q_QPN);
        if qpn == 0 || qpn >= QPN_LIMIT {
            return Err(WireError::BadField("QP number"));
        }
        let dev = q[field::Q_DEV];
        if usize::from(dev) >= ndevs {
            return Err(WireError::BadField("QP device index"));
        }
        Ok(QpRepr { qpn, dev })
    }

    fn emit(&self, q: &mut [u8]) {
        q[field::Q_QPN].copy_from_slice(&self.qpn.to_le_bytes());
        q[field::Q_DEV] = self.dev;
    }
}

impl EagerOffer {
    /// A checked eager trailer: whole lines of at most a page per slot, and an offered
    /// payload that fits its slot beside the header.
    fn parse(t: &[u8]) -> Result<EagerOffer, WireError> {
        let e = EagerOffer {
            landing: u64_at(t, field::E_LANDING),
            slot_bytes: u32_at(t, field::E_SLOT_BYTES),
            max: u32_at(t, field::E_MAX),
        };
        let whole = e.slot_bytes.is_multiple_of(EAGER_SLOT_ALIGN) && e.slot_bytes <= EAGER_SLOT_MAX;
        if !whole || e.max as usize + EAGER_HEADER_BYTES > e.slot_bytes as usize && e.offered() {
            return Err(WireError::BadField("eager landing ring"));
        }
        Ok(e)
    }

    fn emit(&self, t: &mut [u8]) {
        t[field::E_LANDING].copy_from_slice(&self.landing.to_le_bytes());
        t[field::E_SLOT_BYTES].copy_from_slice(&self.slot_bytes.to_le_bytes());
        t[field::E_MAX].copy_from_slice(&self.max.to_le_bytes());
    }
}

impl LinkOffer {
    fn parse(t: &[u8]) -> LinkOffer {
        LinkOffer {
            process: u64_at(t, field::L_PROCESS),
            attach: u64_at(t, field::L_ATTACH),
            found: u64_at(t, field::L_FOUND),
            comm: u64_at(t, field::L_COMM),
        }
    }

    fn emit(&self, t: &mut [u8]) {
        t[field::L_PROCESS].copy_from_slice(&self.process.to_le_bytes());
        t[field::L_ATTACH].copy_from_slice(&self.attach.to_le_bytes());
        t[field::L_FOUND].copy_from_slice(&self.found.to_le_bytes());
        t[field::L_COMM].copy_from_slice(&self.comm.to_le_bytes());
    }
}

impl EndpointRepr {
    /// Bytes of the body at wire `version`.
    pub fn buffer_len(&self, version: u16) -> usize {
        record_len(version, self.devs.len(), self.qps.len())
    }

    /// The body of a frame of wire `version`: the view's checks, then every record's.
    pub fn parse(version: u16, b: &[u8]) -> Result<EndpointRepr, WireError> {
        let p = EndpointPacket::new_checked(version, b)?;
        let devs = (0..p.ndevs())
            .map(|i| DevRepr::parse(p.dev(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let qps = (0..p.nqps())
            .map(|i| QpRepr::parse(p.qp(i), p.ndevs()))
            .collect::<Result<Vec<_>, _>>()?;
        let link = p.link_trailer().map_or(LinkOffer::default(), LinkOffer::parse);
        let eager = match p.eager_trailer() {
            Some(t) => EagerOffer::parse(t)?,
            None => EagerOffer::default(),
        };
        Ok(EndpointRepr {
            nonce: p.nonce(),
            tc: p.tc(),
            sl: p.sl(),
            flags: p.flags(),
            addr: p.addr(),
            devs,
            qps,
            eager,
            link,
        })
    }

    /// Append the body at wire `version` to `out` (the trailers only from their versions).
    pub fn emit(&self, version: u16, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.buffer_len(version), 0);
        let mut p = EndpointPacket::new_unchecked(version, &mut out[start..]);
        p.set_fixed(self);
        for (i, d) in self.devs.iter().enumerate() {
            d.emit(p.dev_mut(i));
        }
        for (i, q) in self.qps.iter().enumerate() {
            q.emit(p.qp_mut(i));
        }
        if let Some(t) = p.eager_trailer_mut() {
            self.eager.emit(t);
        }
        if let Some(t) = p.link_trailer_mut() {
            self.link.emit(t);
        }
    }
}
