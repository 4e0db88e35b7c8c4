//! The data path of an established connection: the sender's and the receiver's I/O layers
//! ([`send`], [`recv`]) over one [`driver`] each, the requests NCCL holds ([`requests`]) (posts, polls, completion errors
//! ([`completion_errors`])), the cores' side of the driver ([`sink`]), the registered ring
//! blocks the peer's NIC writes into ([`ring_memory`]), and the lock around each comm's data
//! path with the progress of comms NCCL is not calling ([`watch`]), and the work-request latency
//! monitor ([`wr_monitor`]).

pub(crate) mod completion_errors;
mod describe;
pub mod driver;
pub mod recv;
pub(crate) mod requests;
pub(crate) mod ring_memory;
pub(crate) mod send;
pub(crate) mod sink;
pub(crate) mod watch;
pub(crate) mod wr_monitor;
