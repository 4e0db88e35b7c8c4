//! Completion errors: one WARN that says where, what and what to check
//! (docs/nccl-net-abi.md#data-path).

use crate::error::{Error, ErrorKind};
// `ibv_wc_status` values, as rdma-sys declares them.
use crate::ibv::sys::ibv_wc_status as S;

/// What to check for a failed completion, chosen by status.
pub(crate) fn hint(st: u32) -> &'static str {
    match st {
        S::IBV_WC_RETRY_EXC_ERR => "the peer did not acknowledge (transport retries exhausted): the peer process may have died, or the path is broken — check the GID index (NCCL_IB_GID_INDEX), IP routing/VLAN between the GIDs, MTU, and raise NCCL_IB_TIMEOUT/NCCL_IB_RETRY_CNT on lossy fabrics",
        S::IBV_WC_RNR_RETRY_EXC_ERR => "receiver not ready: the peer did not post receives in time (peer stuck or dead)",
        S::IBV_WC_REM_ACCESS_ERR => "the peer refused the RDMA access: the address and rkey it advertised (for a data write, in its CTS entry) are no registration of its — a bad or stale rkey, an address outside its registered buffer, or a buffer deregistered while in use; check memory registration on the peer",
        S::IBV_WC_LOC_PROT_ERR | S::IBV_WC_LOC_ACCESS_ERR => "a local buffer is not covered by its registration (wrong mhandle or buffer freed/deregistered while in use)",
        S::IBV_WC_LOC_LEN_ERR => "a local length error: the message does not fit the posted receive (sender and receiver disagree on sizes)",
        S::IBV_WC_REM_INV_REQ_ERR => "the peer rejected the request as invalid: sizes, opcode or QP configuration mismatch between the two ends",
        S::IBV_WC_REM_OP_ERR => "the peer failed to carry out the operation (remote QP in error, or a memory problem on the peer)",
        S::IBV_WC_LOC_QP_OP_ERR => "a local QP error: the work request was malformed or the QP is misconfigured",
        S::IBV_WC_WR_FLUSH_ERR => "the work request was flushed because the QP had already failed (an earlier error is the cause)",
        S::IBV_WC_BAD_RESP_ERR | S::IBV_WC_RESP_TIMEOUT_ERR => "the peer sent an unexpected or no response — check the fabric and NCCL_IB_TIMEOUT",
        S::IBV_WC_REM_ABORT_ERR => "the peer aborted the operation",
        S::IBV_WC_FATAL_ERR | S::IBV_WC_GENERAL_ERR => "the NIC reported a fatal/general error — check `dmesg` and the link state",
        _ => "check the link, the GID index and both peers' logs",
    }
}

/// NCCL return class for a failed completion: local resource / protection faults are system
/// errors; everything that involves the peer or the path is a remote error.
pub(crate) fn kind_for(st: u32) -> ErrorKind {
    match st {
        S::IBV_WC_LOC_LEN_ERR
        | S::IBV_WC_LOC_QP_OP_ERR
        | S::IBV_WC_LOC_PROT_ERR
        | S::IBV_WC_LOC_ACCESS_ERR
        | S::IBV_WC_FATAL_ERR => ErrorKind::System,
        _ => ErrorKind::Remote,
    }
}

/// Everything the WARN names.
#[derive(Debug, Clone)]
pub(crate) struct WcErrorReport<'a> {
    pub device: &'a str,
    pub port: u8,
    pub local_gid: &'a [u8; 16],
    pub peer_gid: &'a [u8; 16],
    pub peer_addr: &'a str,
    pub qp_num: u32,
    pub operation: &'a str,
    pub bytes: usize,
    pub status: u32,
    pub status_str: &'a str,
    pub vendor_err: u32,
}

/// Build the error (its message is the WARN text).
pub(crate) fn wc_error(r: &WcErrorReport<'_>) -> Error {
    let msg = format!(
        "completion error on {}:{} QP {:#x} ({}, {} bytes): {} (status {}, vendor error {:#x}); local GID {}, peer GID {}, peer {}. Hint: {}",
        r.device,
        r.port,
        r.qp_num,
        r.operation,
        r.bytes,
        r.status_str,
        r.status,
        r.vendor_err,
        crate::device::format_gid(r.local_gid),
        crate::device::format_gid(r.peer_gid),
        r.peer_addr,
        hint(r.status),
    );
    Error::new(kind_for(r.status), msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_everything() {
        let g1 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 40, 1];
        let g2 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 40, 2];
        let e = wc_error(&WcErrorReport {
            device: "softroce0",
            port: 1,
            local_gid: &g1,
            peer_gid: &g2,
            peer_addr: "127.0.0.1:4242",
            qp_num: 0x11,
            operation: "RDMA write",
            bytes: 4096,
            status: S::IBV_WC_RETRY_EXC_ERR,
            status_str: "transport retry counter exceeded",
            vendor_err: 0,
        });
        assert_eq!(e.kind, ErrorKind::Remote);
        for want in [
            "softroce0:1",
            "0x11",
            "RDMA write",
            "4096 bytes",
            "transport retry counter exceeded",
            "::ffff:127.0.40.1",
            "::ffff:127.0.40.2",
            "127.0.0.1:4242",
            "NCCL_IB_GID_INDEX",
            "NCCL_IB_TIMEOUT",
        ] {
            assert!(e.message.contains(want), "missing {want:?} in {}", e.message);
        }
        assert_eq!(kind_for(S::IBV_WC_LOC_PROT_ERR), ErrorKind::System);
        assert!(hint(S::IBV_WC_REM_ACCESS_ERR).contains("registration"));
        assert!(hint(S::IBV_WC_RNR_RETRY_EXC_ERR).contains("not post"));
    }
}
