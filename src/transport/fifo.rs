//! The CTS ("clear to send") FIFO: slot layout and tag matching (pure, no I/O, no unsafe).
//!
//! Spec §8.8. The receiver RDMA-writes `n` entries of 64 bytes (one per buffer of a grouped
//! receive) into slot `id mod SLOTS` of the sender's FIFO. The sender consumes slots strictly in
//! order; a slot is posted when entry 0 carries the stamp `counter + 1`, and complete when all
//! `nreqs` entries carry it. Tags pick the buffer *inside* the oldest slot; there is no matching
//! across slots.
//!
//! An RDMA WRITE gives no ordering promise *inside* the written range (a NIC's DMA, or
//! softroce's `memcpy` on another thread, may store the stamp before the rest of the entry), so
//! every entry is **sealed**: a 32-bit check over all its other bytes, stamp included. The
//! sender loads the stamp alone first; once it matches, it reads the whole entry and accepts it
//! only if the seal verifies. An entry whose stamp matches but whose seal does not is *still
//! landing* and is read again later (never an error by itself).
//!
//! Entry layout (little-endian on the wire; both ends convert, so it is a no-op on LE hosts):
//!
//! | field | type | off |
//! |---|---|---|
//! | remote buffer address | u64 | 0 |
//! | posted size | u64 | 8 |
//! | rkey per member device | u32 × 8 | 16 |
//! | seal (check of every other byte) | u32 | 48 |
//! | tag | u32 | 52 |
//! | stamp: nreqs (bits 56..64) \| posting counter + 1 (bits 0..56) | u64 | 56 |
//!
//! Nothing here panics on any input.

/// Slots in the FIFO: NCCL never has more than NCCL_NET_MAX_REQUESTS (32) receives in flight
/// per comm (spec §7.6); the receiver refuses (retry later) beyond that.
pub const SLOTS: usize = 32;
/// Most buffers in one grouped receive (the `maxRecvs` we report).
pub const MAX_RECVS: usize = 8;
/// Most member devices of a fused device (v12 `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS: usize = 8;
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 64;
/// Bytes of one slot (8 entries).
pub const SLOT_BYTES: usize = MAX_RECVS * ENTRY_BYTES;
/// Bytes of the whole FIFO (16 KiB).
pub const FIFO_BYTES: usize = SLOTS * SLOT_BYTES;
/// Bits of the stamp holding the posting counter.
const IDX_MASK: u64 = (1 << 56) - 1;

/// One CTS entry exactly as it sits in registered memory.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    pub addr: u64,
    pub size: u64,
    pub rkeys: [u32; MAX_DEVS],
    pub seal: u32,
    pub tag: u32,
    pub stamp: u64,
}

const _: () = assert!(std::mem::size_of::<CtsEntry>() == ENTRY_BYTES);
const _: () = assert!(std::mem::align_of::<CtsEntry>() >= 32);
/// Byte offset of the stamp (the sender loads it alone first).
pub const STAMP_OFFSET: usize = 56;
const _: () = assert!(std::mem::offset_of!(CtsEntry, stamp) == STAMP_OFFSET);
/// Where, inside a slot whose entries have been consumed, a grouped transfer's n sizes (u32
/// LE) are kept: over entry 0's rkeys (bytes 16..48). The sender stages them there in its FIFO
/// (the source of the sizes write) and the receiver takes them there in its CTS staging (the
/// completion record `[slot]` is at `record address + slot × SLOT_BYTES`), so neither end
/// needs a separate array. Safe because a slot is written again only for the posting counter
/// SLOTS later, which the receiver posts after this slot's receive completed and was tested.
pub const SIZES_IN_SLOT: usize = std::mem::offset_of!(CtsEntry, rkeys);
const _: () = assert!(
    SIZES_IN_SLOT + MAX_RECVS * 4 <= 48,
    "sizes stay clear of seal, tag and stamp"
);

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

