//! One QP's receive side ([`ReceiveQueue`]): the requests owed a completion on it, oldest first,
//! and the receives posted ahead that no request claims yet ([`RQ_BATCH`] per post).

use super::super::request;

/// Receives one `ibv_post_recv` posts on a QP when the QP has none to spare for the next
/// message: so a QP has at most `RECVS_IN_FLIGHT + RQ_BATCH − 1` posted, and the eager QP
/// [`super::super::eager::SLOTS`] more ([`super::RQ_DEPTH`]).
pub const RQ_BATCH: usize = 16;

/// One QP's receive side: the requests owed a completion on it, oldest first (each in flight,
/// so at most [`request::RECVS_IN_FLIGHT`]), and how many posted receives no request claims.
#[derive(Clone, Copy)]
pub(super) struct ReceiveQueue {
    owed: [u16; request::RECVS_IN_FLIGHT],
    head: u8,
    pub(super) len: u8,
    /// Posted receives beyond one per owed request (< RQ_BATCH).
    pub(super) spare: u8,
    /// Completions taken on this QP since the connection was made (what a recovery reports).
    pub(super) taken: u64,
}

const _: () = assert!(request::RECVS_IN_FLIGHT < u8::MAX as usize, "a queue length fits u8");
const _: () = assert!(RQ_BATCH < u8::MAX as usize, "spare receives fit u8");

impl ReceiveQueue {
    pub(super) const EMPTY: ReceiveQueue = ReceiveQueue {
        owed: [0; request::RECVS_IN_FLIGHT],
        head: 0,
        len: 0,
        spare: 0,
        taken: 0,
    };

    /// Request `r` is owed the next completion after those already owed (false: full, which
    /// the bound on receives in flight rules out).
    pub(super) fn push(&mut self, r: u16) -> bool {
        let len = usize::from(self.len);
        if len >= self.owed.len() {
            return false;
        }
        self.owed[(usize::from(self.head) + len) % self.owed.len()] = r;
        self.len += 1;
        true
    }

    /// The request the oldest owed completion is for.
    pub(super) fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.owed[usize::from(self.head)])
    }

    pub(super) fn pop(&mut self) -> Option<u16> {
        let r = self.front()?;
        self.head = ((usize::from(self.head) + 1) % self.owed.len()) as u8;
        self.len -= 1;
        self.taken += 1;
        Some(r)
    }

    /// Take request `r` out of the owed ones, wherever it is (the requests after it keep their
    /// order); false when it is not owed here.
    pub(super) fn remove(&mut self, r: u16) -> bool {
        let cap = self.owed.len();
        let (head, len) = (usize::from(self.head), usize::from(self.len));
        let Some(k) = (0..len).find(|&k| self.owed[(head + k) % cap] == r) else {
            return false;
        };
        for j in k..len - 1 {
            self.owed[(head + j) % cap] = self.owed[(head + j + 1) % cap];
        }
        self.len -= 1;
        true
    }

    /// A completion named request `r` (a version-5 connection): the receive it took was `r`'s.
    pub(super) fn take(&mut self, r: u16) -> bool {
        let owed = self.remove(r);
        self.taken += u64::from(owed);
        owed
    }

    /// Request `r` is owed nothing any more (an eager message filled it): its receive is spare
    /// again.
    pub(super) fn forget(&mut self, r: u16) {
        if self.remove(r) {
            self.spare += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Completions go to the owed requests oldest first, and each one taken is counted.
    #[test]
    fn owed_requests_complete_oldest_first_and_are_counted() {
        let mut q = ReceiveQueue::EMPTY;
        assert!(q.push(4) && q.push(9) && q.push(2));
        assert_eq!((q.front(), q.len), (Some(4), 3));
        assert_eq!((q.pop(), q.pop(), q.taken), (Some(4), Some(9), 2));
        assert_eq!((q.pop(), q.pop(), q.taken), (Some(2), None, 3));
    }

    /// A named completion takes its request wherever it is; the others keep their order. A
    /// request an eager message filled is owed nothing and its receive is spare again.
    #[test]
    fn a_request_is_taken_or_forgotten_out_of_order() {
        let mut q = ReceiveQueue::EMPTY;
        for r in [1, 2, 3, 4] {
            q.push(r);
        }
        assert!(q.take(3));
        assert!(!q.take(3), "not owed any more");
        q.forget(1);
        assert_eq!((q.taken, q.spare, q.len), (1, 1, 2));
        assert_eq!((q.pop(), q.pop()), (Some(2), Some(4)));
    }

    /// The queue holds one entry per receive in flight (around the end of its ring too), and
    /// refuses one more.
    #[test]
    fn the_queue_is_bounded_by_the_receives_in_flight() {
        let mut q = ReceiveQueue::EMPTY;
        let n = request::RECVS_IN_FLIGHT as u16;
        for r in 0..n / 2 {
            q.push(r);
            q.pop();
        }
        for r in 0..n {
            assert!(q.push(r));
        }
        assert!(!q.push(99));
        for r in 0..n {
            assert_eq!(q.pop(), Some(r));
        }
    }
}
