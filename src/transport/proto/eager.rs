//! The eager path (wire version 5): a small message goes to the receiver at once, without
//! waiting for its CTS, into a registered landing ring of [`SLOTS`] slots at the receiver; the
//! receiver copies it into the buffer it posts for it (pure rules and formats, no I/O).
//!
//! # Speculation, and the rule both ends apply
//!
//! Which receive a message belongs to is NCCL's order: the sender's k-th accepted message
//! fills, by tag, an entry of the oldest posted group that still has one. An eager message is
//! sent before the sender has seen that group's CTS, so it *claims* a group: the sender's next
//! unconsumed posting counter, plus one for every claim still open before it. The claim is
//! right when that group is a single receive with the message's tag into host memory (the
//! receiver marks such CTS entries [`super::fifo::CtsEntry::eager_ok`]); that is what NCCL
//! posts on a connection nearly always. Both ends decide every claim with [`binds`], on the
//! same inputs — the group's CTS entry (the receiver has it at `irecv`, the sender once it
//! lands in its FIFO), the message's tag and epoch, and whether an earlier claim of the same
//! epoch was refused — so they agree whatever the timing:
//!
//! * **bound**: the receiver copies the payload (at most the posted size) into the buffer and
//!   completes the receive; the sender completes the send once its write was acknowledged too,
//!   and consumes the group's CTS entry without writing anything.
//! * **refused**: the receiver drops the payload; every later claim of the same epoch is
//!   refused as well (a refusal means the sender's count of groups was off). The sender sends
//!   those messages again through the CTS path, in their order, and opens a new epoch only when
//!   none is left.
//!
//! The CTS of a claimed group is written as always (the receiver cannot know whether a claim is
//! on its way); it is how the sender learns the verdict, and it carries the receiver's eager
//! credit ([`super::fifo::CtsEntry::eager_credit`]).
//!
//! # Flow control
//!
//! Slot `s` takes eager message `s mod SLOTS`. The sender sends message `s` only while
//! `s < credit`, the count of messages the receiver has freed plus [`SLOTS`] as its latest CTS
//! entry says. The receiver grants that credit only with [`SLOTS`] receives spare on the eager
//! QP, so a write with immediate never finds none. An eager message consumed no ring entry of
//! the CTS FIFO; the group it filled frees its ring entries at the receiver once the sender has
//! provably consumed that CTS entry: a later eager header says how far the sender has read
//! (`head`), and a CTS-path completion implies every group before it was read.
//!
//! # Wire
//!
//! All eager messages go over QP 0 of the connection, so they arrive in order. The write with
//! immediate that carries one writes [`EAGER_HEADER_BYTES`] of header then the payload into its slot;
//! its immediate is [`IMM_EAGER`] | slot. The header always goes inline; the payload too when
//! both fit and it is host memory (never a GPU's: the CPU copies inline bytes at the post).
//! Header (little-endian):
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | claim: the posting counter of the group the message claims |
//! | 8 | 8 | head: the sender's next FIFO entry when it sent this (every entry before it read) |
//! | 16 | 4 | tag |
//! | 20 | 4 | payload bytes |
//! | 24 | 4 | epoch |
//! | 28 | 4 | sequence number (low 32 bits) |
//!
//! Nothing here panics on any input.

/// The immediate of a completing write on a version-5 connection. Every completion names the
/// receive it completes, by the ring position of its group's first CTS entry, so the receiver
/// never infers it from the order of completions on a QP (an eager message completes a receive
/// out of that order, and the groups after it are written before it is decided).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imm {
    /// An eager message in landing slot `slot`.
    Eager { slot: usize },
    /// A single receive's message of `size` bytes (< 2^24).
    Single { pos: usize, size: u32 },
    /// The sizes are in the completion record of the group at `pos` (a grouped receive, or a
    /// single message of 2^24 bytes or more).
    Record { pos: usize },
}

/// Flag of [`Imm::Record`].
const IMM_RECORD: u32 = 1 << 30;
const IMM_POS_SHIFT: u32 = 24;
/// The ring position's bits (6: [`super::fifo::RING`] ≤ 64) above [`IMM_POS_SHIFT`].
const IMM_POS_MASK: u32 = 0x3f;
/// The largest size an [`Imm::Single`] carries.
pub const IMM_SIZE_MAX: usize = (1 << IMM_POS_SHIFT) - 1;

impl Imm {
    pub fn to_u32(self) -> u32 {
        match self {
            Imm::Eager { slot } => IMM_EAGER | slot as u32,
            Imm::Single { pos, size } => ((pos as u32 & IMM_POS_MASK) << IMM_POS_SHIFT) | (size & IMM_SIZE_MAX as u32),
            Imm::Record { pos } => IMM_RECORD | ((pos as u32 & IMM_POS_MASK) << IMM_POS_SHIFT),
        }
    }

