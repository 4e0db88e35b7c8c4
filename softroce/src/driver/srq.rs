//! Shared receive queues: receive WQEs that any QP attached to the SRQ may
//! consume. The core's responder asks for one through
//! `MemoryAccess::take_srq_recv` when it needs a receive WQE; an empty SRQ
//! makes it answer with an RNR NAK (the requester retries). The SRQ limit
//! event fires once when a WQE is taken while fewer than `srq_limit` remain.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::event::AsyncQueue;
use super::limits;
use crate::proto::RecvWr;

/// SRQ state shared with the engine (through the attached QPs).
pub struct SrqInner {
    queue: Mutex<VecDeque<RecvWr>>,
    max_wr: AtomicU32,
    pub max_sge: u32,
    /// Armed limit (0 = not armed).
    limit: AtomicU32,
    pub pd: u32,
    /// QPs attached (destroy fails with EBUSY while non-zero).
    pub users: AtomicUsize,
    async_q: Arc<AsyncQueue>,
    ibv_ptr: AtomicUsize,
}

impl SrqInner {
    /// An SRQ of PD `pd`; EINVAL for sizes beyond the device's limits or a
    /// limit above `max_wr`.
    pub fn new(max_wr: u32, max_sge: u32, srq_limit: u32, pd: u32, async_q: Arc<AsyncQueue>) -> Result<SrqInner, i32> {
        if max_wr == 0 || max_wr > limits::MAX_SRQ_WR || max_sge > limits::MAX_SGE || srq_limit > max_wr {
            return Err(libc::EINVAL);
        }
        Ok(SrqInner {
            queue: Mutex::new(VecDeque::with_capacity(max_wr as usize)),
            max_wr: AtomicU32::new(max_wr),
            max_sge: max_sge.max(1),
            limit: AtomicU32::new(0),
            pd,
            users: AtomicUsize::new(0),
            async_q,
            ibv_ptr: AtomicUsize::new(0),
        })
    }

    /// Records the application's `ibv_srq *` (the element of the limit event).
    pub fn set_ibv_ptr(&self, p: usize) {
        self.ibv_ptr.store(p, Ordering::Relaxed);
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<RecvWr>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the oldest receive WQE (for the responder of an attached QP).
    pub fn take(&self) -> Option<RecvWr> {
        let (w, left) = {
            let mut q = self.queue();
            let w = q.pop_front()?;
            (w, q.len() as u32)
        };
        let lim = self.limit.load(Ordering::Acquire);
        if lim != 0
            && left < lim
            && self
                .limit
                .compare_exchange(lim, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.async_q.push(
                rdma_sys::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED,
                self.ibv_ptr.load(Ordering::Relaxed),
            );
        }
        Some(w)
    }

    /// Queues receive WQEs in order under one lock, stopping at the first
    /// that is refused (its own error, or ENOMEM when the SRQ is full).
    /// Returns 0 or the errno and the index of the refused WR.
    pub fn post(&self, wrs: impl IntoIterator<Item = Result<RecvWr, i32>>) -> (i32, usize) {
        let mut q = self.queue();
        for (i, w) in wrs.into_iter().enumerate() {
            let w = match w {
                Ok(w) if (q.len() as u32) < self.max_wr.load(Ordering::Relaxed) => w,
                Ok(_) => return (libc::ENOMEM, i),
                Err(e) => return (e, i),
            };
            q.push_back(w);
        }
        (0, 0)
    }

    /// `ibv_modify_srq`: a new `max_wr` (not below what is queued) and/or
    /// an armed limit (not above `max_wr`); nothing changes on EINVAL.
    pub fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), i32> {
        let max_wr = match max_wr {
            Some(m) => {
                let queued = self.queue().len() as u32;
                if m == 0 || m > limits::MAX_SRQ_WR || m < queued {
                    return Err(libc::EINVAL);
                }
                m
            }
            None => self.max_wr.load(Ordering::Relaxed),
        };
        if limit.is_some_and(|l| l > max_wr) {
            return Err(libc::EINVAL);
        }
        self.max_wr.store(max_wr, Ordering::Relaxed);
        if let Some(l) = limit {
            self.limit.store(l, Ordering::Release);
        }
        Ok(())
    }

    /// (max_wr, armed limit), for `ibv_query_srq`.
    pub fn query(&self) -> (u32, u32) {
        (self.max_wr.load(Ordering::Relaxed), self.limit.load(Ordering::Acquire))
    }
}
