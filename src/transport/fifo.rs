//! The CTS ("clear to send") FIFO: slot layout and tag matching (pure, no I/O, no unsafe).
//!
//! Spec §8.8. The receiver RDMA-writes `n` entries of 64 bytes (one per buffer of a grouped
//! receive) into slot `id mod 256` of the sender's FIFO. The sender consumes slots strictly in
//! order; a slot is posted when entry 0 carries `idx == counter + 1`, and complete when all
//! `nreqs` entries carry that stamp (they travel in one RDMA write but may land piecewise).
//! Tags pick the buffer *inside* the oldest slot; there is no matching across slots.
//!
//! Entry layout (little-endian on the wire; both ends convert, so it is a no-op on LE hosts):
//!
//! | field | type | off |
//! |---|---|---|
//! | remote buffer address | u64 | 0 |
//! | posted size | u64 | 8 |
//! | rkey per member device | u32 × 8 | 16 |
//! | nreqs | u32 | 48 |
//! | tag | u32 | 52 |
//! | idx (posting counter + 1) | u64 | 56 |
//!
//! Everything a peer writes is validated here ([`check_slot`]); nothing panics on bad input.

/// Slots in the FIFO (NCCL_NET_MAX_REQUESTS 32 × maxRecvs 8).
pub const SLOTS: usize = 256;
/// Most buffers in one grouped receive (the `maxRecvs` we report).
pub const MAX_RECVS: usize = 8;
/// Most member devices of a fused device (v12 `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS: usize = 8;
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 64;
/// Bytes of the whole FIFO (128 KiB).
pub const FIFO_BYTES: usize = SLOTS * MAX_RECVS * ENTRY_BYTES;

/// One CTS entry exactly as it sits in registered memory.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    pub addr: u64,
    pub size: u64,
    pub rkeys: [u32; MAX_DEVS],
    pub nreqs: u32,
    pub tag: u32,
    pub idx: u64,
}

const _: () = assert!(std::mem::size_of::<CtsEntry>() == ENTRY_BYTES);
const _: () = assert!(std::mem::align_of::<CtsEntry>() >= 32);

impl CtsEntry {
    /// The wire form (little-endian fields) of a host-order entry.
    pub fn to_wire(&self) -> CtsEntry {
        let mut rkeys = [0u32; MAX_DEVS];
        for (d, s) in rkeys.iter_mut().zip(self.rkeys.iter()) {
            *d = s.to_le();
        }
        CtsEntry {
            addr: self.addr.to_le(),
            size: self.size.to_le(),
            rkeys,
            nreqs: self.nreqs.to_le(),
            tag: self.tag.to_le(),
            idx: self.idx.to_le(),
        }
    }

    /// The host-order form of an entry read from the wire.
    pub fn from_wire(w: &CtsEntry) -> CtsEntry {
        let mut rkeys = [0u32; MAX_DEVS];
        for (d, s) in rkeys.iter_mut().zip(w.rkeys.iter()) {
            *d = u32::from_le(*s);
        }
        CtsEntry {
            addr: u64::from_le(w.addr),
            size: u64::from_le(w.size),
            rkeys,
            nreqs: u32::from_le(w.nreqs),
            tag: u32::from_le(w.tag),
            idx: u64::from_le(w.idx),
        }
    }
}

/// The stamp the receiver writes for posting counter `counter`.
pub fn stamp(counter: u64) -> u64 {
    counter.wrapping_add(1)
}

/// FIFO slot of posting counter `counter`.
pub fn slot_of(counter: u64) -> usize {
    (counter % SLOTS as u64) as usize
}

/// A peer wrote something that cannot be a CTS entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FifoError {
    /// `nreqs` outside 1..=8.
    BadCount(u32),
    /// Entries of one slot disagree on `nreqs`.
    CountMismatch { first: u32, entry: usize, got: u32 },
    /// A posted size that cannot be a buffer length.
    BadSize(u64),
}

impl std::fmt::Display for FifoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FifoError::BadCount(n) => write!(f, "CTS entry with nreqs={n} (must be 1..=8)"),
            FifoError::CountMismatch { first, entry, got } => {
                write!(f, "CTS entry {entry} has nreqs={got}, entry 0 has {first}")
            }
            FifoError::BadSize(s) => write!(f, "CTS entry with posted size {s}"),
        }
    }
}

/// State of the oldest FIFO slot as seen by the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Entry 0 does not carry the expected stamp: the receiver has not posted yet.
    NotPosted,
    /// Entry 0 is there but some of the other `n` entries have not landed yet.
    Incomplete,
    /// All `n` entries carry the stamp.
    Ready(usize),
}