    pub fn parse(v: u32) -> Imm {
        let pos = ((v >> IMM_POS_SHIFT) & IMM_POS_MASK) as usize;
        if v & IMM_EAGER != 0 {
            Imm::Eager {
                slot: (v & !IMM_EAGER) as usize,
            }
        } else if v & IMM_RECORD != 0 {
            Imm::Record { pos }
        } else {
            Imm::Single {
                pos,
                size: v & IMM_SIZE_MAX as u32,
            }
        }
    }
}

/// Landing slots per connection, and eager messages in flight at most.
pub const SLOTS: usize = 16;
/// Bytes of the header in front of the payload in a slot.
pub const EAGER_HEADER_BYTES: usize = 32;
/// Immediate of an eager write: this bit and the slot. No other immediate has it: a single
/// message's immediate is its size, at most `i32::MAX` on a version-5 connection.
pub const IMM_EAGER: u32 = 1 << 31;
/// The QP index every eager message uses (in order, so they complete in order).
pub const EAGER_QP: usize = 0;
/// Bits of the credit a CTS entry carries (the count of messages, modulo 2^24).
pub const CREDIT_BITS: u32 = 24;
/// The largest `FERROCE_EAGER_MAX`: a slot is one page at most.
pub const MAX_EAGER_BYTES: usize = 4096 - EAGER_HEADER_BYTES;

const _: () = assert!(SLOTS.is_power_of_two() && SLOTS <= 64);

/// Bytes of one landing slot for payloads of up to `eager_max` bytes (a multiple of 64).
pub fn slot_bytes(eager_max: usize) -> usize {
    (EAGER_HEADER_BYTES + eager_max.min(MAX_EAGER_BYTES)).next_multiple_of(64)
}

/// Bytes of the landing ring for payloads of up to `eager_max` bytes (0: no eager path).
pub fn ring_bytes(eager_max: usize) -> usize {
    if eager_max == 0 {
        0
    } else {
        SLOTS * slot_bytes(eager_max)
    }
}

/// The slot of eager message `seq`.
pub fn slot_of(seq: u64) -> usize {
    (seq % SLOTS as u64) as usize
}

/// An eager message's header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub claim: u64,
    pub head: u64,
    pub tag: i32,
    pub len: u32,
    pub epoch: u32,
    pub seq: u32,
}

impl Header {
    pub fn to_bytes(&self) -> [u8; EAGER_HEADER_BYTES] {
        let mut b = [0u8; EAGER_HEADER_BYTES];
        b[field::CLAIM].copy_from_slice(&self.claim.to_le_bytes());
        b[field::HEAD].copy_from_slice(&self.head.to_le_bytes());
        b[field::TAG].copy_from_slice(&self.tag.to_le_bytes());
        b[field::LEN].copy_from_slice(&self.len.to_le_bytes());
        b[field::EPOCH].copy_from_slice(&self.epoch.to_le_bytes());
        b[field::SEQ].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8; EAGER_HEADER_BYTES]) -> Header {
        let u32_at = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[r]);
            u32::from_le_bytes(a)
        };
        let u64_at = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        Header {
            claim: u64_at(field::CLAIM),
            head: u64_at(field::HEAD),
            tag: u32_at(field::TAG) as i32,
            len: u32_at(field::LEN),
            epoch: u32_at(field::EPOCH),
            seq: u32_at(field::SEQ),
        }
    }
}

/// The eager header's byte ranges (little-endian each).
mod field {
    use std::ops::Range;
    pub(super) const CLAIM: Range<usize> = 0..8;
    pub(super) const HEAD: Range<usize> = 8..16;
    pub(super) const TAG: Range<usize> = 16..20;
    pub(super) const LEN: Range<usize> = 20..24;
    pub(super) const EPOCH: Range<usize> = 24..28;
    pub(super) const SEQ: Range<usize> = 28..32;
}
const _: () = assert!(field::SEQ.end == EAGER_HEADER_BYTES);

/// What a group's CTS entry says about a claim on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupView {
    /// A single receive into host memory ([`super::fifo::CtsEntry::eager_ok`]).
    pub eager_ok: bool,
    pub tag: i32,
}

/// The rule: does a claim on `group` by a message with `tag` bind, when `epoch_refused` says
/// whether an earlier claim of the message's epoch was refused? Both ends call this.
pub fn binds(group: GroupView, tag: i32, epoch_refused: bool) -> bool {
    !epoch_refused && group.eager_ok && group.tag == tag
}

