//! The limits the core enforces, which the device also reports
//! (`ibv_query_device`, `ibv_query_port`): defined here once, re-exported by
//! the driver's `limits`.

/// Largest `max_rd_atomic` / `max_dest_rd_atomic` accepted, and the
/// device's `max_qp_rd_atom` / `max_qp_init_rd_atom` (ConnectX reports 16).
pub const MAX_QP_RD_ATOM: u8 = 16;
/// Largest message length accepted (`max_msg_sz`, 2 GiB like mlx5; rxe: 8 MiB).
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// Largest P_Key table (`pkey_tbl_len`, `SOFTROCE_PKEYS`): a QP's `pkey_index` must be below
/// it here, and below the port's table length at the verbs.
pub const MAX_PKEYS: u16 = 16;
