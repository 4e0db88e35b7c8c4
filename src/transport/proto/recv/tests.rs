//! The receiver's test bench, in the simulated-pair style: one [`RecvCore`], its CTS staging
//! ring (the entries it stores, the completion records and eager headers the sender's NIC
//! writes, which a test writes as that NIC would), and every post collected in order. Each file
//! of `recv/` tests its own concept on it, one state at a time.

use super::super::eager::{self, Header, Imm, EAGER_HEADER_BYTES, EAGER_QP, SLOTS};
use super::super::fifo::{CtsEntry, RING};
use super::super::limits::{MAX_DEVS, MAX_RECVS};
use super::super::plan::{LocalBlock, Post, QpRoute, RemoteBlock, WorkRequest};
use super::wr_id::{wr_id, KIND_RECV};
use super::{EagerRecvConfig, Irecv, RecvBuf, RecvConfig, RecvCore, StagingRing};

/// Addresses and keys of the bench, distinct so that a WR's fields say where they came from.
pub(super) const STAGING_ADDR: u64 = 0x1000_0000;
pub(super) const STAGING_LKEY: u32 = 0x11;
pub(super) const FIFO_ADDR: u64 = 0x2000_0000;
pub(super) const FIFO_RKEY: u32 = 0x22;
pub(super) const LANDING_ADDR: u64 = 0x3000_0000;
pub(super) const RECV_ADDR: usize = 0x5000_0000;
pub(super) const RECV_RKEY: u32 = 0x55;
/// The bench's largest eager payload.
pub(super) const EAGER_MAX: usize = 64;

/// The receiver's staging ring.
pub(super) struct Staging {
    pub entries: [CtsEntry; RING],
    pub records: [[u32; MAX_RECVS]; RING],
    pub headers: [[u8; EAGER_HEADER_BYTES]; SLOTS],
}

impl StagingRing for Staging {
    fn store_entry(&mut self, pos: usize, wire: &CtsEntry) {
        self.entries[pos] = *wire;
    }
    fn load_record(&self, pos: usize, i: usize) -> u32 {
        self.records[pos][i]
    }
    fn load_eager_header(&self, slot: usize) -> [u8; EAGER_HEADER_BYTES] {
        self.headers[slot]
    }
}

/// One post, owned.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Posted {
    Send { qp: usize, chain: Vec<WorkRequest> },
    Recv { qp: usize, wr_id: u64, count: usize },
    Flush { dev: usize, wr: WorkRequest },
    Deliver { src: u64, dst: u64, len: usize },
}

/// The wire's options a bench connection has.
#[derive(Clone, Copy)]
pub(super) struct Opts {
    pub qps: usize,
    pub eager: bool,
    pub named_imm: bool,
}

pub(super) const PLAIN: Opts = Opts {
    qps: 1,
    eager: false,
    named_imm: false,
};
pub(super) const EAGER: Opts = Opts {
    qps: 1,
    eager: true,
    named_imm: true,
};

pub(super) struct Bench {
    pub core: RecvCore,
    pub ring: Staging,
    pub posted: Vec<Posted>,
}

fn quiet(_: &crate::error::Error) {}

fn record(posted: &mut Vec<Posted>, p: Post<'_>) {
    posted.push(match p {
        Post::Send { qp, chain } => Posted::Send {
            qp,
            chain: chain.to_vec(),
        },
        Post::Recv { qp, wr_id, count } => Posted::Recv { qp, wr_id, count },
        Post::Flush { dev, wr } => Posted::Flush { dev, wr },
        Post::Deliver { src, dst, len } => Posted::Deliver { src, dst, len },
    });
}

impl Bench {
    pub(super) fn new(o: Opts) -> Bench {
        let cfg = RecvConfig {
            routes: vec![QpRoute::default(); o.qps],
            cts_qps: 1,
            qps_per_req: 1,
            staging: LocalBlock {
                addr: STAGING_ADDR,
                lkeys: [STAGING_LKEY; MAX_DEVS],
            },
            peer_fifo: RemoteBlock {
                addr: FIFO_ADDR,
                rkeys: [FIFO_RKEY; MAX_DEVS],
            },
            cts_inline_max: [0; MAX_DEVS],
            max_buffer_bytes: 1 << 20,
            wr_bytes: 1 << 20,
            peer: "the bench's sender".into(),
            eager: o.eager.then_some(EagerRecvConfig {
                landing: LANDING_ADDR,
                slot_bytes: eager::slot_bytes(EAGER_MAX),
                max: EAGER_MAX,
            }),
            named_imm: o.named_imm,
        };
        Bench {
            core: RecvCore::new(cfg, quiet),
            ring: Staging {
                entries: [CtsEntry::default(); RING],
                records: [[0; MAX_RECVS]; RING],
                headers: [[0; EAGER_HEADER_BYTES]; SLOTS],
            },
            posted: Vec::new(),
        }
    }

    /// The buffer `i` of a group: host memory, 1 MiB apart.
    pub(super) fn buf(i: usize, size: usize, tag: i32) -> RecvBuf {
        RecvBuf {
            data: RECV_ADDR + (i << 20),
            size,
            tag,
            rkeys: [RECV_RKEY; MAX_DEVS],
            host: true,
        }
    }

    /// Post a receive of `(size, tag)` buffers.
    pub(super) fn irecv(&mut self, bufs: &[(usize, i32)]) -> crate::error::Result<Irecv> {
        let bufs: Vec<RecvBuf> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(s, t))| Bench::buf(i, s, t))
            .collect();
        let Bench { core, ring, posted } = self;
        core.irecv(ring, &bufs, &mut |p| {
            record(posted, p);
            Ok(())
        })
    }

    pub(super) fn started(&mut self, bufs: &[(usize, i32)]) -> u16 {
        match self.irecv(bufs) {
            Ok(Irecv::Started(idx)) => idx,
            other => panic!("not started: {other:?}"),
        }
    }

    /// The sender's write with immediate `imm` completes a receive on QP `qp`.
    pub(super) fn complete(&mut self, qp: usize, imm: Option<u32>) {
        self.core.handle_completion(wr_id(KIND_RECV, qp as u16), imm);
    }

    pub(super) fn flush_cts(&mut self) {
        let Bench { core, posted, .. } = self;
        core.flush_cts(&mut |p| {
            record(posted, p);
            Ok(())
        })
        .unwrap();
    }

    /// The sender's eager message `h` lands in its slot and completes on the eager QP.
    pub(super) fn eager_lands(&mut self, h: Header) {
        let slot = eager::slot_of(u64::from(h.seq));
        self.ring.headers[slot] = h.to_bytes();
        self.complete(EAGER_QP, Some(Imm::Eager { slot }.to_u32()));
    }

    pub(super) fn decide_eager(&mut self) -> crate::error::Result<()> {
        let Bench { core, ring, posted } = self;
        core.decide_eager(ring, &mut |p| {
            record(posted, p);
            Ok(())
        })
    }

    /// The CTS writes posted so far, as (staging position, entries, signaled).
    pub(super) fn cts_writes(&self) -> Vec<(u64, u32, bool)> {
        self.posted
            .iter()
            .filter_map(|p| match p {
                Posted::Send { chain, .. } => chain.first().map(|w| {
                    let at = w.local.map_or(0, |s| s.addr - STAGING_ADDR);
                    (at / 64, w.local.map_or(0, |s| s.len / 64), w.signaled)
                }),
                _ => None,
            })
            .collect()
    }
}
