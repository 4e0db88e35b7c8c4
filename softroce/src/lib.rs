//! softroce: a userspace RoCEv2 NIC shipped as a drop-in `libibverbs.so.1`.
//!
//! Layers (dependencies point one way): [`wire`] (RoCEv2 headers, ICRC) ->
//! [`proto`] (sans-IO RC transport) -> [`udp`] / [`engine`] / [`device`]
//! (the driver) -> [`verbs`] (the exported C ABI).

pub mod proto;
pub mod wire;

pub mod activity;
pub mod config;
pub mod device;
pub mod engine;
pub mod udp;
pub mod verbs;