/// A message count carried in [`CREDIT_BITS`] bits, extended to the absolute count nearest
/// `near` (counts in flight differ by far less than 2^23).
pub fn extend_count(raw: u64, near: u64) -> u64 {
    let m = 1u64 << CREDIT_BITS;
    let low = near & (m - 1);
    let base = near - low;
    let raw = raw & (m - 1);
    let candidate = base + raw;
    if raw > low && raw - low > m / 2 {
        candidate.saturating_sub(m)
    } else if low > raw && low - raw > m / 2 {
        candidate + m
    } else {
        candidate
    }
}

/// A count as a CTS entry carries it.
pub fn wrap_count(count: u64) -> u64 {
    count & ((1 << CREDIT_BITS) - 1)
}

/// A few slot numbers in order (the sender's open claims, or its refused messages).
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotQueue {
    slots: [u8; SLOTS],
    head: u8,
    len: u8,
}

impl SlotQueue {
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `slot` (ignored when full: at most [`SLOTS`] messages are in flight).
    pub fn push(&mut self, slot: usize) {
        if self.len() < SLOTS {
            self.slots[(usize::from(self.head) + self.len()) % SLOTS] = slot as u8;
            self.len += 1;
        }
    }

    pub fn front(&self) -> Option<usize> {
        (!self.is_empty()).then(|| usize::from(self.slots[usize::from(self.head)]))
    }

    pub fn pop(&mut self) -> Option<usize> {
        let s = self.front()?;
        self.head = ((usize::from(self.head) + 1) % SLOTS) as u8;
        self.len -= 1;
        Some(s)
    }
}

/// The sender's side of the eager path: where the receiver's landing ring is, and what may be
/// sent there.
#[derive(Clone, Copy, Debug)]
pub struct EagerSendConfig {
    /// The largest payload sent eagerly (`FERROCE_EAGER_MAX`, at most what a slot holds).
    pub max: usize,
    /// The eager QP's `max_inline_data`: a message in host memory whose header and payload fit
    /// goes in one inline write; a larger one, or one in a GPU's memory (an inline post copies
    /// the payload with the CPU, which cannot read it), writes its payload first, then its
    /// header inline.
    pub inline_max: usize,
    /// Slot 0 of the receiver's landing ring, and its rkey per peer member device.
    pub landing: u64,
    pub landing_rkeys: [u32; super::limits::MAX_DEVS],
    pub slot_bytes: usize,
}

impl EagerSendConfig {
    /// Whether a message of `len` bytes goes in one inline write: it is in host memory (`host`)
    /// and fits with its header.
    pub fn inline(&self, host: bool, len: usize) -> bool {
        host && EAGER_HEADER_BYTES + len <= self.inline_max
    }
}

/// The sender's eager state.
#[derive(Clone, Debug)]
pub struct SenderState {
    pub cfg: EagerSendConfig,
    /// Eager messages sent; message `s` takes slot `s mod SLOTS`.
    pub sent: u64,
    /// Messages the receiver's latest CTS entry lets us have sent.
    pub credit: u64,
    /// The current epoch, and whether one of its claims was refused (then no claim is made
    /// until every message of it went through the CTS path, and a new epoch begins).
    pub epoch: u32,
    pub refused: bool,
    /// The last group consumed was a single receive into host memory: claims are worth making.
    pub last_ok: bool,
    /// Open claims, oldest first (claim `i` is on the group `counter + i`), and refused
    /// messages waiting for the CTS path, both as slots.
    pub claims: SlotQueue,
    pub deferred: SlotQueue,
    /// Per slot: the send request, its tag and header (kept for a replay), whether its payload
    /// is host memory (may go inline), whether its write was acknowledged, and whether the slot
    /// is taken (acknowledged and decided frees it).
    pub req: [u16; SLOTS],
    pub tag: [i32; SLOTS],
    pub hdr: [[u8; EAGER_HEADER_BYTES]; SLOTS],
    pub host: u32,
    pub acked: u32,
    pub busy: u32,
    /// Messages whose claim bound, and refused ones.
    pub bound: u64,
    pub refused_msgs: u64,
}

const _: () = assert!(SLOTS <= 32, "a bit per slot in a u32");

impl SenderState {
    pub fn new(cfg: EagerSendConfig) -> SenderState {
        SenderState {
            cfg,
            sent: 0,
            credit: 0,
            epoch: 0,
            refused: false,
            last_ok: false,
            claims: SlotQueue::default(),
            deferred: SlotQueue::default(),
            req: [0; SLOTS],
            tag: [0; SLOTS],
            hdr: [[0; EAGER_HEADER_BYTES]; SLOTS],
            host: 0,
            acked: 0,
            busy: 0,
            bound: 0,
            refused_msgs: 0,
        }
    }

