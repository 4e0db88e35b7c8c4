//! The CTS ("clear to send") FIFO: a ring of entries, its allocation and tag matching (pure, no
//! I/O, no unsafe).
//!
//! docs/nccl-net-abi.md#data-path, with the FIFO cut to what NCCL really keeps in flight. The sender's FIFO is a ring
//! of [`RING`] 64-byte entries (4 KiB), and the receiver keeps a staging copy of the same shape.
//! A grouped receive of `n` buffers (posting counter `c`) takes the next `n` entries of the ring,
//! starting at absolute entry number `start` ([`RingAlloc`]); the receiver RDMA-writes them into
//! the sender's FIFO at the same positions, in two writes when the group straddles the end of
//! the ring ([`pieces`]). The sender consumes groups strictly in posting order: it expects group
//! `c` at its own `head` (the sum of the sizes of the groups before it), learns `n` from the head
//! entry's stamp, and accepts the group when all `n` entries carry the stamp of `c`
//! ([`read_group`]). Tags pick the buffer *inside* that group; there is no matching across
//! groups.
//!
//! The receiver frees ring space in posting order, once a group's receive has completed and
//! been reported (its completion implies the sender consumed the group, and every group before
//! it); when the ring has no room for `n` entries `irecv` says "retry later". [`RING`] = 64 =
//! NCCL_STEPS 8 × maxRecvs 8 holds NCCL's real peak, and ≥ 32 single receives.
//!
//! An RDMA WRITE gives no ordering promise *inside* the written range (a NIC's DMA, or
//! softroce's `memcpy` on another thread, may store the stamp before the rest of the entry), so
//! every entry is **sealed**: a 32-bit check over all its other bytes, stamp included. The
//! sender loads the stamp alone first; once it matches, it reads the whole entry and accepts it
//! only if the seal verifies. An entry whose stamp matches but whose seal does not is *still
//! landing* and is read again later (never an error by itself). The stamp carries the posting
//! counter (56 bits, never wraps in practice), so an entry left from an earlier lap of the ring
//! never passes for the one expected.
//!
//! Entry layout (little-endian on the wire; both ends convert, so it is a no-op on LE hosts):
//!
//! | field | type | off |
//! |---|---|---|
//! | remote buffer address | u64 | 0 |
//! | posted size (bits 0..40); eager credit (bits 40..64, wire version 5) | u64 | 8 |
//! | rkey per member device | u32 × 8 | 16 |
//! | seal (check of every other byte) | u32 | 48 |
//! | tag | u32 | 52 |
//! | stamp: eager-ok (bit 63, version 5) \| nreqs (bits 56..63) \| posting counter + 1 (bits 0..56) | u64 | 56 |
//!
//! The eager bits ([`super::eager`]): the credit is the count of eager messages the sender may
//! have sent (modulo 2^24), "eager-ok" marks a single receive into host memory, the only kind
//! an eager message can fill. A version-4 receiver leaves both zero.
//!
//! Nothing here panics on any input.

use super::limits::{MAX_DEVS, MAX_RECVS};

/// Entries in the ring: NCCL_STEPS (8) grouped receives of maxRecvs (8) buffers, NCCL's peak
/// per comm; 64 ≥ the 32 single receives NCCL_NET_MAX_REQUESTS allows. A power of two.
pub const RING: usize = 64;
/// Bytes per entry.
pub const ENTRY_BYTES: usize = 64;
/// Bytes of the whole ring (4 KiB, one page).
pub const RING_BYTES: usize = RING * ENTRY_BYTES;
/// Bits of the stamp holding the posting counter.
const IDX_MASK: u64 = (1 << NREQS_SHIFT) - 1;
/// The stamp's top byte: the group's buffer count (7 bits) from this bit.
const NREQS_SHIFT: u32 = 56;
const NREQS_MASK: u64 = 0x7f;
/// Bits of the size field holding the posted size (the rest carry the eager credit).
const SIZE_BITS: u32 = 40;
const SIZE_MASK: u64 = (1 << SIZE_BITS) - 1;
/// The stamp's eager-ok bit.
const EAGER_OK: u64 = 1 << 63;
const _: () = assert!(SIZE_BITS + super::eager::CREDIT_BITS <= 64);
const _: () = assert!(
    (super::limits::PIECES_PER_BUFFER * super::limits::MAX_WR_BYTES) as u64 <= SIZE_MASK,
    "every buffer's size fits"
);

