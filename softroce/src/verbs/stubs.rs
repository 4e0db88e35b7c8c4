//! The provider-facing `IBVERBS_PRIVATE_34` API and the kernel-ABI copy helpers.
//!
//! The private API exists so that rdma-core 44 provider libraries that
//! perftest links (`libmlx5`, `libefa`) load; with no kernel device there is
//! no command channel, so every `ibv_cmd_*` / `execute_ioctl` fails with
//! ENOSYS. Provider registration is accepted and ignored (no provider is ever
//! consulted: this library is the device).

use std::ffi::{c_int, c_uint, c_void};

use rdma_sys::{ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_qp_attr};

use super::ffi_guard;

macro_rules! enosys_cmds {
    ($($name:ident),* $(,)?) => {$(
        /// Kernel command of the provider API: no kernel device, so ENOSYS.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            ffi_guard!(libc::ENOSYS, { super::int_err(libc::ENOSYS) })
        }
    )*};
}

enosys_cmds!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

/// `unsigned __ioctl_final_num_attrs(unsigned num_attrs, struct ibv_command_buffer *link)`:
/// only meaningful with a command buffer chain, which nothing can build here;
/// returns `num_attrs` (the count of a chain without links).
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    ffi_guard!(num_attrs, { num_attrs })
}

/// Provider debug logging (variadic in C; extra arguments are ignored).
/// rdma-core prints only when `VERBS_LOG_LEVEL` asks for it; providers never
/// run here, so there is nothing to print.
#[no_mangle]
pub extern "C" fn __verbs_log(_ctx: *mut c_void, _fmt: *const libc::c_char) {
    ffi_guard!((), {})
}

/// Providers allocate their contexts through this; none can run here.
#[no_mangle]
pub extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
    ffi_guard!(std::ptr::null_mut(), { super::null_err(libc::ENOSYS) })
}

#[no_mangle]
pub extern "C" fn verbs_open_device() -> *mut c_void {
    ffi_guard!(std::ptr::null_mut(), { super::null_err(libc::ENOSYS) })
}

/// Called by the constructors of libmlx5/libefa when perftest loads them.
/// softroce is its own (only) device, so provider registrations are ignored.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {
    ffi_guard!((), {})
}

/// Only reachable from a provider's alloc_context, which never runs here.
#[no_mangle]
pub extern "C" fn verbs_set_ops(_vctx: *mut c_void, _ops: *const c_void) {
    ffi_guard!((), {})
}

#[no_mangle]
pub extern "C" fn verbs_uninit_context(_vctx: *mut c_void) {
    ffi_guard!((), {})
}

/// `bool verbs_allow_disassociate_destroy(int ret)`: no device can be
/// disassociated, so an error stays an error.
#[no_mangle]
pub extern "C" fn verbs_allow_disassociate_destroy(_ret: c_int) -> bool {
    ffi_guard!(false, { false })
}

/// `void verbs_init_cq(cq, ctx, channel, cq_context)`: initialise the generic CQ fields.
///
/// # Safety
/// `cq` must be NULL or valid for writing one `ibv_cq` that no other thread uses yet.
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `channel` must be NULL or a live completion channel of ours (`ibv_create_comp_channel`).
#[no_mangle]
pub unsafe extern "C" fn verbs_init_cq(
    cq: *mut ibv_cq,
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
) {
    ffi_guard!((), {
        if cq.is_null() {
            return;
        }
        // SAFETY: the caller passes a CQ it owns.
        unsafe {
            (*cq).context = ctx;
            (*cq).channel = channel;
            (*cq).cq_context = cq_context;
            (*cq).comp_events_completed = 0;
            (*cq).async_events_completed = 0;
            libc::pthread_mutex_init(std::ptr::addr_of_mut!((*cq).mutex).cast(), std::ptr::null());
            libc::pthread_cond_init(std::ptr::addr_of_mut!((*cq).cond).cast(), std::ptr::null());
        }
    })
}

/// `ibv_read_ibdev_sysfs_file(buf, size, sysfs_dev, fmt, ...)`: a provider
/// helper about kernel devices; there are none.
#[no_mangle]
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    ffi_guard!(-1, { super::minus_one(libc::ENOSYS) })
}

// ---- kernel ABI copy helpers (pure data conversions, implemented for real) ----

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbUverbsGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reserved: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbUverbsAhAttr {
    pub grh: IbUverbsGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub reserved: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbUverbsQpAttr {
    pub qp_attr_mask: u32,
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub ah_attr: IbUverbsAhAttr,
    pub alt_ah_attr: IbUverbsAhAttr,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 5],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbUserPathRec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: u32,
    pub flow_label: u32,
    pub reversible: u32,
    pub mtu: u32,
    pub pkey: u16,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub numb_path: u8,
    pub sl: u8,
    pub mtu_selector: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct ibv_sa_path_rec` (infiniband/sa.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSaPathRec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

fn ah_from_kern(dst: &mut ibv_ah_attr, src: &IbUverbsAhAttr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// # Safety
/// `dst` must be NULL or valid for reads and writes of one `ibv_ah_attr`.
/// `src` must be NULL or valid for reading one `IbUverbsAhAttr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut ibv_ah_attr, src: *const IbUverbsAhAttr) {
    ffi_guard!((), {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: both pointers are valid per the API contract.
        unsafe { ah_from_kern(&mut *dst, &*src) };
    })
}

