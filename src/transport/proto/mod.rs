//! The transport's sans-IO core: the protocol of a connection as pure state machines.
//!
//! Nothing here touches a NIC, a socket, a thread or a clock: inputs are calls (`isend`,
//! `irecv`, `handle_*` for a completion or a handshake message), the work requests a call
//! plans go out, in order, through its `post` callback, and results are polled (`test`,
//! `state.check`). Time is an argument ([`time::Time`]), asked for only where a deadline is
//! checked. Why this shape and not `poll_transmit`: docs/design/core-shape.md. The I/O layer
//! around it (the files of `transport/` outside this folder) turns plans into verbs calls and
//! completions into inputs; `tests/sim_transport.rs` runs two
//! endpoints of this core against an in-memory NIC on a virtual clock.
//!
//! * [`send::SendCore`] — the sender: reads the receiver's CTS entries from its FIFO ring
//!   ([`fifo`]), matches isends to them by tag, plans the RDMA writes ([`split`]) within
//!   send-queue credits; one concept per file of `send/`.
//! * [`recv::RecvCore`] — the receiver: plans receives and CTS writes into the sender's ring,
//!   counts completions, reports sizes; plans GPU-flush reads; one concept per file of `recv/`.
//! * [`handshake`] — the connection handle, the endpoint record and the side-channel frames.
//! * [`request`] — the request slots NCCL holds pointers to, and `wr_id` layouts.
//! * [`eager`] — the eager path's formats and the rule both ends decide claims with.
//! * [`link`] — one side-channel link per pair of processes: routing and the choices of both
//!   ends.
//! * [`hang`] — what a send that completes nothing waits for, from the facts the I/O layer
//!   gathers (the hang report's cause).
//!
//! Dependencies point one way: this folder uses only `std` (no `std::net`, no
//! `std::time::Instant`), `crate::error` and itself; `ci/tests/05-layers.sh` checks it.
#![forbid(unsafe_code)]

pub mod eager;
pub mod fifo;
pub mod handshake;
pub mod hang;
pub mod limits;
pub mod link;
pub mod plan;
pub mod recovery;
pub mod recv;
pub mod request;
pub mod send;
pub mod setup;
pub mod split;
pub mod state;
pub mod time;
pub mod wr_latency;