const _: () = assert!(RING.is_power_of_two() && RING >= MAX_RECVS && RING <= 256);
// A named immediate carries a ring position in 6 bits (eager::Imm).
const _: () = assert!(RING <= 64, "a ring position fits 6 bits");

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
/// Where, inside the first entry of a group whose entries have been consumed, the grouped
/// transfer's n sizes (u32 LE) are kept: over that entry's rkeys (bytes 16..48). The sender
/// stages them there in its FIFO (the source of the sizes write) and the receiver takes them
/// there in its CTS staging (the completion record of the group at ring position `p` is at
/// `record address + p × ENTRY_BYTES`), so neither end needs a separate array. Safe because the
/// receiver reuses ring space only after the group's own receive completed (so after the sizes
/// write executed at the receiver) and was reported by `test` (so after the record was read);
/// a retransmitted duplicate of the sizes write is not executed again (IBTA C9-105).
pub const SIZES_IN_ENTRY: usize = std::mem::offset_of!(CtsEntry, rkeys);
const _: () = assert!(
    SIZES_IN_ENTRY + MAX_RECVS * 4 <= 48,
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
            stamp: ((nreqs as u64 & NREQS_MASK) << NREQS_SHIFT) | (stamp(counter) & IDX_MASK),
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
        ((self.stamp >> NREQS_SHIFT) & NREQS_MASK) as usize
    }

    /// The posted size of the buffer.
    pub fn posted_size(&self) -> u64 {
        self.size & SIZE_MASK
    }

    /// The eager credit the receiver granted when it wrote the entry (modulo 2^24).
    pub fn eager_credit(&self) -> u64 {
        self.size >> SIZE_BITS
    }

    /// A single receive into host memory: an eager message can fill it.
    pub fn eager_ok(&self) -> bool {
        self.stamp & EAGER_OK != 0
    }

    /// Add the eager credit and the eager-ok mark (wire version 5), sealed again.
    pub fn with_eager(mut self, credit: u64, eager_ok: bool) -> CtsEntry {
        self.size = (self.size & SIZE_MASK) | (super::eager::wrap_count(credit) << SIZE_BITS);
        self.stamp = (self.stamp & !EAGER_OK) | if eager_ok { EAGER_OK } else { 0 };
        self.seal = self.compute_seal();
        self
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

/// Ring position of absolute entry number `abs`.
pub fn ring_pos(abs: u64) -> usize {
    (abs % RING as u64) as usize
}

/// The one or two contiguous runs `(position, entries)` that the `n` entries starting at
/// absolute entry `start` occupy; the second run is empty unless the group straddles the end
/// of the ring (`n` is clamped to [`RING`]).
pub fn pieces(start: u64, n: usize) -> [(usize, usize); 2] {
    let n = n.min(RING);
    let pos = ring_pos(start);
    let first = n.min(RING - pos);
    [(pos, first), (0, n - first)]
}

/// State of the group the sender expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// The head entry does not carry the expected stamp: the receiver has not posted yet (or
    /// the entry there is left from an earlier lap of the ring).
    NotPosted,
    /// The stamp is there but some entry is not complete yet (seal fails, or an entry of the
    /// group has not landed): read again later.
    Landing,
    /// All `n` entries are there, sealed and consistent.
    Ready(usize),
}

/// Validate a group snapshot (host order). `entries` holds the group's first `min(len, 8)`
/// entries in ring order, read after the head entry's stamp matched.
pub fn check_group(entries: &[CtsEntry], counter: u64) -> GroupState {
    let Some(head) = entries.first() else {
        return GroupState::NotPosted;
    };
    if head.idx() != stamp(counter) {
        return GroupState::NotPosted;
    }
    let n = head.nreqs();
    if !head.sealed() || n == 0 || n > MAX_RECVS || entries.len() < n {
        return GroupState::Landing;
    }
    for e in &entries[..n] {
        if e.idx() != stamp(counter) || !e.sealed() || e.nreqs() != n || e.posted_size() > i64::MAX as u64 {
            return GroupState::Landing;
        }
    }
    GroupState::Ready(n)
}

/// Whether the head entry, whose stamp does not announce group `counter`, can have been left
/// there by an honest receiver. Until the receiver writes group `counter` itself the entry
/// keeps what it held when the sender consumed it last (`left_over`: zeroed memory, or the
/// entry of the group that had it one lap earlier, always an older counter): no other group
/// takes this entry while the sender expects `counter` there (the receiver reuses an entry only
/// after its group's receive completed). So a counter from the future, or any change of the
/// stamp or seal word to another entry, is a stale, replayed or garbage write: `Some(the
/// counter + 1 it announces)`. `None`: not posted yet. Entries are compared in wire order.
pub fn impossible_head_entry(wire: &CtsEntry, left_over: &CtsEntry, counter: u64) -> Option<u64> {
    let idx = u64::from_le(wire.stamp) & IDX_MASK;
    let expected = stamp(counter);
    let changed = (wire.stamp, wire.seal) != (left_over.stamp, left_over.seal);
    (idx != expected && (idx > expected || changed)).then_some(idx)
}

