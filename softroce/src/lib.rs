//! softroce: a userspace RoCEv2 NIC shipped as a drop-in `libibverbs.so.1`.
//!
//! Layers (dependencies point one way): [`wire`] (RoCEv2 headers, ICRC) ->
//! [`proto`] (sans-IO RC transport) -> [`driver`] (the NIC: device, memory
//! translation, CQs, SRQs, events, engine loop, UDP) -> [`verbs`] (the
//! exported C ABI: converts C structs and errnos, calls the driver).
//! [`config`] (the environment tunables) is read by the driver and verbs.

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod proto;
pub mod wire;

pub mod config;
pub mod driver;
pub mod verbs;
