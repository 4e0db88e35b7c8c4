//! ferroce: an NCCL network plugin over RDMA (RoCEv2 and InfiniBand) queue pairs.
//!
//! Layers, dependencies pointing one way: `config`, `log`, `error`, `memory` → `ibv` (libibverbs
//! loaded at run time) → `device` (discovery, GID selection, properties) → `transport`
//! (connections and the data path; its protocol core `transport::proto` is pure) → `api` (the
//! one internal API, with `stats_file` beside it: the statistics file the transport's counters
//! are written to) → `abi` (the exported `ncclNetPlugin_vN` tables, thin per-version shims).
//! `ci/tests/05-layers.sh` fails on an import against this order and on an import cycle
//! between files. Public: what NCCL, `ferroce-doctor` and the C header need; the `testing`
//! feature (on for the tests, simulations and fuzz targets only) also makes the protocol core and
//! the connection internals public.

#![deny(clippy::undocumented_unsafe_blocks)]
// The crate's API is what the doctor, the header and the tests use: with the tests' view on
// (`testing`), an item marked `pub` that nothing outside can reach is a finding; without it the
// core is crate-private and the lint would flag what only the tests reach.
#![cfg_attr(feature = "testing", warn(unreachable_pub))]

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
pub(crate) mod memory;
pub mod profiler;
pub(crate) mod stats_file;
pub mod transport;