impl CtsEntry {
    /// A sealed entry (host order).
    pub fn new(addr: u64, size: u64, rkeys: [u32; MAX_DEVS], nreqs: usize, tag: i32, counter: u64) -> CtsEntry {
        let mut e = CtsEntry {
            addr,
            size,
            rkeys,
            seal: 0,
            tag: tag as u32,
            stamp: ((nreqs as u64 & 0xff) << 56) | (stamp(counter) & IDX_MASK),
        };
        e.seal = e.compute_seal();
        e
    }

    /// The check over every field but the seal itself.
    pub fn compute_seal(&self) -> u32 {
        let mut h = 0x243f_6a88_85a3_08d3u64;
        h = mix(h, self.addr);
        h = mix(h, self.size);
        for pair in self.rkeys.chunks(2) {
            h = mix(h, u64::from(pair[0]) | (u64::from(pair[1]) << 32));
        }
        h = mix(h, u64::from(self.tag));
        h = mix(h, self.stamp);
        (h ^ (h >> 32)) as u32
    }

    pub fn sealed(&self) -> bool {
        self.seal == self.compute_seal()
    }

    /// The posting counter + 1 this entry was written for (56 bits).
    pub fn idx(&self) -> u64 {
        self.stamp & IDX_MASK
    }

    /// Buffers of the grouped receive.
    pub fn nreqs(&self) -> usize {
        (self.stamp >> 56) as usize
    }

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
            seal: self.seal.to_le(),
            tag: self.tag.to_le(),
            stamp: self.stamp.to_le(),
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
            seal: u32::from_le(w.seal),
            tag: u32::from_le(w.tag),
            stamp: u64::from_le(w.stamp),
        }
    }
}

/// The stamp the receiver writes for posting counter `counter` (56 bits, never 0).
pub fn stamp(counter: u64) -> u64 {
    (counter.wrapping_add(1) & IDX_MASK).max(1)
}

/// Whether a raw (wire-order) stamp word announces posting counter `counter`.
pub fn stamp_matches(wire_stamp: u64, counter: u64) -> bool {
    u64::from_le(wire_stamp) & IDX_MASK == stamp(counter)
}

/// FIFO slot of posting counter `counter`.
pub fn slot_of(counter: u64) -> usize {
    (counter % SLOTS as u64) as usize
}

/// State of the oldest FIFO slot as seen by the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Entry 0 does not carry the expected stamp: the receiver has not posted yet.
    NotPosted,
    /// The stamp is there but some entry is not complete yet (seal fails, or an entry of the
    /// group has not landed): read again later.
    Landing,
    /// All `n` entries are there, sealed and consistent.
    Ready(usize),
}

