//! Reading the receiver's next group from the FIFO ring: a group is taken once all its entries
//! have landed and verify; a group whose entries never verify, or an entry at the head that no
//! honest receiver leaves there, fails the comm after [`super::SendConfig::landing_timeout`].

use super::super::fifo::{self, CtsEntry, GroupState};
use super::super::limits::MAX_RECVS;
use super::super::time::Time;
use super::{FifoRing, SendCore};
use crate::error::{Error, Result};

impl SendCore {
    /// Look for the next group in the ring; true when all its entries are there and sealed.
    /// `now` is asked only while a group is landing.
    pub(super) fn load_group(&mut self, ring: &impl FifoRing, now: impl Fn() -> Time + Copy) -> Result<bool> {
        let mut es = [CtsEntry::default(); MAX_RECVS];
        let st = fifo::read_group(
            self.head,
            self.counter,
            |pos| ring.load_stamp(pos),
            |pos| ring.load_entry(pos),
            &mut es,
        );
        match st {
            GroupState::Ready(n) => {
                self.landing_since = None;
                for (i, e) in es.iter().enumerate().take(n) {
                    let w = e.to_wire();
                    let pos = fifo::ring_pos(self.head.wrapping_add(i as u64));
                    self.consumed_stamps[pos] = w.stamp;
                    self.consumed_seals[pos] = w.seal;
                }
                let first = fifo::ring_pos(self.head) * self.nrdevs;
                self.first_rkeys[first..first + self.nrdevs].copy_from_slice(&es[0].rkeys[..self.nrdevs]);
                if let Some(e) = self.eager.as_deref_mut() {
                    e.handle_credit(es[0].eager_credit());
                    e.last_ok = n == 1 && es[0].eager_ok();
                }
                self.cur.active = true;
                self.cur.n = n;
                self.cur.entries = es;
                self.cur.matched = 0;
                Ok(true)
            }
            GroupState::NotPosted => self.check_unposted_head(ring, now),
            GroupState::Landing => {
                // Still being written; a seal that never verifies means a broken peer.
                let now = now();
                let since = *self.landing_since.get_or_insert(now);
                let waited = now.saturating_since(since);
                if waited > self.cfg.landing_timeout {
                    return Err(self.state.fail(Error::remote(format!(
                        "the CTS entries from the receiver {} for group {} (FIFO entry {}) never became consistent (seal/count mismatch for {waited:?}): a corrupt or incompatible peer",
                        self.cfg.peer,
                        self.counter,
                        fifo::ring_pos(self.head),
                    ))));
                }
                Ok(false)
            }
        }
    }

    /// The head entry does not announce the expected group: not posted yet, or (when its stamp
    /// or seal is one no honest receiver leaves there, [`fifo::impossible_head_entry`]) a stale,
    /// replayed or garbage CTS write. That is bounded like a landing group (a word read while
    /// the receiver's NIC stores it may look impossible for a moment) and then fails the comm.
    pub(super) fn check_unposted_head(&mut self, ring: &impl FifoRing, now: impl Fn() -> Time + Copy) -> Result<bool> {
        let pos = fifo::ring_pos(self.head);
        let entry = ring.load_entry(pos);
        let (stamp, seal) = (self.consumed_stamps[pos], self.consumed_seals[pos]);
        let left_over = CtsEntry {
            stamp,
            seal,
            ..CtsEntry::default()
        };
        let Some(idx) = fifo::impossible_head_entry(&entry, &left_over, self.counter) else {
            self.landing_since = None;
            return Ok(false);
        };
        let now = now();
        let since = *self.landing_since.get_or_insert(now);
        let waited = now.saturating_since(since);
        if waited > self.cfg.landing_timeout {
            return Err(self.state.fail(Error::remote(format!(
                "the receiver {} wrote a CTS entry stamped for posting counter {} into FIFO entry {pos}, where it owes group {} (stale, replayed or garbage for {waited:?}): a corrupt or lying peer",
                self.cfg.peer,
                idx.wrapping_sub(1),
                self.counter,
            ))));
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, LANDING_TIMEOUT, PLAIN};
    use super::super::Isend;
    use super::*;
    use std::time::Duration;

    /// Nothing landed: no buffer yet, nothing posted, no clock needed.
    #[test]
    fn an_empty_ring_has_no_group() {
        let mut b = Bench::new(PLAIN);
        assert_eq!(b.isend(10, 1).unwrap(), Isend::NoBuffer);
        assert!(b.posted.is_empty() && !b.core.cur.active);
    }

    /// A landed, sealed group becomes the current one, whole.
    #[test]
    fn a_sealed_group_is_loaded_whole() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(100, 1), (200, 2), (300, 3)]);
        let now = Time::ZERO;
        assert!(b.core.load_group(&b.ring, || now).unwrap());
        assert_eq!((b.core.cur.n, b.core.cur.matched), (3, 0));
        assert_eq!(b.core.cur.entries[2].posted_size(), 300);
        assert_eq!(
            b.core.consumed_stamps[2], b.ring.entries[2].stamp,
            "its stamps are kept"
        );
    }

    /// A group whose stamp landed but whose seal never verifies is waited for up to the
    /// landing timeout, then fails the comm.
    #[test]
    fn a_group_that_never_verifies_fails_after_the_landing_timeout() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(100, 1)]);
        b.ring.entries[0].size ^= 1;
        assert_eq!(b.isend(10, 1).unwrap(), Isend::NoBuffer);
        b.now = Time::from_nanos(LANDING_TIMEOUT.as_nanos() as u64);
        assert_eq!(b.isend(10, 1).unwrap(), Isend::NoBuffer, "at the limit it still waits");
        b.now = Time::from_nanos((LANDING_TIMEOUT + Duration::from_nanos(1)).as_nanos() as u64);
        let e = b.isend(10, 1).unwrap_err();
        assert!(e.to_string().contains("never became consistent"), "{e}");
        assert!(b.core.state.check().is_err(), "the comm failed");
    }

    /// An entry stamped for another posting counter at the head is no group this side is owed:
    /// after the landing timeout the comm fails.
    #[test]
    fn a_stale_entry_at_the_head_fails_after_the_landing_timeout() {
        let mut b = Bench::new(PLAIN);
        b.rx_counter = 5;
        b.cts(&[(100, 1)]);
        assert_eq!(b.isend(10, 1).unwrap(), Isend::NoBuffer);
        b.now = Time::from_nanos(LANDING_TIMEOUT.as_nanos() as u64 + 1);
        let e = b.isend(10, 1).unwrap_err();
        assert!(e.to_string().contains("stale, replayed or garbage"), "{e}");
    }
}