    /// A CTS entry landed: its credit counts from now on.
    pub fn handle_credit(&mut self, raw: u64) {
        self.credit = self.credit.max(extend_count(raw, self.sent));
    }

    pub fn acked(&self, slot: usize) -> bool {
        self.acked & (1 << slot) != 0
    }

    /// Whether the next message may go now: credit, a free slot, no refusal pending, and a
    /// receiver that posts what a claim can fill.
    pub fn may_send(&self, len: usize) -> bool {
        len <= self.cfg.max
            && self.sent < self.credit
            && self.busy & (1 << slot_of(self.sent)) == 0
            && !self.refused
            && self.deferred.is_empty()
            && self.last_ok
    }

    /// Slot `slot` was decided (bound, or sent again through the CTS path): free once its
    /// write was acknowledged too.
    pub fn decided(&mut self, slot: usize) {
        if self.acked(slot) {
            self.busy &= !(1 << slot);
        }
    }

    /// Whether a refused message with `tag` still waits for the CTS path.
    pub fn deferred_tag(&self, tag: i32) -> bool {
        let q = &self.deferred;
        (0..q.len()).any(|k| self.tag[usize::from(q.slots[(usize::from(q.head) + k) % SLOTS])] == tag)
    }

    /// Whether slot `slot` is still to be decided (an open claim or a refused message).
    pub fn undecided(&self, slot: usize) -> bool {
        let open =
            |q: &SlotQueue| (0..q.len()).any(|k| usize::from(q.slots[(usize::from(q.head) + k) % SLOTS]) == slot);
        open(&self.claims) || open(&self.deferred)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_name_their_receive() {
        for imm in [
            Imm::Eager { slot: 15 },
            Imm::Single { pos: 63, size: 0 },
            Imm::Single {
                pos: 5,
                size: IMM_SIZE_MAX as u32,
            },
            Imm::Record { pos: 0 },
            Imm::Record { pos: 63 },
        ] {
            assert_eq!(Imm::parse(imm.to_u32()), imm);
        }
        assert_eq!(Imm::Single { pos: 1, size: 8 }.to_u32(), 0x0100_0008);
        assert_eq!(Imm::Record { pos: 2 }.to_u32(), 0x4200_0000);
        assert_eq!(Imm::Eager { slot: 3 }.to_u32(), 0x8000_0003);
    }

    #[test]
    fn header_literal_bytes_and_round_trip() {
        let h = Header {
            claim: 0x0102_0304_0506_0708,
            head: 9,
            tag: -2,
            len: 8,
            epoch: 3,
            seq: 0xaabb_ccdd,
        };
        let b = h.to_bytes();
        assert_eq!(&b[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[8..16], &[9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[0xfe, 0xff, 0xff, 0xff]);
        assert_eq!(&b[20..24], &[8, 0, 0, 0]);
        assert_eq!(&b[24..28], &[3, 0, 0, 0]);
        assert_eq!(&b[28..32], &[0xdd, 0xcc, 0xbb, 0xaa]);
        assert_eq!(Header::parse(&b), h);
    }

    #[test]
    fn a_claim_binds_only_a_single_host_receive_with_its_tag_in_an_epoch_not_refused() {
        let ok = GroupView { eager_ok: true, tag: 5 };
        assert!(binds(ok, 5, false));
        assert!(!binds(ok, 6, false), "another tag");
        assert!(!binds(ok, 5, true), "an earlier claim of the epoch was refused");
        assert!(
            !binds(
                GroupView {
                    eager_ok: false,
                    tag: 5
                },
                5,
                false
            ),
            "a group, or GPU memory"
        );
    }

    #[test]
    fn counts_wrap_and_extend_around_the_reference() {
        let m = 1u64 << CREDIT_BITS;
        for near in [0u64, 5, m - 3, m, m + 7, 5 * m + 100] {
            for delta in [0i64, 1, 16, -16, -1] {
                let count = (near as i64 + delta).max(0) as u64;
                assert_eq!(
                    extend_count(wrap_count(count), near),
                    count,
                    "near {near} delta {delta}"
                );
            }
        }
    }

    #[test]
    fn slots_are_multiples_of_64_bytes_and_a_page_at_most() {
        assert_eq!(slot_bytes(8), 64);
        assert_eq!(slot_bytes(32), 64);
        assert_eq!(slot_bytes(33), 128);
        assert_eq!(slot_bytes(224), 256);
        assert_eq!(slot_bytes(1 << 20), 4096);
        assert_eq!(ring_bytes(0), 0);
        assert_eq!(ring_bytes(224), SLOTS * 256);
    }
}
