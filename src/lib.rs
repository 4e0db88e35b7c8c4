//! ferroce: an NCCL network plugin over RDMA (RoCEv2 and InfiniBand) queue pairs.
//!
//! Layers, dependencies pointing one way: `config`, `log`, `error`, `memory` → `ibv` (libibverbs
//! loaded at run time) → `device` (discovery, GID selection, properties) → `transport`
//! (connections and the data path; its protocol core `transport::proto` is pure) → `api` (the
//! one internal API, with `stats_file` beside it: the statistics file the transport's counters
//! are written to) → `abi` (the exported `ncclNetPlugin_vN` tables, thin per-version shims).
//! `ci/tests/05-layers.sh` fails on an import against this order and on an import cycle
//! between files.

#![deny(clippy::undocumented_unsafe_blocks)]

/// This build's version, as `ferroce-doctor` compares it between hosts.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[macro_use]
pub mod log;
pub mod abi;
pub mod api;
pub mod config;
pub mod device;
pub mod error;
pub mod ibv;
pub mod memory;
pub mod profiler;
pub mod stats_file;
pub mod transport;
