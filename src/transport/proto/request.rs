//! Request slots and completion counting (pure bookkeeping, no I/O, no unsafe).
//!
//! Every comm owns a fixed pool of requests (at most [`MAX_POOL`]) allocated once at connect time,
//! named by their slot index: the pointers NCCL holds are the driver's (one per slot, leading
//! to the comm and the slot), not this pool's. `alloc`/`free` never allocate (the free list is a
//! pre-sized stack). A request is done when the completions it still expects (`pending`) reach
//! zero; a completion error marks it failed instead.

/// Most requests in one pool: request indices fill 6-bit `wr_id` lanes ([`SendWrId`]).
pub const MAX_POOL: usize = 1 << LANE_BITS;
/// Requests of a send comm: NCCL_STEPS (8) × maxRecvs (8) isends, NCCL's real peak per comm and
/// as many as the CTS ring has entries (docs/nccl-net-abi.md#limits allows more; beyond this isend
/// says "retry
/// later", which NCCL does). At any time at most 7 of them belong to the group being matched
/// (not posted yet); every other one is posted and completes by itself, so a full pool always
/// drains.
pub const SEND_REQUESTS: usize = 64;
/// Receives in flight per recv comm: NCCL_NET_MAX_REQUESTS (docs/nccl-net-abi.md#limits); more say
/// "retry later".
pub const RECVS_IN_FLIGHT: usize = 32;
/// Flushes in flight per recv comm: NCCL_NET_MAX_REQUESTS again (flushes count against the
/// comm, docs/nccl-net-abi.md#limits). A NULL flush request means "nothing to flush", so iflush
/// cannot say "retry
/// later": one more is an error. The flush QPs and their CQs are sized by this.
pub const FLUSHES_IN_FLIGHT: usize = 32;
/// Requests of a receive comm: [`RECVS_IN_FLIGHT`] receives plus [`FLUSHES_IN_FLIGHT`] flushes.
pub const RECV_REQUESTS: usize = RECVS_IN_FLIGHT + FLUSHES_IN_FLIGHT;
use super::limits::MAX_RECVS;

const _: () = assert!(SEND_REQUESTS <= MAX_POOL && RECV_REQUESTS <= MAX_POOL);
const _: () = assert!(SEND_REQUESTS >= MAX_RECVS, "a whole group can always be matched");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReqKind {
    /// In the free list; NCCL must not hold a pointer to it.
    Free = 0,
    Send = 1,
    Recv = 2,
    Flush = 3,
}

/// One in-flight operation (8 bytes), named by its index in the pool. A receive's posted
/// sizes live in its comm (the CTS staging entries of its group), not here.
#[derive(Debug)]
pub struct Request {
    /// Send: bytes sent. Receive with n == 1: the size the sender announced (immediate).
    pub size: u32,
    /// Completions still expected (≤ one per QP of the comm: at most 1024).
    pub pending: u16,
    /// Receive: ring position of the group's first CTS entry (0..RING).
    pos: u8,
    /// [`ReqKind`] (bits 0..2), "a completion error hit this request" (bit 2), and buffers − 1
    /// (bits 3..6) of a grouped receive, or `nreqs` − 1 of the group a send belongs to.
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Request>() == 8);
// The packed fields hold every ring position and group size.
const _: () = assert!(super::fifo::RING <= 256 && MAX_RECVS <= 8);
const FAILED: u8 = 1 << 2;
const N_SHIFT: u32 = 3;

impl Request {
    fn new() -> Request {
        Request {
            size: 0,
            pending: 0,
            pos: 0,
            flags: ReqKind::Free as u8,
        }
    }

    pub fn kind(&self) -> ReqKind {
        match self.flags & 3 {
            1 => ReqKind::Send,
            2 => ReqKind::Recv,
            3 => ReqKind::Flush,
            _ => ReqKind::Free,
        }
    }

    fn set_kind(&mut self, kind: ReqKind) {
        self.flags = (self.flags & !3) | kind as u8;
    }

    /// A completion error hit this request.
    pub fn failed(&self) -> bool {
        self.flags & FAILED != 0
    }

    pub fn set_failed(&mut self) {
        self.flags |= FAILED;
    }

    /// Ring position of a receive's first CTS entry.
    pub fn pos(&self) -> usize {
        usize::from(self.pos)
    }

    /// Buffers of a grouped receive, or `nreqs` of the group a send belongs to (1..=8).
    pub fn n(&self) -> usize {
        usize::from((self.flags >> N_SHIFT) & 7) + 1
    }

    /// Record the ring position (mod RING) and the group size (clamped to 1..=8).
    pub fn set_pos_n(&mut self, pos: usize, n: usize) {
        self.pos = (pos % super::fifo::RING) as u8;
        self.flags = (self.flags & !(7 << N_SHIFT)) | (((n.clamp(1, MAX_RECVS) - 1) as u8) << N_SHIFT);
    }

