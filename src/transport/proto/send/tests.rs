//! The sender's test bench, in the simulated-pair style: one [`SendCore`], its FIFO ring as
//! plain entries into which a test writes the receiver's CTS groups exactly as the receiver's
//! NIC would (sealed, wire order), a virtual clock, and the posts collected in order. Each file
//! of `send/` tests its own concept on it, one state at a time.

use super::super::eager::{self, EagerSendConfig, SLOTS};
use super::super::fifo::{self, CtsEntry, RING};
use super::super::limits::MAX_DEVS;
use super::super::plan::{LocalBlock, Post, QpRoute, RemoteBlock, WorkRequest};
use super::super::time::Time;
use super::{FifoRing, Isend, SendBuf, SendConfig, SendCore};
use crate::error::Result;
use std::time::Duration;

/// Addresses and keys of the bench, distinct so that a WR's fields say where they came from.
pub(super) const FIFO_ADDR: u64 = 0x1000_0000;
pub(super) const FIFO_LKEY: u32 = 0x11;
pub(super) const RECORDS_ADDR: u64 = 0x2000_0000;
pub(super) const RECORDS_RKEY: u32 = 0x22;
pub(super) const LANDING_ADDR: u64 = 0x3000_0000;
pub(super) const LANDING_RKEY: u32 = 0x33;
pub(super) const SEND_ADDR: usize = 0x4000_0000;
pub(super) const SEND_LKEY: u32 = 0x44;
pub(super) const RECV_ADDR: u64 = 0x5000_0000;
pub(super) const RECV_RKEY: u32 = 0x55;
pub(super) const LANDING_TIMEOUT: Duration = Duration::from_millis(100);
/// The bench's largest eager payload.
pub(super) const EAGER_MAX: usize = 64;

/// The sender's FIFO ring: what the receiver wrote (wire order), and the sizes staged.
pub(super) struct Ring {
    pub entries: [CtsEntry; RING],
    pub staged: Vec<(usize, Vec<u32>)>,
}

impl FifoRing for Ring {
    fn load_stamp(&self, pos: usize) -> u64 {
        self.entries[pos].stamp
    }
    fn load_entry(&self, pos: usize) -> CtsEntry {
        self.entries[pos]
    }
    fn store_sizes(&mut self, pos: usize, sizes: &[u32]) {
        self.staged.push((pos, sizes.to_vec()));
    }
}

/// The wire's options a bench connection has.
#[derive(Clone, Copy)]
pub(super) struct Opts {
    pub qps: usize,
    pub qps_per_req: usize,
    pub eager: bool,
    pub named_imm: bool,
}

pub(super) const PLAIN: Opts = Opts {
    qps: 1,
    qps_per_req: 1,
    eager: false,
    named_imm: false,
};

/// One sender and the receiver's side of its ring.
pub(super) struct Bench {
    pub core: SendCore,
    pub ring: Ring,
    /// Every chain posted, in order: its QP and WRs.
    pub posted: Vec<(usize, Vec<WorkRequest>)>,
    pub now: Time,
    /// The receiver's posting counter and next ring entry.
    pub rx_counter: u64,
    pub rx_head: u64,
}

fn quiet(_: &crate::error::Error) {}

impl Bench {
    pub(super) fn new(o: Opts) -> Bench {
        let cfg = SendConfig {
            routes: vec![QpRoute::default(); o.qps],
            local_devs: 1,
            peer_devs: 1,
            qps_per_req: o.qps_per_req,
            ar_threshold: None,
            landing_timeout: LANDING_TIMEOUT,
            wr_bytes: 1 << 20,
            fifo: LocalBlock {
                addr: FIFO_ADDR,
                lkeys: [FIFO_LKEY; MAX_DEVS],
            },
            peer: "the bench's receiver".into(),
            peer_records: RemoteBlock {
                addr: RECORDS_ADDR,
                rkeys: [RECORDS_RKEY; MAX_DEVS],
            },
            eager: o.eager.then(|| EagerSendConfig {
                max: EAGER_MAX,
                inline_max: 256,
                landing: LANDING_ADDR,
                landing_rkeys: [LANDING_RKEY; MAX_DEVS],
                slot_bytes: eager::slot_bytes(EAGER_MAX),
            }),
            named_imm: o.named_imm,
        };
        Bench {
            core: SendCore::new(cfg, quiet),
            ring: Ring {
                entries: [CtsEntry::default(); RING],
                staged: Vec::new(),
            },
            posted: Vec::new(),
            now: Time::ZERO,
            rx_counter: 0,
            rx_head: 0,
        }
    }

    /// The receiver posts a group of `(size, tag)` buffers (into host memory: eager-ok when
    /// single, with the eager credit when the path is on): its CTS lands in the ring.
    pub(super) fn cts(&mut self, bufs: &[(u64, i32)]) {
        let n = bufs.len();
        let eager = self.core.eager().is_some();
        for (i, &(size, tag)) in bufs.iter().enumerate() {
            let addr = RECV_ADDR + 0x10_0000 * i as u64;
            let mut e = CtsEntry::new(addr, size, [RECV_RKEY; MAX_DEVS], n, tag, self.rx_counter);
            if eager {
                e = e.with_eager(self.rx_counter + SLOTS as u64, n == 1);
            }
            self.ring.entries[fifo::ring_pos(self.rx_head + i as u64)] = e.to_wire();
        }
        self.rx_counter += 1;
        self.rx_head += n as u64;
    }

    fn buf(size: usize, tag: i32) -> SendBuf {
        SendBuf {
            data: SEND_ADDR,
            size,
            tag,
            lkeys: [SEND_LKEY; MAX_DEVS],
            host: true,
        }
    }

    pub(super) fn isend(&mut self, size: usize, tag: i32) -> Result<Isend> {
        let Bench {
            core,
            ring,
            posted,
            now,
            ..
        } = self;
        let now = *now;
        core.isend(ring, || now, Bench::buf(size, tag), &mut |p| {
            record(posted, p);
            Ok(())
        })
    }

    pub(super) fn progress(&mut self) -> Result<()> {
        let Bench {
            core,
            ring,
            posted,
            now,
            ..
        } = self;
        let now = *now;
        core.progress(ring, || now, &mut |p| {
            record(posted, p);
            Ok(())
        })
    }

    /// The NIC completes every chain posted so far and not yet completed, in order.
    pub(super) fn complete_from(&mut self, first: usize) {
        let done: Vec<u64> = self.posted[first..]
            .iter()
            .map(|(_, c)| c.last().map_or(0, |w| w.wr_id))
            .collect();
        for wr_id in done {
            self.core.handle_completion(wr_id);
        }
    }
}

fn record(posted: &mut Vec<(usize, Vec<WorkRequest>)>, p: Post<'_>) {
    if let Post::Send { qp, chain } = p {
        posted.push((qp, chain.to_vec()));
    }
}

/// The request index of an isend that started; panics on any other outcome.
pub(super) fn started(got: Isend) -> u16 {
    match got {
        Isend::Started { idx, .. } => idx,
        other => panic!("not started: {other:?}"),
    }
}