/// Validate a slot snapshot (host order). `entries` holds the first `min(len, 8)` entries of
/// the slot, read after entry 0's stamp matched.
pub fn check_slot(entries: &[CtsEntry], counter: u64) -> SlotState {
    let Some(head) = entries.first() else {
        return SlotState::NotPosted;
    };
    if head.idx() != stamp(counter) {
        return SlotState::NotPosted;
    }
    let n = head.nreqs();
    if !head.sealed() || n == 0 || n > MAX_RECVS || entries.len() < n {
        return SlotState::Landing;
    }
    for e in &entries[..n] {
        if e.idx() != stamp(counter) || !e.sealed() || e.nreqs() != n || e.size > i64::MAX as u64 {
            return SlotState::Landing;
        }
    }
    SlotState::Ready(n)
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

/// Build the sealed host-order entries for a grouped receive at posting counter `counter`.
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
        out[i] = CtsEntry::new(addrs[i] as u64, sizes[i] as u64, rkeys[i], n, tags[i], counter);
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
        assert_eq!(std::mem::offset_of!(CtsEntry, size), 8);
        assert_eq!(std::mem::offset_of!(CtsEntry, rkeys), 16);
        assert_eq!(std::mem::offset_of!(CtsEntry, seal), 48);
        assert_eq!(std::mem::offset_of!(CtsEntry, tag), 52);
        assert_eq!(std::mem::offset_of!(CtsEntry, stamp), 56);
        let e = CtsEntry::new(
            0x0102030405060708,
            0x1112131415161718,
            [0x21222324; 8],
            3,
            0x41424344,
            0x55,
        );
        assert_eq!(e.nreqs(), 3);
        assert_eq!(e.idx(), 0x56);
        assert_eq!(e.stamp, (3 << 56) | 0x56);
        let w = e.to_wire();
        assert_eq!(CtsEntry::from_wire(&w), e);
        assert!(stamp_matches(w.stamp, 0x55));
        assert!(!stamp_matches(w.stamp, 0x56));
        assert!(e.sealed());
    }

    #[test]
    fn slot_states() {
        let e = entries(41, &[3, 1, 2]);
        assert_eq!(check_slot(&e[..3], 40), SlotState::NotPosted);
        assert_eq!(check_slot(&e[..3], 41), SlotState::Ready(3));
        // entry 2 not landed yet (old stamp)
        let mut partial = e;
        partial[2] = CtsEntry::default();
        assert_eq!(check_slot(&partial[..3], 41), SlotState::Landing);
        assert_eq!(check_slot(&e[..1], 41), SlotState::Landing);
        assert_eq!(check_slot(&[], 41), SlotState::NotPosted);
    }

    /// Regression (harness report 1): the stamp lands before the rest of the entry. Every mix
    /// of old and new bytes with the new stamp is "landing", never accepted, never an error.
    #[test]
    fn torn_entries_are_landing_not_corrupt() {
        let mut old = entries(41 - SLOTS as u64, &[9, 8, 7, 6, 5]);
        old[0] = CtsEntry::new(0xdead_0000, 77_777, [0x55; MAX_DEVS], 5, 9, 41 - SLOTS as u64);
        let new = entries(41, &[1, 2]);
        // Byte-level tearing of entry 0: take each prefix/suffix split and each 8-byte word.
        let to_bytes = |e: &CtsEntry| -> [u8; 64] {
            let w = e.to_wire();
            let mut b = [0u8; 64];
            b[0..8].copy_from_slice(&w.addr.to_ne_bytes());
            b[8..16].copy_from_slice(&w.size.to_ne_bytes());
            for i in 0..8 {
                b[16 + 4 * i..20 + 4 * i].copy_from_slice(&w.rkeys[i].to_ne_bytes());
            }
            b[48..52].copy_from_slice(&w.seal.to_ne_bytes());
            b[52..56].copy_from_slice(&w.tag.to_ne_bytes());
            b[56..64].copy_from_slice(&w.stamp.to_ne_bytes());
            b
        };
        let from_bytes = |b: &[u8; 64]| -> CtsEntry {
            let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
            let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
            CtsEntry::from_wire(&CtsEntry {
                addr: u64_at(0),
                size: u64_at(8),
                rkeys: std::array::from_fn(|i| u32_at(16 + 4 * i)),
                seal: u32_at(48),
                tag: u32_at(52),
                stamp: u64_at(56),
            })
        };
        let (ob, nb) = (to_bytes(&old[0]), to_bytes(&new[0]));
        for mask in 1u8..0x7f {
            // Words 0..7 new or old by mask bit; word 7 (the stamp) always new.
            let mut b = ob;
            for w in 0..8 {
                if w == 7 || mask & (1 << w) != 0 {
                    b[8 * w..8 * w + 8].copy_from_slice(&nb[8 * w..8 * w + 8]);
                }
            }
            let mut snap = new;
            snap[0] = from_bytes(&b);
            let st = check_slot(&snap[..2], 41);
            assert_eq!(st, SlotState::Landing, "torn mask {mask:#x} accepted");
        }
        // All new: ready.
        assert_eq!(check_slot(&new[..2], 41), SlotState::Ready(2));
        // nreqs 0 with the right idx: landing, not an error.
        let mut z = new;
        z[0].stamp &= IDX_MASK;
        assert_eq!(check_slot(&z[..2], 41), SlotState::Landing);
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
        assert_eq!(slot_of(SLOTS as u64 + 1), 1);
        assert_ne!(stamp(u64::MAX), 0);
        assert_ne!(stamp(IDX_MASK), 0, "the stamp never looks like zeroed memory");
        assert_eq!(full_mask(1), 1);
        assert_eq!(full_mask(8), 0xff);
        assert_eq!(FIFO_BYTES, 16 * 1024);
    }
}
