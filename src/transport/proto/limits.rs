//! The bounds every layer of the transport agrees on, each defined once.

/// Most buffers in one grouped receive (the `maxRecvs` the properties report).
pub const MAX_RECVS: usize = 8;
/// Most member devices of a fused device (v12 `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS: usize = 8;
/// Most QPs of one connection: NCCL_IB_QPS_PER_CONNECTION (≤ 128) × [`MAX_DEVS`].
pub const MAX_QPS: usize = 128 * MAX_DEVS;
/// Largest RDMA WRITE one work request carries: a longer chunk is cut into pieces of at most
/// this many bytes (or of the device's smaller `max_msg_sz`). 1 GiB is mlx5's `max_msg_sz`, and
/// the largest message NCCL itself ever posts.
pub const MAX_WR_BYTES: usize = 1 << 30;
/// Most pieces one buffer's chunk may take on a QP, so that a group of [`MAX_RECVS`] buffers
/// and its completion write always fit one chain of [`MAX_CHAIN`] WRs.
pub const PIECES_PER_BUFFER: usize = 7;
/// Most WRs in one chain: every piece of every buffer of a group, and the completion write.
pub const MAX_CHAIN: usize = MAX_RECVS * PIECES_PER_BUFFER + 1;