/// # Safety
/// `dst` must be NULL or valid for reads and writes of one `ibv_qp_attr`.
/// `src` must be NULL or valid for reading one `IbUverbsQpAttr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut ibv_qp_attr, src: *const IbUverbsQpAttr) {
    ffi_guard!((), {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: both pointers are valid per the API contract.
        let (d, s) = unsafe { (&mut *dst, &*src) };
        d.cur_qp_state = s.cur_qp_state;
        d.path_mtu = s.path_mtu;
        d.path_mig_state = s.path_mig_state;
        d.qkey = s.qkey;
        d.rq_psn = s.rq_psn;
        d.sq_psn = s.sq_psn;
        d.dest_qp_num = s.dest_qp_num;
        d.qp_access_flags = s.qp_access_flags;
        d.cap.max_send_wr = s.max_send_wr;
        d.cap.max_recv_wr = s.max_recv_wr;
        d.cap.max_send_sge = s.max_send_sge;
        d.cap.max_recv_sge = s.max_recv_sge;
        d.cap.max_inline_data = s.max_inline_data;
        ah_from_kern(&mut d.ah_attr, &s.ah_attr);
        ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
        d.pkey_index = s.pkey_index;
        d.alt_pkey_index = s.alt_pkey_index;
        d.en_sqd_async_notify = s.en_sqd_async_notify;
        d.sq_draining = s.sq_draining;
        d.max_rd_atomic = s.max_rd_atomic;
        d.max_dest_rd_atomic = s.max_dest_rd_atomic;
        d.min_rnr_timer = s.min_rnr_timer;
        d.port_num = s.port_num;
        d.timeout = s.timeout;
        d.retry_cnt = s.retry_cnt;
        d.rnr_retry = s.rnr_retry;
        d.alt_port_num = s.alt_port_num;
        d.alt_timeout = s.alt_timeout;
    })
}

/// # Safety
/// `dst` must be NULL or valid for reads and writes of one `IbvSaPathRec`.
/// `src` must be NULL or valid for reading one `IbUserPathRec`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut IbvSaPathRec, src: *const IbUserPathRec) {
    ffi_guard!((), {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: both pointers are valid per the API contract.
        let (d, s) = unsafe { (&mut *dst, &*src) };
        d.dgid = s.dgid;
        d.sgid = s.sgid;
        d.dlid = s.dlid;
        d.slid = s.slid;
        d.raw_traffic = s.raw_traffic as c_int;
        d.flow_label = s.flow_label;
        d.reversible = s.reversible as c_int;
        d.mtu = s.mtu as u8;
        d.pkey = s.pkey;
        d.hop_limit = s.hop_limit;
        d.traffic_class = s.traffic_class;
        d.numb_path = s.numb_path;
        d.sl = s.sl;
        d.mtu_selector = s.mtu_selector;
        d.rate_selector = s.rate_selector;
        d.rate = s.rate;
        d.packet_life_time_selector = s.packet_life_time_selector;
        d.packet_life_time = s.packet_life_time;
        d.preference = s.preference;
    })
}

/// # Safety
/// `dst` must be NULL or valid for reads and writes of one `IbUserPathRec`.
/// `src` must be NULL or valid for reading one `IbvSaPathRec`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(dst: *mut IbUserPathRec, src: *const IbvSaPathRec) {
    ffi_guard!((), {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: both pointers are valid per the API contract.
        let (d, s) = unsafe { (&mut *dst, &*src) };
        d.dgid = s.dgid;
        d.sgid = s.sgid;
        d.dlid = s.dlid;
        d.slid = s.slid;
        d.raw_traffic = s.raw_traffic as u32;
        d.flow_label = s.flow_label;
        d.reversible = s.reversible as u32;
        d.mtu = s.mtu as u32;
        d.pkey = s.pkey;
        d.hop_limit = s.hop_limit;
        d.traffic_class = s.traffic_class;
        d.numb_path = s.numb_path;
        d.sl = s.sl;
        d.mtu_selector = s.mtu_selector;
        d.rate_selector = s.rate_selector;
        d.rate = s.rate;
        d.packet_life_time_selector = s.packet_life_time_selector;
        d.packet_life_time = s.packet_life_time;
        d.preference = s.preference;
    })
}
