//! Slots shared by several table versions, written against the newest ABI, one concept a file:
//! setup and teardown of contexts and connections (`setup`), device properties and virtual
//! devices (`properties`), memory registration (`memory`), the data path (`data`), closing comms
//! (`close`), and turning NCCL's pointers into ours (`handles`).
//!
//! Every exported function runs inside the panic guard ([`super::ffi::call`], or
//! [`super::ffi::guard`] around an adapter that converts arguments first): no panic crosses into
//! NCCL, errors are logged once and mapped to `ncclResult_t`, and out-pointers are written only
//! on success.

mod close;
mod data;
mod handles;
mod memory;
mod properties;
mod setup;

pub(super) use close::*;
pub(super) use data::*;
pub(super) use memory::*;
pub(super) use properties::*;
pub(super) use setup::*;
