//! The C layouts we depend on, checked against docs/softroce-internals.md#libibverbs-abi (which
//! was measured
//! by compiling against the installed rdma-core 44 `verbs.h`).

use std::mem::{offset_of, size_of};

use rdma_sys::*;

use super::ctx::Context;

#[test]
fn context_layouts() {
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(offset_of!(verbs_context, query_port), 0);
    assert_eq!(offset_of!(verbs_context, create_cq_ex), 200);
    assert_eq!(offset_of!(verbs_context, query_device_ex), 216);
    assert_eq!(offset_of!(verbs_context, create_qp_ex), 264);
    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, async_fd), 268);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(size_of::<ibv_context_ops>(), 256);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
    assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
    // Our wrapper starts with the verbs_context.
    assert_eq!(offset_of!(Context, vctx), 0);
}

#[test]
fn object_layouts() {
    assert_eq!(size_of::<ibv_device>(), 664);
    assert_eq!(offset_of!(ibv_device, name), 24);
    assert_eq!(offset_of!(ibv_device, ibdev_path), 408);
    assert_eq!(size_of::<ibv_pd>(), 16);
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);
    assert_eq!(size_of::<ibv_comp_channel>(), 16);
    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(offset_of!(ibv_cq, comp_events_completed), 120);
    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, events_completed), 152);
    assert_eq!(size_of::<ibv_srq>(), 128);
    assert_eq!(size_of::<ibv_ah>(), 24);
    assert_eq!(size_of::<ibv_async_event>(), 16);
    // Our wrappers start with the C object.
    assert_eq!(offset_of!(super::cq::Cq, ibv), 0);
    assert_eq!(size_of::<ibv_cq_ex>(), 288);
    assert_eq!(offset_of!(ibv_cq_ex, status), 132);
    assert_eq!(offset_of!(ibv_cq_ex, wr_id), 136);
    assert_eq!(offset_of!(ibv_cq_ex, start_poll), 144);
    assert_eq!(offset_of!(ibv_cq_ex, read_completion_ts), 248);
    assert_eq!(offset_of!(super::qp::Qp, ex), 0);
    assert_eq!(size_of::<ibv_qp_ex>(), 352);
    assert_eq!(offset_of!(ibv_qp_ex, wr_id), 168);
    assert_eq!(offset_of!(ibv_qp_ex, wr_atomic_cmp_swp), 184);
    assert_eq!(offset_of!(ibv_qp_ex, wr_start), 320);
    assert_eq!(offset_of!(ibv_qp_ex, wr_set_sge), 304);
    assert_eq!(offset_of!(super::mr::Pd, ibv), 0);
    assert_eq!(offset_of!(super::mr::Mr, ibv), 0);
    assert_eq!(offset_of!(super::cq::Channel, ibv), 0);
    assert_eq!(offset_of!(super::srq::Srq, ibv), 0);
    assert_eq!(offset_of!(crate::verbs::context::IbvDevice, ibv), 0);
}

#[test]
fn wr_and_wc_layouts() {
    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
    assert_eq!(offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union), 36);
    assert_eq!(offset_of!(ibv_send_wr, wr), 40);
    assert_eq!(offset_of!(atomic_t, compare_add), 8);
    assert_eq!(offset_of!(atomic_t, swap), 16);
    assert_eq!(offset_of!(atomic_t, rkey), 24);
    assert_eq!(size_of::<ibv_recv_wr>(), 32);
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(offset_of!(ibv_wc, imm_data_invalidated_rkey_union), 24);
    assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
    assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);
}

#[test]
fn attr_layouts() {
    assert_eq!(size_of::<ibv_qp_cap>(), 20);
    assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
    assert_eq!(offset_of!(ibv_qp_init_attr, sq_sig_all), 56);
    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
    assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
    assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
    assert_eq!(size_of::<ibv_ah_attr>(), 32);
    assert_eq!(offset_of!(ibv_ah_attr, is_global), 29);
    assert_eq!(size_of::<ibv_global_route>(), 24);
    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(offset_of!(ibv_device_attr, vendor_part_id), 100);
    assert_eq!(offset_of!(ibv_device_attr, max_qp_rd_atom), 144);
    assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
    assert_eq!(size_of::<ibv_device_attr_ex>(), 400);
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
    assert_eq!(super::port::COMPAT_PORT_ATTR_LEN, 48);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert_eq!(size_of::<ibv_gid_entry>(), 32);
    assert_eq!(offset_of!(ibv_gid_entry, gid_type), 24);
    // Kernel ABI structs of the copy helpers (rdma/ib_user_verbs.h, ib_user_sa.h, infiniband/sa.h).
    assert_eq!(size_of::<super::stubs::IbUverbsAhAttr>(), 32);
    assert_eq!(size_of::<super::stubs::IbUverbsQpAttr>(), 144);
    assert_eq!(size_of::<super::stubs::IbUserPathRec>(), 64);
    assert_eq!(size_of::<super::stubs::IbvSaPathRec>(), 64);
}

/// `struct softroce_counters` of softroce/include/softroce_counters.h (the harness checks the
/// same figures with _Static_assert).
#[test]
fn counters_layout() {
    use crate::driver::counters::CountersRepr;
    assert_eq!(size_of::<CountersRepr>(), 160);
    assert_eq!(offset_of!(CountersRepr, size), 4);
    assert_eq!(offset_of!(CountersRepr, post_send_calls), 8);
    assert_eq!(offset_of!(CountersRepr, post_recv_calls), 88);
    assert_eq!(offset_of!(CountersRepr, poll_cq_calls), 104);
    assert_eq!(offset_of!(CountersRepr, tx_packets), 128);
    assert_eq!(offset_of!(CountersRepr, retransmits), 152);
}
