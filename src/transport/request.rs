//! Request slots and completion counting (pure bookkeeping, no I/O, no unsafe).
//!
//! Every comm owns a fixed pool of requests (at most [`MAX_REQUESTS`]) allocated once at connect time;
//! NCCL receives raw pointers into it. `alloc`/`free` never allocate (the free list is a
//! pre-sized stack). A request is done when the completions it still expects (`pending`) reach
//! zero; a completion error marks it failed instead.

/// Requests per comm: NCCL_NET_MAX_REQUESTS (32) × maxRecvs (8), as NCCL's IB transport.
/// Covers 32 grouped receives (+ flushes) on a recvComm and 32 × 8 isends on a sendComm.
pub const MAX_REQUESTS: usize = 256;
/// Most buffers per grouped receive.
pub const MAX_RECVS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReqKind {
    /// In the free list; NCCL must not hold a pointer to it.
    Free = 0,
    Send = 1,
    Recv = 2,
    Flush = 3,
}

/// One in-flight operation (16 bytes: 256 of them are a send comm's whole pool). NCCL holds
/// `*mut Request`; `owner` leads back to the comm, and the request's index is its position in
/// the pool ([`RequestPool::index_of`]). A receive's posted sizes live in its comm (the CTS
/// staging entries of its FIFO slot), not here.
#[derive(Debug)]
#[repr(C)]
pub struct Request {
    /// The comm's data-path state (`SendDp` or `RecvDp`, by `kind`). Set once at pool creation.
    pub owner: *mut (),
    /// Send: bytes sent. Receive with n == 1: the size the sender announced (immediate).
    pub size: u32,
    /// Completions still expected (≤ one per QP of the comm: at most 1024).
    pub pending: u16,
    /// FIFO slot (bits 0..5) and buffers − 1 (bits 5..8): of a grouped receive, or `nreqs` of
    /// the group a send belongs to.
    slot_n: u8,
    /// [`ReqKind`] (bits 0..2) and "a completion error hit this request" (bit 2).
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Request>() == 16);
// The packed fields hold every slot and group size.
const _: () = assert!(super::fifo::SLOTS <= 32 && MAX_RECVS <= 8);
const FAILED: u8 = 1 << 2;