    /// One expected completion arrived; true when none is left.
    pub fn complete_one(&mut self) -> bool {
        self.pending = self.pending.saturating_sub(1);
        self.pending == 0
    }

    pub fn is_done(&self) -> bool {
        self.pending == 0
    }
}

/// `n` expected completions as stored in [`Request::pending`] (never more than 1024 QPs).
pub fn pending_count(n: usize) -> u16 {
    n.min(u16::MAX as usize) as u16
}

/// A fixed pool of requests with a LIFO free list.
pub struct RequestPool {
    reqs: Box<[Request]>,
    /// Free indices (< MAX_POOL, as the `wr_id` lanes).
    free: Vec<u8>,
}

impl RequestPool {
    /// A pool of `capacity` requests, ≤ [`MAX_POOL`] (indices must fit the `wr_id` lanes).
    pub fn with_capacity(capacity: usize) -> RequestPool {
        let cap = capacity.clamp(1, MAX_POOL) as u16;
        let reqs: Box<[Request]> = (0..cap).map(|_| Request::new()).collect();
        // Lowest index on top, so tests and logs see 0, 1, 2, ...
        let free = (0..cap).rev().map(|i| i as u8).collect();
        RequestPool { reqs, free }
    }

    /// Take a free request and mark it `kind`; `None` when all are in flight.
    pub fn alloc(&mut self, kind: ReqKind) -> Option<u16> {
        let i = u16::from(self.free.pop()?);
        let r = &mut self.reqs[i as usize];
        r.flags = kind as u8;
        r.pending = 0;
        r.pos = 0;
        r.size = 0;
        Some(i)
    }

    /// Return a request to the pool. Freeing a free or unknown request is ignored.
    pub fn free(&mut self, i: u16) {
        if let Some(r) = self.reqs.get_mut(i as usize) {
            if r.kind() != ReqKind::Free {
                r.set_kind(ReqKind::Free);
                self.free.push(i as u8);
            }
        }
    }

    pub fn get(&self, i: u16) -> Option<&Request> {
        self.reqs.get(i as usize)
    }

    pub fn get_mut(&mut self, i: u16) -> Option<&mut Request> {
        self.reqs.get_mut(i as usize)
    }

    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Every request not free (for failing them all on a fatal error).
    pub fn busy_mut(&mut self) -> impl Iterator<Item = &mut Request> {
        self.reqs.iter_mut().filter(|r| r.kind() != ReqKind::Free)
    }
}

/// Bits per request index in a send `wr_id`.
const LANE_BITS: u32 = 6;
const LANE_MASK: u64 = (1 << LANE_BITS) - 1;
const CHAIN_SHIFT: u32 = 8 * LANE_BITS;
/// Bits of a send `wr_id` holding the chain's length.
const CHAIN_BITS: u32 = 6;
const CHAIN_MASK: u64 = (1 << CHAIN_BITS) - 1;
const QP_SHIFT: u32 = CHAIN_SHIFT + CHAIN_BITS;
/// QP indices a send `wr_id` can name (NCCL_IB_QPS_PER_CONNECTION ≤ 128 × 8 devices).
pub const WR_ID_QPS: usize = 1 << 10;
const _: () = assert!(QP_SHIFT + 10 <= 64);
const _: () = assert!(super::limits::MAX_CHAIN as u64 <= CHAIN_MASK, "every chain length fits");

/// The `wr_id` of every WR of a group's chain on one QP (docs/nccl-net-abi.md#data-path packs
/// 8-bit lanes; ours are
/// 6 bits, so the chain's length and QP fit too): the group's request indices (< [`MAX_POOL`])
/// in lanes 0..8 (bits 0..48), the number of WRs of the chain (bits 48..54, ≤ MAX_CHAIN) and
/// the QP's index in the connection (bits 54..64). The chain's signaled completion gives back that many
/// send-queue credits of that QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWrId(pub u64);

impl SendWrId {
    /// `indices` beyond 8 and bits beyond each field are dropped.
    pub fn new(indices: &[u16], chain: usize, qp: usize) -> SendWrId {
        let lanes = indices.iter().take(8).enumerate().fold(0u64, |acc, (lane, &i)| {
            acc | ((u64::from(i) & LANE_MASK) << (LANE_BITS * lane as u32))
        });
        SendWrId(
            lanes | ((chain as u64 & CHAIN_MASK) << CHAIN_SHIFT) | ((qp as u64 & (WR_ID_QPS as u64 - 1)) << QP_SHIFT),
        )
    }

    /// Request index in lane `lane` (0..8).
    pub fn lane(self, lane: usize) -> u16 {
        ((self.0 >> (LANE_BITS * (lane % 8) as u32)) & LANE_MASK) as u16
    }