/// Entry 0 alone: is the slot posted, and for how many buffers?
pub fn check_head(head: &CtsEntry, expected_idx: u64) -> Result<Option<usize>, FifoError> {
    if head.idx != expected_idx {
        return Ok(None);
    }
    if head.nreqs == 0 || head.nreqs as usize > MAX_RECVS {
        return Err(FifoError::BadCount(head.nreqs));
    }
    Ok(Some(head.nreqs as usize))
}

/// Validate a slot snapshot. `entries` holds at least `nreqs` of entry 0 (host order).
pub fn check_slot(entries: &[CtsEntry], expected_idx: u64) -> Result<SlotState, FifoError> {
    let Some(head) = entries.first() else {
        return Ok(SlotState::NotPosted);
    };
    let n = match check_head(head, expected_idx)? {
        None => return Ok(SlotState::NotPosted),
        Some(n) => n,
    };
    if entries.len() < n {
        return Ok(SlotState::Incomplete);
    }
    for (i, e) in entries[..n].iter().enumerate() {
        if e.idx != expected_idx {
            return Ok(SlotState::Incomplete);
        }
        if e.nreqs != head.nreqs {
            return Err(FifoError::CountMismatch {
                first: head.nreqs,
                entry: i,
                got: e.nreqs,
            });
        }
        if e.size > i64::MAX as u64 {
            return Err(FifoError::BadSize(e.size));
        }
    }
    Ok(SlotState::Ready(n))
}

/// The first entry of the slot not yet matched (bit `i` of `matched` set = entry `i` taken)
/// whose tag equals `tag`.
pub fn match_tag(entries: &[CtsEntry], matched: u8, tag: i32) -> Option<usize> {
    entries
        .iter()
        .take(MAX_RECVS)
        .enumerate()
        .find(|(i, e)| matched & (1u8 << i) == 0 && e.tag == tag as u32)
        .map(|(i, _)| i)
}

/// Mask with the low `n` bits set (all entries of an `n`-entry slot matched).
pub fn full_mask(n: usize) -> u8 {
    if n >= 8 {
        0xff
    } else {
        (1u8 << n) - 1
    }
}

