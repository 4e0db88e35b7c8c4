//! The exported `ncclNetPlugin_vN` tables (v6–v12, docs/nccl-net-abi.md#abi-versions, #properties)
//! and the shims behind them.
//!
//! `common` holds the slots whose signature every version shares, written against the newest
//! ABI; each `vN` module holds only the adapters its version needs (int sizes, missing
//! arguments, older property structs) and its table. All of them call `crate::api`.

mod call_trace;
pub(crate) mod ffi;
pub mod stats;
#[cfg(feature = "testing")]
pub mod types;
#[cfg(not(feature = "testing"))]
pub(crate) mod types;

mod common;
mod v10;
mod v11;
mod v12;
mod v6;
mod v7;
mod v8;
mod v9;

pub use v10::ncclNetPlugin_v10;
pub use v11::ncclNetPlugin_v11;
pub use v12::ncclNetPlugin_v12;
pub use v6::ncclNetPlugin_v6;
pub use v7::ncclNetPlugin_v7;
pub use v8::ncclNetPlugin_v8;
pub use v9::ncclNetPlugin_v9;