    /// WRs in the chain.
    pub fn chain(self) -> usize {
        ((self.0 >> CHAIN_SHIFT) & CHAIN_MASK) as usize
    }

    /// The QP's index in the connection.
    pub fn qp(self) -> usize {
        ((self.0 >> QP_SHIFT) & (WR_ID_QPS as u64 - 1)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_alloc_free_exhaustion() {
        let mut p = RequestPool::with_capacity(MAX_POOL);
        let mut got = vec![];
        for _ in 0..MAX_POOL {
            got.push(p.alloc(ReqKind::Send).unwrap());
        }
        assert_eq!(got[..3], [0, 1, 2]);
        assert_eq!(p.in_flight(), MAX_POOL);
        assert_eq!(p.alloc(ReqKind::Recv), None, "exhausted pool says retry later");
        p.free(17);
        p.free(17); // double free ignored
        assert_eq!(p.in_flight(), MAX_POOL - 1);
        assert_eq!(p.alloc(ReqKind::Recv), Some(17));
        assert_eq!(p.get(17).unwrap().kind(), ReqKind::Recv);
        p.free(9999); // unknown ignored
    }

    #[test]
    fn at_least_32_in_flight_with_flushes() {
        let mut p = RequestPool::with_capacity(RECV_REQUESTS);
        for _ in 0..32 {
            p.alloc(ReqKind::Recv).unwrap();
            p.alloc(ReqKind::Flush).unwrap();
        }
        assert!(p.in_flight() >= 64);
    }

    #[test]
    fn completion_counting() {
        let mut p = RequestPool::with_capacity(MAX_POOL);
        let i = p.alloc(ReqKind::Recv).unwrap();
        let r = p.get_mut(i).unwrap();
        r.pending = pending_count(3);
        assert!(!r.complete_one());
        assert!(!r.complete_one());
        assert!(r.complete_one());
        assert!(r.is_done());
        assert!(r.complete_one(), "extra completions never underflow");
    }

    #[test]
    fn packed_fields() {
        let mut p = RequestPool::with_capacity(MAX_POOL);
        for kind in [ReqKind::Send, ReqKind::Recv, ReqKind::Flush] {
            let i = p.alloc(kind).unwrap();
            let r = p.get_mut(i).unwrap();
            assert_eq!((r.kind(), r.failed(), r.n(), r.pos()), (kind, false, 1, 0));
            for pos in 0..super::super::fifo::RING {
                for n in 1..=MAX_RECVS {
                    r.set_pos_n(pos, n);
                    assert_eq!((r.pos(), r.n(), r.kind(), r.failed()), (pos, n, kind, false));
                }
            }
            r.set_failed();
            assert!(r.failed());
            assert_eq!((r.kind(), r.n()), (kind, MAX_RECVS));
            r.set_pos_n(3, 2);
            assert!(r.failed(), "set_pos_n keeps the failed bit");
            p.free(i);
            assert_eq!(p.get(i).unwrap().kind(), ReqKind::Free);
            let j = p.alloc(kind).unwrap();
            assert!(!p.get(j).unwrap().failed(), "alloc clears the failed bit");
            p.free(j);
        }
        assert_eq!(pending_count(1024), 1024);
        assert_eq!(pending_count(1 << 20), u16::MAX);
    }

    #[test]
    fn wr_id_lanes() {
        let w = SendWrId::new(&[1, 2, 63, 0, 7], 9, 1023);
        assert_eq!(w.lane(0), 1);
        assert_eq!(w.lane(1), 2);
        assert_eq!(w.lane(2), 63);
        assert_eq!(w.lane(4), 7);
        assert_eq!(w.lane(5), 0);
        assert_eq!((w.chain(), w.qp()), (9, 1023));
        let all = SendWrId::new(&[63; 8], 63, 0);
        assert_eq!(all.0, (1 << 54) - 1, "lanes and chain use bits 0..54");
        assert_eq!((all.lane(7), all.chain(), all.qp()), (63, 63, 0));
        // Fields never bleed into each other.
        let q = SendWrId::new(&[0; 8], 0, WR_ID_QPS - 1);
        assert_eq!((q.lane(7), q.chain(), q.qp()), (0, 0, WR_ID_QPS - 1));
        assert_eq!(q.0 >> 54, WR_ID_QPS as u64 - 1, "the QP index fills bits 54..64");
        let mut p = RequestPool::with_capacity(MAX_POOL);
        for _ in 0..MAX_POOL {
            let i = p.alloc(ReqKind::Send).unwrap();
            assert_eq!(SendWrId::new(&[i; 8], 1, 0).lane(7), i, "every index fits a lane");
        }
    }
}
