//! The device's limits and identity: what `ibv_query_device` /
//! `ibv_query_port` report and what the verbs checks enforce.
//!
//! The limits the protocol core enforces itself are defined once, in
//! [`crate::proto::limits`], and re-exported here, so what the device reports
//! is what the core accepts.

pub use crate::proto::limits::{MAX_MSG_SZ, MAX_QP_RD_ATOM};

/// Device identity advertised by `ibv_query_device`.
pub const VENDOR_ID: u32 = 0x00ff_fffe;
/// Outside perftest's table of known parts (keeps it on `ibv_post_send`).
pub const VENDOR_PART_ID: u32 = 0x5ec0;
pub const MAX_QP: u32 = 1 << 16;
pub const MAX_QP_WR: u32 = 16 * 1024;
pub const MAX_SGE: u32 = 32;
pub const MAX_CQE: u32 = 1 << 20;
pub const MAX_MR: u32 = 1 << 20;
pub const MAX_PD: u32 = 1 << 16;
pub const MAX_INLINE: u32 = 256;
pub const MAX_SRQ: u32 = 1 << 16;
pub const MAX_SRQ_WR: u32 = 16 * 1024;
/// Responder resources of the whole device (`max_res_rd_atom`): every QP's
/// `max_dest_rd_atomic` at its largest, for 1024 QPs.
pub const MAX_RES_RD_ATOM: u32 = MAX_QP_RD_ATOM as u32 * 1024;

// The verbs report it through an `int` field of `ibv_device_attr`.
const _: () = assert!(MAX_RES_RD_ATOM <= i32::MAX as u32);

/// Number of GID table entries reported (`gid_tbl_len`); 0..3 are filled.
pub const GID_TABLE_LEN: usize = 16;