/// The sender's read of group `counter`, expected at absolute entry `head` of its ring.
/// `load_stamp(pos)` loads the raw (wire-order) stamp word of the entry at ring position `pos`
/// alone; only when it announces `counter` are the group's entries loaded with `load(pos)`
/// (wire order), in ring order (wrapping past the end), into `out`. On `Ready(n)` `out[..n]`
/// holds the group in host order.
pub fn read_group(
    head: u64,
    counter: u64,
    load_stamp: impl FnOnce(usize) -> u64,
    mut load: impl FnMut(usize) -> CtsEntry,
    out: &mut [CtsEntry; MAX_RECVS],
) -> GroupState {
    let wire_stamp = load_stamp(ring_pos(head));
    if !stamp_matches(wire_stamp, counter) {
        return GroupState::NotPosted;
    }
    let n = (((u64::from_le(wire_stamp) >> NREQS_SHIFT) & NREQS_MASK) as usize).clamp(1, MAX_RECVS);
    for (i, e) in out.iter_mut().enumerate().take(n) {
        *e = CtsEntry::from_wire(&load(ring_pos(head.wrapping_add(i as u64))));
    }
    check_group(&out[..n], counter)
}

/// The receiver's allocation of ring entries: groups take entries in posting order and give
/// them back in posting order (a group's entries are reusable once it and every group posted
/// before it were released).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingAlloc {
    /// Absolute number of the next entry to hand out.
    tail: u64,
    /// Absolute number of the oldest entry not free yet (`tail - head` ≤ RING).
    head: u64,
    /// Ring positions of entries in `[head, tail)` whose group was released.
    done: u64,
    /// Entries before this one the sender is known to have read (none is freed past it).
    proven: u64,
}

const _: () = assert!(RING <= 64, "RingAlloc::done has one bit per entry");

impl RingAlloc {
    /// Entries in use (posted and not freed).
    pub fn in_use(&self) -> usize {
        (self.tail - self.head) as usize
    }

    /// Absolute entry number where the next group starts.
    pub fn next_start(&self) -> u64 {
        self.tail
    }

    /// Absolute number of the oldest entry in use (`next_start` when none is).
    pub fn oldest(&self) -> u64 {
        self.head
    }

    /// The absolute entry number of an entry in use, from its ring position (entries in use
    /// span at most RING consecutive numbers from the oldest one, so the position names one).
    pub fn abs_start(&self, pos: usize) -> u64 {
        self.head + ((pos as u64).wrapping_sub(self.head) % RING as u64)
    }

    /// Whether `n` (1..=RING) more entries are free.
    pub fn fits(&self, n: usize) -> bool {
        (1..=RING).contains(&n) && self.in_use() + n <= RING
    }

    /// Take `n` (1..=RING) entries: their absolute start, or `None` when the ring has no room
    /// (retry later).
    pub fn alloc(&mut self, n: usize) -> Option<u64> {
        if !self.fits(n) {
            return None;
        }
        let start = self.tail;
        self.tail += n as u64;
        Some(start)
    }

    /// The group of `n` entries at `start` completed: mark it, then free the longest prefix of
    /// released entries the sender is known to have read ([`RingAlloc::prove`]). A range that
    /// is not in use is ignored.
    pub fn release(&mut self, start: u64, n: usize) {
        let Some(end) = start.checked_add(n as u64) else {
            return;
        };
        if n == 0 || start < self.head || end > self.tail {
            return;
        }
        for a in start..end {
            self.done |= 1 << ring_pos(a);
        }
        self.free_prefix();
    }

    /// The sender has read every entry before `upto` (a completion of a group it sent, or its
    /// word in an eager header or a recovery): released entries up to there are free. Only
    /// entries in use count.
    pub fn prove(&mut self, upto: u64) {
        self.proven = self.proven.max(upto.min(self.tail));
        self.free_prefix();
    }

    fn free_prefix(&mut self) {
        while self.head < self.tail && self.head < self.proven && self.done & (1 << ring_pos(self.head)) != 0 {
            self.done &= !(1 << ring_pos(self.head));
            self.head += 1;
        }
    }
}

/// The first entry of the group not yet matched (bit `i` of `matched` set = entry `i` taken)
/// whose tag equals `tag`.
pub fn match_tag(entries: &[CtsEntry], matched: u8, tag: i32) -> Option<usize> {
    entries
        .iter()
        .take(MAX_RECVS)
        .enumerate()
        .find(|(i, e)| matched & (1u8 << i) == 0 && e.tag == tag as u32)
        .map(|(i, _)| i)
}

/// Mask with the low `n` bits set (all entries of an `n`-entry group matched).
pub fn full_mask(n: usize) -> u8 {
    if n >= 8 {
        0xff
    } else {
        (1u8 << n) - 1
    }
}

#[cfg(any(test, feature = "testing"))]
/// Build the sealed host-order entries for a grouped receive at posting counter `counter`.
/// `rkeys[i]` are the per-device rkeys of buffer `i`.
pub fn fill_group(
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
mod tests;