/// Build the host-order entries for a grouped receive at posting counter `counter`.
/// `rkeys[i]` are the per-device rkeys of buffer `i`.
pub fn fill_slot(
    out: &mut [CtsEntry; MAX_RECVS],
    counter: u64,
    addrs: &[usize],
    sizes: &[usize],
    tags: &[i32],
    rkeys: &[[u32; MAX_DEVS]],
) -> usize {
    let n = addrs
        .len()
        .min(sizes.len())
        .min(tags.len())
        .min(rkeys.len())
        .min(MAX_RECVS);
    for i in 0..n {
        out[i] = CtsEntry {
            addr: addrs[i] as u64,
            size: sizes[i] as u64,
            rkeys: rkeys[i],
            nreqs: n as u32,
            tag: tags[i] as u32,
            idx: stamp(counter),
        };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(counter: u64, tags: &[i32]) -> [CtsEntry; MAX_RECVS] {
        let mut out = [CtsEntry::default(); MAX_RECVS];
        let n = tags.len();
        let addrs: Vec<usize> = (0..n).map(|i| 0x1000 * (i + 1)).collect();
        let sizes: Vec<usize> = (0..n).map(|i| 100 * (i + 1)).collect();
        let rkeys: Vec<[u32; MAX_DEVS]> = (0..n).map(|i| [i as u32 + 7; MAX_DEVS]).collect();
        assert_eq!(fill_slot(&mut out, counter, &addrs, &sizes, tags, &rkeys), n);
        out
    }

    #[test]
    fn layout_offsets() {
        let e = CtsEntry {
            addr: 0x0102030405060708,
            size: 0x1112131415161718,
            rkeys: [0x21222324; 8],
            nreqs: 0x31323334,
            tag: 0x41424344,
            idx: 0x5152535455565758,
        }
        .to_wire();
        // SAFETY-free byte view via the documented offsets.
        let bytes: [u8; 64] = {
            let mut b = [0u8; 64];
            b[0..8].copy_from_slice(&e.addr.to_ne_bytes());
            b[8..16].copy_from_slice(&e.size.to_ne_bytes());
            for i in 0..8 {
                b[16 + 4 * i..20 + 4 * i].copy_from_slice(&e.rkeys[i].to_ne_bytes());
            }
            b[48..52].copy_from_slice(&e.nreqs.to_ne_bytes());
            b[52..56].copy_from_slice(&e.tag.to_ne_bytes());
            b[56..64].copy_from_slice(&e.idx.to_ne_bytes());
            b
        };
        assert_eq!(bytes[0], 0x08);
        assert_eq!(bytes[8], 0x18);
        assert_eq!(bytes[16], 0x24);
        assert_eq!(bytes[48], 0x34);
        assert_eq!(bytes[52], 0x44);
        assert_eq!(bytes[56], 0x58);
        assert_eq!(std::mem::offset_of!(CtsEntry, size), 8);
        assert_eq!(std::mem::offset_of!(CtsEntry, rkeys), 16);
        assert_eq!(std::mem::offset_of!(CtsEntry, nreqs), 48);
        assert_eq!(std::mem::offset_of!(CtsEntry, tag), 52);
        assert_eq!(std::mem::offset_of!(CtsEntry, idx), 56);
        assert_eq!(CtsEntry::from_wire(&e).tag, 0x41424344);
    }

    #[test]
    fn slot_states() {
        let e = entries(41, &[3, 1, 2]);
        assert_eq!(check_slot(&e[..3], 41), Ok(SlotState::NotPosted));
        assert_eq!(check_slot(&e[..3], 42), Ok(SlotState::Ready(3)));
        // entry 2 not landed yet
        let mut partial = e;
        partial[2].idx = 0;
        assert_eq!(check_slot(&partial[..3], 42), Ok(SlotState::Incomplete));
        assert_eq!(check_slot(&e[..1], 42), Ok(SlotState::Incomplete));
        assert_eq!(check_slot(&[], 42), Ok(SlotState::NotPosted));
    }

    #[test]
    fn slot_garbage_rejected() {
        let mut e = entries(0, &[1, 2]);
        e[0].nreqs = 0;
        assert_eq!(check_slot(&e[..2], 1), Err(FifoError::BadCount(0)));
        e[0].nreqs = 9;
        assert_eq!(check_slot(&e[..2], 1), Err(FifoError::BadCount(9)));
        let mut e = entries(0, &[1, 2]);
        e[1].nreqs = 3;
        assert!(matches!(check_slot(&e[..2], 1), Err(FifoError::CountMismatch { .. })));
        let mut e = entries(0, &[1]);
        e[0].size = u64::MAX;
        assert_eq!(check_slot(&e[..1], 1), Err(FifoError::BadSize(u64::MAX)));
    }

    #[test]
    fn grouped_receive_shuffled_tags() {
        // Receiver posts tags [5, 2, 9, 2]; sends arrive in the order 2, 9, 2, 5.
        let e = entries(7, &[5, 2, 9, 2]);
        let mut matched = 0u8;
        let mut got = vec![];
        for tag in [2, 9, 2, 5] {
            let i = match_tag(&e[..4], matched, tag).expect("match");
            matched |= 1 << i;
            got.push(i);
        }
        assert_eq!(got, [1, 2, 3, 0]);
        assert_eq!(matched, full_mask(4));
        // A fifth send with any tag finds nothing.
        assert_eq!(match_tag(&e[..4], matched, 2), None);
        // An unknown tag never matches.
        assert_eq!(match_tag(&e[..4], 0, 77), None);
    }

    #[test]
    fn shuffled_property() {
        // Deterministic pseudo-random permutations: every send lands in the buffer posted with
        // its tag, each buffer exactly once.
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..1000 {
            let n = (rnd() % 8 + 1) as usize;
            let tags: Vec<i32> = (0..n).map(|_| (rnd() % 4) as i32).collect();
            let e = entries(rnd() % 1000, &tags);
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, (rnd() % (i as u64 + 1)) as usize);
            }
            let mut matched = 0u8;
            for &k in &order {
                let i = match_tag(&e[..n], matched, tags[k]).expect("match");
                assert_eq!(e[i].tag, tags[k] as u32);
                assert_eq!(matched & (1 << i), 0);
                matched |= 1 << i;
            }
            assert_eq!(matched, full_mask(n));
        }
    }

    #[test]
    fn stamps_and_slots() {
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(257), 1);
        assert_eq!(stamp(u64::MAX), 0);
        assert_eq!(full_mask(1), 1);
        assert_eq!(full_mask(8), 0xff);
        assert_eq!(FIFO_BYTES, 128 * 1024);
    }
}
