//! The requests NCCL holds (docs/nccl-net-abi.md#data-path): isend, irecv and iflush hand NCCL
//! a `*mut Request`, and NCCL gives it back to `test`. A [`Request`] leads from that pointer to
//! the comm (`owner`: its `Guarded` data path) and to the slot of the comm's request pool
//! (`proto::request::RequestPool`, plain data: kind, completions still expected, sizes).
//!
//! Each comm has one [`Requests`] table, one entry per pool slot, allocated once when the comm
//! is made: a pointer NCCL holds stays valid for the comm's life, and the table never allocates
//! afterwards.

use crate::error::Error;
use crate::transport::proto::request::MAX_POOL;

/// Which data path a request's `owner` is: a send comm's (`SendDp`) or a receive comm's
/// (`RecvDp`, receives and flushes alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Side {
    Send = 1,
    Recv = 2,
}

/// What NCCL's request pointer points to: 8 bytes, the owner's address with the side in its low
/// bit (an owner is a boxed `Guarded` data path, aligned to at least 8, so bit 0 is free). The
/// slot is the request's index in its table. One word per request keeps the two tables of a
/// connection (64 send and 64 receive slots) at 1 KiB of heap.
#[derive(Debug)]
#[repr(C)]
pub struct Request {
    owner_and_side: usize,
}

const _: () = assert!(std::mem::size_of::<Request>() == 8);

/// The low bit of `owner_and_side`: set for a receive comm's request.
const RECV_TAG: usize = 1;

impl Request {
    /// The comm this request belongs to and what kind of comm that is.
    pub fn owner(&self) -> (*const (), Side) {
        let side = if self.owner_and_side & RECV_TAG != 0 {
            Side::Recv
        } else {
            Side::Send
        };
        ((self.owner_and_side & !RECV_TAG) as *const (), side)
    }
}

/// A comm's table of requests, slot `i` at index `i`.
pub(crate) struct Requests {
    reqs: Box<[Request]>,
    side: Side,
}

impl Requests {
    /// The table of a `side` comm with a pool of `capacity` slots (≤ [`MAX_POOL`]). Its
    /// requests have no owner until [`Self::set_owner`].
    pub(crate) fn new(side: Side, capacity: usize) -> Requests {
        let cap = capacity.clamp(1, MAX_POOL);
        let reqs = (0..cap)
            .map(|_| Request {
                owner_and_side: Self::tagged(std::ptr::null(), side),
            })
            .collect();
        Requests { reqs, side }
    }

    fn tagged(owner: *const (), side: Side) -> usize {
        debug_assert_eq!(owner as usize & RECV_TAG, 0, "an owner is aligned to at least 8");
        owner as usize | if side == Side::Recv { RECV_TAG } else { 0 }
    }

    /// Point every request at `owner` (after the owner got its final address).
    pub(crate) fn set_owner(&mut self, owner: *const ()) {
        let word = Self::tagged(owner, self.side);
        for r in self.reqs.iter_mut() {
            r.owner_and_side = word;
        }
    }

    /// The pointer handed to NCCL for pool slot `slot`; stable for the table's life.
    pub(crate) fn ptr(&mut self, slot: u16) -> *mut Request {
        &mut self.reqs[usize::from(slot)] as *mut Request
    }

    /// The pool slot of a pointer NCCL gave back, if it points at a request of this table.
    pub(crate) fn slot_of(&self, p: *const Request) -> Option<u16> {
        let base = self.reqs.as_ptr() as usize;
        let off = (p as usize).checked_sub(base)?;
        let sz = std::mem::size_of::<Request>();
        // The table holds at most MAX_POOL (a u16 range) requests.
        (off % sz == 0 && off / sz < self.reqs.len()).then(|| (off / sz) as u16)
    }
}

/// The error of a test of a request that is not in flight: its slot is free (NCCL tested it
/// again after it was done).
pub(crate) fn not_in_flight() -> Error {
    Error::internal("test: the request is not in flight (tested again after done?)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip() {
        let mut t = Requests::new(Side::Send, MAX_POOL);
        let owner = 0x1000 as *const ();
        t.set_owner(owner);
        for slot in [0, 1, MAX_POOL as u16 - 1] {
            let p = t.ptr(slot);
            assert_eq!(t.slot_of(p), Some(slot));
            // SAFETY: p points into the table, which is alive.
            assert_eq!(unsafe { (*p).owner() }, (owner, Side::Send));
        }
        let p = t.ptr(3);
        assert_eq!(t.slot_of((p as usize + 1) as *const Request), None, "inside a request");
        assert_eq!(t.slot_of(p.wrapping_add(MAX_POOL - 3)), None, "past the table");
        assert_eq!(t.slot_of(std::ptr::null()), None);
        let mut other = Requests::new(Side::Recv, 4);
        assert_eq!(other.slot_of(p), None, "another comm's request");
        let owner = 0x2000 as *const ();
        other.set_owner(owner);
        // SAFETY: the pointer points into `other`, which is alive.
        assert_eq!(unsafe { (*other.ptr(3)).owner() }, (owner, Side::Recv));
    }
}
