//! Closing a receive comm: the CTS writes it posted must land before its QPs are destroyed.

use super::super::limits::MAX_DEVS;
use super::super::plan::Post;
use super::RecvCore;
use crate::error::Result;

impl RecvCore {
    /// Closing: a signaled zero-length write on every CTS QP with CTS writes not known to have
    /// landed; its completion retires them all (RC completes in order). Contract: on a
    /// connection with the eager path, a recv comm destroys its QPs only once
    /// [`RecvCore::cts_landed`] holds for the QPs returned, because a receive an eager message
    /// filled completes before its group's CTS write (the sender's verdict on the claim) was
    /// acknowledged. Without the eager path nothing is marked: a receive completes only after
    /// the sender read its CTS. Returns the CTS QPs marked (a bit each; 0: nothing to wait for).
    pub fn post_close_markers(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<u32> {
        if self.eager.is_none() || self.state.failed() || self.recovering() {
            return Ok(0);
        }
        let mut marked = 0;
        for d in 0..self.cfg.cts_qps.min(self.cfg.routes.len()).min(MAX_DEVS) {
            if self.cts_retired[d] >= self.cts_posted[d] || !self.cts_room(d, 1) {
                continue;
            }
            // Zero entries: no local memory, signaled.
            self.post_cts(d, 0, 0, true, post)?;
            marked |= 1 << d;
        }
        Ok(marked)
    }

    /// What a closing recv comm tells its sender before its QPs go (wire version 7,
    /// docs/design/data-path.md#closing): the receives it took, the receives it posted and
    /// never took, and per QP the write-with-immediate completions it took since the
    /// connection was made (as a recovery's report). Nothing more is polled for it: a
    /// message whose completion this side never took was never taken, and its send fails.
    /// CTS entries staged and not written stay unwritten: a close with receives posted
    /// abandons them, and the sender fails the sends it would have matched to them.
    pub fn close_report(&self) -> (u64, u32, Vec<u64>) {
        let in_flight = self.recvs_in_flight as u64;
        (self.counter.saturating_sub(in_flight), in_flight as u32, self.taken())
    }

    /// Whether every CTS write posted on the CTS QPs of `marked` was acknowledged.
    pub fn cts_landed(&self, marked: u32) -> bool {
        (0..MAX_DEVS).all(|d| marked & (1 << d) == 0 || self.cts_retired[d] >= self.cts_posted[d])
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, Posted, EAGER, PLAIN};
    use super::*;

    fn markers(b: &mut Bench) -> u32 {
        let Bench { core, posted, .. } = b;
        core.post_close_markers(&mut |p| {
            if let Post::Send { qp, chain } = p {
                posted.push(Posted::Send {
                    qp,
                    chain: chain.to_vec(),
                });
            }
            Ok(())
        })
        .unwrap()
    }

    /// With the eager path, an unretired CTS write gets a marker: a signaled write of nothing,
    /// whose completion says every CTS write before it landed.
    #[test]
    fn an_unretired_cts_write_is_marked_and_landed_at_the_marker_s_completion() {
        let mut b = Bench::new(EAGER);
        b.started(&[(100, 1)]);
        let before = b.posted.len();
        assert_eq!(markers(&mut b), 1);
        let Some(Posted::Send { qp: 0, chain }) = b.posted.get(before) else {
            panic!("no marker: {:?}", b.posted);
        };
        let m = chain[0];
        assert_eq!((m.local, m.signaled), (None, true));
        assert!(!b.core.cts_landed(1));
        b.core.handle_completion(m.wr_id, None);
        assert!(b.core.cts_landed(1));
        assert_eq!(markers(&mut b), 0, "nothing left to mark");
    }

    /// Without the eager path a receive completes only after the sender read its CTS: nothing
    /// to mark.
    #[test]
    fn without_the_eager_path_nothing_is_marked() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(100, 1)]);
        assert_eq!(markers(&mut b), 0);
    }
}
