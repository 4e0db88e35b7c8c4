//! Connection setup (docs/nccl-net-abi.md#connection-setup): the listener's side
//! ([`listen`](mod@listen), its shared [`process_listener`]) and the connector's side
//! ([`connect`](mod@connect)). Both run the pure setup states of
//! [`proto::setup`](super::proto::setup) over the side channel ([`sidechannel`](super::sidechannel))
//! and build a connection's resources with [`conn`](super::conn).

pub mod connect;
pub mod foreign;
pub mod listen;
pub mod process_listener;
