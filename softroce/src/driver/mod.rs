//! The driver: the NIC's own objects, below the C ABI (`verbs`, the only
//! layer above it) and above the sans-IO core ([`crate::proto`]). Nothing here knows a C
//! struct of the verbs API beyond the `rdma_sys` enums and the `ibv_*`
//! numbering of statuses and events; nothing here imports `verbs`.
//!
//! * [`limits`] — what the device reports and enforces (shared with the core);
//! * [`addr`] — address rules, GIDs, MTU from the link; [`link`] — the link layer (RoCE or
//!   InfiniBand), the subnet-manager stand-in and IB framing; [`link_io`] — what the engine
//!   does with them (send by DLID, receive checks, drops of the other link layer);
//! * [`device`] — the per-process device instance; [`instances`] creates it;
//! * [`mem`] — the MR table and the core's [`crate::proto::MemoryAccess`];
//! * [`cq`], [`srq`], [`event`], [`qp`] — CQ rings and work completions,
//!   shared receive queues, async events, a QP's shared state;
//! * [`engine_state`] and [`engine`] — the progress engine's shared state
//!   and its loop (receive, timers, draining QPs, posting);
//! * [`tx`] — the transmitter (ICRC, GSO batches); [`udp`] — the socket;
//! * [`counters`] — the verbs work an application asks for, per process and per QP;
//! * [`clock`], [`rng`], [`activity`] — the core's clock, the fault
//!   injector's random numbers, the doorbell idle pollers wait on;
//!   [`inject`] — the receive path's loss, reordering and duplication;
//!   [`idle`] — what an empty CQ poll does (yield, receive inline, wait).

pub mod activity;
pub mod addr;
pub mod clock;
pub mod counters;
pub mod cq;
pub mod ctl;
pub mod device;
pub mod engine;
pub mod engine_state;
pub mod event;
pub mod faults;
pub mod idle;
pub mod inject;
pub mod instances;
pub mod limits;
pub mod link;
pub mod link_io;
pub mod mem;
pub mod pinned;
pub mod qp;
pub mod rng;
pub mod srq;
pub mod tx;
pub mod udp;
