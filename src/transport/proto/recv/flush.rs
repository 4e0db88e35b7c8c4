//! GPU flush (docs/nccl-net-abi.md#flush): a one-byte read of the last non-empty buffer per
//! local device, on the driver's loopback QPs; at most [`request::FLUSHES_IN_FLIGHT`].

use super::super::limits::MAX_DEVS;
use super::super::plan::{Op, Post, Remote, Sge, WorkRequest};
use super::super::request::{self, ReqKind};
use super::wr_id::{wr_id, KIND_FLUSH};
use super::RecvCore;
use crate::error::{Error, Result};

impl RecvCore {
    /// The buffer a flush of this group reads back: the last non-empty one (`None`: nothing
    /// to flush).
    pub fn flush_target(sizes: &[i32]) -> Option<usize> {
        (0..sizes.len()).rev().find(|&i| sizes[i] > 0)
    }

    /// Start a flush: one one-byte read of `data` (rkey per device) into each device's
    /// `scratch`.
    pub fn iflush(
        &mut self,
        data: usize,
        rkeys: &[u32; MAX_DEVS],
        scratch: &[Sge],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<u16> {
        self.state.check()?;
        // A NULL flush request means "nothing to flush" to NCCL, so a flush beyond the bound
        // must be an error here, not a retry (NCCL keeps ≤ 32 requests per comm, flushes
        // included: docs/nccl-net-abi.md#limits). The bound sizes the flush QPs and CQs.
        if self.flushes_in_flight >= request::FLUSHES_IN_FLIGHT {
            return Err(Error::internal(format!(
                "iflush: {} flushes of this receive comm are already in flight (NCCL keeps at most {} requests per comm)",
                self.flushes_in_flight,
                request::RECVS_IN_FLIGHT
            )));
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Flush) else {
            return Err(Error::internal(format!(
                "iflush: all {} request slots of the receive comm are in flight",
                request::RECV_REQUESTS
            )));
        };
        if let Some(req) = self.state.pool.get_mut(r) {
            req.pending = request::pending_count(scratch.len());
        }
        self.flushes_in_flight += 1;
        for (dev, s) in scratch.iter().enumerate() {
            let wr = WorkRequest {
                wr_id: wr_id(KIND_FLUSH, r),
                op: Op::Read,
                local: Some(Sge { len: 1, ..*s }),
                remote: Remote {
                    addr: data as u64,
                    rkey: rkeys[dev.min(MAX_DEVS - 1)],
                },
                signaled: true,
                inline: false,
                prefix: None,
            };
            if let Err(e) = post(Post::Flush { dev, wr }) {
                return Err(self.state.fail(e));
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, Posted, PLAIN, RECV_ADDR, RECV_RKEY};
    use super::*;

    fn iflush(b: &mut Bench, devs: usize) -> Result<u16> {
        let scratch = vec![
            Sge {
                addr: 0x9000,
                len: 64,
                lkey: 0x99
            };
            devs
        ];
        let Bench { core, posted, .. } = b;
        core.iflush(RECV_ADDR, &[RECV_RKEY; MAX_DEVS], &scratch, &mut |p| {
            if let Post::Flush { dev, wr } = p {
                posted.push(Posted::Flush { dev, wr });
            }
            Ok(())
        })
    }

    #[test]
    fn the_flush_target_is_the_last_non_empty_buffer() {
        assert_eq!(RecvCore::flush_target(&[5, 0, 7, 0]), Some(2));
        assert_eq!(RecvCore::flush_target(&[0, 0]), None);
    }

    /// A flush reads one byte of the buffer on every local device, and is done when each read
    /// completed.
    #[test]
    fn a_flush_reads_one_byte_per_device_and_completes_with_them() {
        let mut b = Bench::new(PLAIN);
        let idx = iflush(&mut b, 2).unwrap();
        assert_eq!(b.posted.len(), 2);
        let Posted::Flush { dev: 1, wr } = b.posted[1] else {
            panic!("{:?}", b.posted);
        };
        assert_eq!(
            (wr.op, wr.local.map(|s| s.len), wr.remote.addr),
            (Op::Read, Some(1), RECV_ADDR as u64)
        );
        b.core.handle_flush_completion(wr.wr_id);
        assert_eq!(b.core.test(&b.ring, idx).unwrap(), None);
        b.core.handle_flush_completion(wr.wr_id);
        assert_eq!(b.core.test(&b.ring, idx).unwrap().map(|d| d.n), Some(0));
        assert_eq!(b.core.flushes_in_flight(), 0);
    }

    /// One flush past the bound is an error, not a retry (a NULL request means nothing to flush).
    #[test]
    fn a_flush_past_the_bound_is_an_error() {
        let mut b = Bench::new(PLAIN);
        for _ in 0..request::FLUSHES_IN_FLIGHT {
            iflush(&mut b, 1).unwrap();
        }
        assert!(iflush(&mut b, 1).is_err());
    }
}