impl Request {
    fn new(owner: *mut ()) -> Request {
        Request {
            owner,
            size: 0,
            pending: 0,
            slot_n: 0,
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

    /// FIFO slot of a receive (or of the group a send belongs to).
    pub fn slot(&self) -> usize {
        usize::from(self.slot_n & 31)
    }

    /// Buffers of a grouped receive, or `nreqs` of the group a send belongs to (1..=8).
    pub fn n(&self) -> usize {
        usize::from(self.slot_n >> 5) + 1
    }

    /// Record the FIFO slot (mod 32) and the group size (clamped to 1..=8).
    pub fn set_slot_n(&mut self, slot: usize, n: usize) {
        self.slot_n = (slot & 31) as u8 | ((n.clamp(1, MAX_RECVS) - 1) as u8) << 5;
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
    /// Free indices (< 256, as the `wr_id` lanes).
    free: Vec<u8>,
}

/// Requests of a receive comm: 32 receives (NCCL_NET_MAX_REQUESTS) plus 32 flushes.
pub const RECV_REQUESTS: usize = 64;

impl RequestPool {
    /// `owner` is stored in every request (the comm's data-path state, which must not move
    /// afterwards — it is boxed by the caller).
    /// `capacity` ≤ [`MAX_REQUESTS`] (indices must fit the 8-bit `wr_id` lanes).
    pub fn new(owner: *mut (), capacity: usize) -> RequestPool {
        let cap = capacity.clamp(1, MAX_REQUESTS) as u16;
        let reqs: Box<[Request]> = (0..cap).map(|_| Request::new(owner)).collect();
        // Lowest index on top, so tests and logs see 0, 1, 2, ...
        let free = (0..cap).rev().map(|i| i as u8).collect();
        RequestPool { reqs, free }
    }

    /// Re-point every request at `owner` (after the owner got its final address).
    pub fn set_owner(&mut self, owner: *mut ()) {
        for r in self.reqs.iter_mut() {
            r.owner = owner;
        }
    }

    /// Take a free request and mark it `kind`; `None` when all are in flight.
    pub fn alloc(&mut self, kind: ReqKind) -> Option<u16> {
        let i = u16::from(self.free.pop()?);
        let r = &mut self.reqs[i as usize];
        r.flags = kind as u8;
        r.pending = 0;
        r.slot_n = 0;
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

    /// Pointer handed to NCCL; stable for the pool's life.
    pub fn ptr(&mut self, i: u16) -> *mut Request {
        &mut self.reqs[i as usize] as *mut Request
    }

    /// Index of a pointer NCCL gave back, if it points into this pool.
    pub fn index_of(&self, p: *const Request) -> Option<u16> {
        let base = self.reqs.as_ptr() as usize;
        let off = (p as usize).checked_sub(base)?;
        let sz = std::mem::size_of::<Request>();
        (off % sz == 0 && off / sz < self.reqs.len()).then_some((off / sz) as u16)
    }

    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Every request not free (for failing them all on a fatal error).
    pub fn busy_mut(&mut self) -> impl Iterator<Item = &mut Request> {
        self.reqs.iter_mut().filter(|r| r.kind() != ReqKind::Free)
    }
}

/// Pack up to 8 request indices (< 256) into a `wr_id`, one per 8-bit lane (spec §8.8).
pub fn pack_wr_id(indices: &[u16]) -> u64 {
    indices
        .iter()
        .take(8)
        .enumerate()
        .fold(0u64, |acc, (lane, &i)| acc | (u64::from(i as u8) << (8 * lane)))
}

/// Lane `lane` of a packed `wr_id`.
pub fn wr_id_lane(wr_id: u64, lane: usize) -> u16 {
    ((wr_id >> (8 * (lane % 8))) & 0xff) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_alloc_free_exhaustion() {
        let mut p = RequestPool::new(std::ptr::null_mut(), MAX_REQUESTS);
        let mut got = vec![];
        for _ in 0..MAX_REQUESTS {
            got.push(p.alloc(ReqKind::Send).unwrap());
        }
        assert_eq!(got[..3], [0, 1, 2]);
        assert_eq!(p.in_flight(), MAX_REQUESTS);
        assert_eq!(p.alloc(ReqKind::Recv), None, "exhausted pool says retry later");
        p.free(17);
        p.free(17); // double free ignored
        assert_eq!(p.in_flight(), MAX_REQUESTS - 1);
        assert_eq!(p.alloc(ReqKind::Recv), Some(17));
        assert_eq!(p.get(17).unwrap().kind(), ReqKind::Recv);
        p.free(9999); // unknown ignored
    }

    #[test]
    fn at_least_32_in_flight_with_flushes() {
        let mut p = RequestPool::new(std::ptr::null_mut(), MAX_REQUESTS);
        for _ in 0..32 {
            p.alloc(ReqKind::Recv).unwrap();
            p.alloc(ReqKind::Flush).unwrap();
        }
        assert!(p.in_flight() >= 64);
    }

    #[test]
    fn completion_counting() {
        let mut p = RequestPool::new(std::ptr::null_mut(), MAX_REQUESTS);
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
        let mut p = RequestPool::new(std::ptr::null_mut(), MAX_REQUESTS);
        for kind in [ReqKind::Send, ReqKind::Recv, ReqKind::Flush] {
            let i = p.alloc(kind).unwrap();
            let r = p.get_mut(i).unwrap();
            assert_eq!((r.kind(), r.failed(), r.n(), r.slot()), (kind, false, 1, 0));
            for slot in 0..super::super::fifo::SLOTS {
                for n in 1..=MAX_RECVS {
                    r.set_slot_n(slot, n);
                    assert_eq!((r.slot(), r.n(), r.kind()), (slot, n, kind));
                }
            }
            r.set_failed();
            assert!(r.failed());
            assert_eq!(r.kind(), kind);
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
    fn pointers_round_trip() {
        let mut p = RequestPool::new(std::ptr::null_mut(), MAX_REQUESTS);
        let i = p.alloc(ReqKind::Send).unwrap();
        let ptr = p.ptr(i);
        assert_eq!(p.index_of(ptr), Some(i));
        assert_eq!(p.index_of((ptr as usize + 1) as *const Request), None);
        assert_eq!(p.index_of(std::ptr::null()), None);
    }

    #[test]
    fn wr_id_lanes() {
        let w = pack_wr_id(&[1, 2, 255, 0, 7]);
        assert_eq!(wr_id_lane(w, 0), 1);
        assert_eq!(wr_id_lane(w, 1), 2);
        assert_eq!(wr_id_lane(w, 2), 255);
        assert_eq!(wr_id_lane(w, 4), 7);
        assert_eq!(pack_wr_id(&[5; 8]), 0x0505050505050505);
    }
}
