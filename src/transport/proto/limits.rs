//! The bounds every layer of the transport agrees on, each defined once.

/// Most buffers in one grouped receive (the `maxRecvs` the properties report).
pub const MAX_RECVS: usize = 8;
/// Most member devices of a fused device (v12 `NCCL_NET_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS: usize = 8;
/// Most QPs of one connection: NCCL_IB_QPS_PER_CONNECTION (≤ 128) × [`MAX_DEVS`].
pub const MAX_QPS: usize = 128 * MAX_DEVS;
