//! The one declaration of every environment variable ferroce reads: name, type, default,
//! accepted values and meaning (the aws-ofi-nccl `OFI_NCCL_PARAM_*` model). Everything else
//! comes from this table: the `Config` fields, the parser and its warnings, the INFO `config:`
//! line and the `NCCL_DEBUG_SUBSYS=ENV` table, the doctor's checks of names and values, and
//! `docs/configuration.md`. Code elsewhere names a variable through `var::<field>`.
//!
//! For NCCL's own variables the default is NCCL's (`nccl_default` records it where ferroce's
//! differs). The doc comment of an entry is its meaning in the docs' table: keep it one
//! sentence or two.

use super::kind::{flag, int, lenient, parse_u64_bits, show_hex, strict, text, Kind, Reader, Setting};
use super::list::{
    env_subsys_requested, parse_addr_range, parse_any_family, parse_interfaces, show_addr_range, show_any_family,
    show_interfaces, AddrFamily, AddrRange, DeviceFilter,
};

/// How `docs/configuration.md` groups the variables (the INFO and ENV tables keep the
/// declaration order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Devices,
    Qps,
    Gpu,
    Setup,
    Recovery,
    DataPath,
    Diagnostics,
}

impl Group {
    pub const ALL: [Group; 7] = [
        Group::Devices,
        Group::Qps,
        Group::Gpu,
        Group::Setup,
        Group::Recovery,
        Group::DataPath,
        Group::Diagnostics,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Group::Devices => "Devices and addresses",
            Group::Qps => "Queue pairs and traffic",
            Group::Gpu => "GPU memory",
            Group::Setup => "Connection setup",
            Group::Recovery => "Failures and recovery",
            Group::DataPath => "Data path",
            Group::Diagnostics => "Diagnostics",
        }
    }
}

/// One declared variable, its kind rendered to text (for the docs and the doctor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunable {
    pub name: &'static str,
    /// The `Config` field that holds its value.
    pub field: &'static str,
    pub group: Group,
    pub ty: &'static str,
    pub default: String,
    /// NCCL's own default, where ferroce's differs.
    pub nccl_default: Option<&'static str>,
    pub accepts: String,
    pub meaning: String,
}

impl Tunable {
    fn of<T: 'static>(name: &'static str, field: &'static str, group: Group, doc: &[&str], kind: &Kind<T>) -> Self {
        let meaning: Vec<&str> = doc.iter().map(|line| line.trim()).collect();
        Tunable {
            name,
            field,
            group,
            ty: kind.ty,
            default: kind.doc_default.clone(),
            nccl_default: kind.nccl_default,
            accepts: kind.accepts.clone(),
            meaning: meaning.join(" "),
        }
    }
}

/// Declares the variables: `field: Type = "NAME" in Group => kind;`, each after its doc comment.
/// Generates `Config`, `var`, the kinds, `Config::default`, the reader, `Config::settings` and
/// `tunables()`.
macro_rules! tunables {
    ($(
        $(#[doc = $doc:literal])+
        $field:ident: $ty:ty = $name:literal in $group:ident => $kind:expr;
    )+) => {
        /// The resolved configuration: one field per declared variable (docs/configuration.md).
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $(
                #[doc = concat!("`", $name, "`:")]
                $(#[doc = $doc])+
                pub $field: $ty,
            )+
        }

        /// Each variable's name, under its `Config` field's name: code outside the table names
        /// a variable only through these.
        #[allow(non_upper_case_globals)]
        pub mod var {
            $( pub const $field: &str = $name; )+
        }

        /// Each variable's kind, under its `Config` field's name.
        mod kinds {
            use super::*;
            $( pub(super) fn $field() -> Kind<$ty> { $kind } )+
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $( $field: kinds::$field().default, )+ }
            }
        }

        impl Config {
            /// Reads every declared variable, in declaration order.
            pub(super) fn read(r: &mut Reader<'_>) -> Config {
                Config { $( $field: r.read(var::$field, kinds::$field()), )+ }
            }

            /// Every variable with its resolved value as a user would write it, in declaration
            /// order.
            pub fn settings(&self) -> Vec<Setting> {
                vec![$(
                    {
                        let kind = kinds::$field();
                        Setting { name: var::$field, value: kind.show(&self.$field), decides: kind.decides }
                    },
                )+]
            }
        }

        /// Every declared variable, in declaration order.
        pub fn tunables() -> Vec<Tunable> {
            vec![$(
                Tunable::of(var::$field, stringify!($field), Group::$group, &[$($doc),+], &kinds::$field()),
            )+]
        }
    };
}

/// The list syntax, as the docs state it (docs/nccl-net-abi.md#list-syntax).
const LIST_SYNTAX: &str = "`[^][=]name[:port[:rail[:plane]]],…`: `^` excludes, `=` matches whole names \
                           (else prefixes), at most 32 entries";

tunables! {
    /// Which devices and ports to use (every active port when unset).
    hca: DeviceFilter = "NCCL_IB_HCA" in Devices
        => lenient("device list", LIST_SYNTAX, DeviceFilter::default(), DeviceFilter::parse_lenient,
                   DeviceFilter::to_string).decides();
    /// Fixed RoCE GID index; -1 selects one by address family, range and RoCE version. Ignored
    /// on InfiniBand ports (one INFO line says so).
    gid_index: i32 = "NCCL_IB_GID_INDEX" in Devices => int(-1, -1, 65535).special(-1, "(auto)").decides();
    /// The address family of the automatically selected RoCE GID.
    addr_family: AddrFamily = "NCCL_IB_ADDR_FAMILY" in Devices
        => strict("address family", "`AF_INET`, `AF_INET6`", AddrFamily::Inet, AddrFamily::parse, AddrFamily::to_string)
            .decides();
    /// Only GIDs in this prefix are selected; it must be of the selected address family.
    addr_range: Option<AddrRange> = "NCCL_IB_ADDR_RANGE" in Devices
        => strict("CIDR prefix", "`10.1.0.0/16`, `fd00::/64`", None, parse_addr_range, show_addr_range);
    /// The RoCE version of the automatically selected GID.
    roce_version: i32 = "NCCL_IB_ROCE_VERSION_NUM" in Devices => int(2, 1, 2).decides();
    /// InfiniBand GID index used when the port's FLID is set.
    routable_flid_gid_index: i32 = "NCCL_IB_ROUTABLE_FLID_GID_INDEX" in Devices => int(1, 0, 65535);
    /// ACK timeout exponent: 4.096 µs × 2^value.
    timeout: u8 = "NCCL_IB_TIMEOUT" in Qps => int(20, 0, 31);
    /// Transport retries before a send fails.
    retry_cnt: u8 = "NCCL_IB_RETRY_CNT" in Qps => int(7, 0, 7);
    /// Index into the port's P_Key table that the QPs use; a port whose table has no filled entry
    /// there is not used.
    pkey_index: u16 = "NCCL_IB_PKEY" in Qps => int(0, 0, 65535);
    /// The P_Key the QPs use, by value (or by its partition, the low 15 bits): its index in each
    /// port's P_Key table replaces NCCL_IB_PKEY; a port whose table lacks it is not used.
    pkey_value: i32 = "NCCL_IB_PKEY_VALUE" in Qps => int(-1, -1, 65535).special(-1, "(unset)");
    /// Service level; -1 takes the communicator's traffic class, else 0.
    sl: i32 = "NCCL_IB_SL" in Qps => int(-1, -1, 15).special(-1, "(auto)");
    /// RoCE traffic class; -1 takes the communicator's traffic class, else 0.
    tc: i32 = "NCCL_IB_TC" in Qps => int(-1, -1, 255).special(-1, "(auto)");
    /// Traffic class of the receiver's (CTS) QPs; -1 is the data traffic class.
    fifo_tc: i32 = "NCCL_IB_FIFO_TC" in Qps => int(-1, -1, 255).special(-1, "(auto)");
    /// Post the receiver's CTS writes inline.
    use_inline: bool = "NCCL_IB_USE_INLINE" in Qps => flag(false);
    /// QPs per device pair per connection.
    qps_per_connection: u32 = "NCCL_IB_QPS_PER_CONNECTION" in Qps => int(1, 1, 128).decides();
    /// Split each message over all QPs (0: messages go round-robin over the QPs).
    split_data_on_qps: bool = "NCCL_IB_SPLIT_DATA_ON_QPS" in Qps => flag(false);
    /// Size (bytes) above which a message's completion travels separately (adaptive routing).
    ar_threshold: usize = "NCCL_IB_AR_THRESHOLD" in Qps => int(8192, 0, i64::MAX);
    /// Adaptive routing: -2 automatic (on for InfiniBand, off for RoCE), 0 off, 1 on.
    adaptive_routing: i32 = "NCCL_IB_ADAPTIVE_ROUTING" in Qps => int(-2, -2, 1).special(-2, "(auto)");
    /// PCI relaxed ordering of registered memory: 0 off, 1 and 2 on where supported.
    pci_relaxed_ordering: i32 = "NCCL_IB_PCI_RELAXED_ORDERING" in Qps => int(2, 0, 2);
    /// Exchange enhanced connection establishment (ECE) data.
    ece_enable: bool = "NCCL_IB_ECE_ENABLE" in Qps => flag(true);
    /// Treat the virtual functions of one physical function as one PCI device.
    merge_vfs: bool = "NCCL_IB_MERGE_VFS" in Devices => flag(true);
    /// Allow NCCL to fuse NICs into one virtual device (makeVDevice).
    merge_nics: bool = "NCCL_IB_MERGE_NICS" in Devices => flag(true);
    /// Multi-subnet RoCE: the listener puts its RoCE GIDs in the handle and the connector uses
    /// the local device whose RoCE ports all share a subnet with one of them.
    subnet_aware_routing: bool = "NCCL_IB_SUBNET_AWARE_ROUTING" in Devices => flag(false);
    /// Prefix length (bits) of an IPv4 subnet for subnet-aware routing (IPv6: the /64).
    subnet_prefix_len: u32 = "NCCL_IB_SUBNET_PREFIX_LEN" in Devices => int(24, 1, 32);
    /// Work-request latency monitor: a signaled send work request slower than this (ns, post to
    /// completion) gets a WARN (the first of each QP; the rest are counted), and one with no
    /// completion past it a stall WARN; 0: neither.
    wqe_latency_threshold_ns: u64 = "NCCL_IB_WQE_LATENCY_THRESHOLD_NS" in Diagnostics => int(0, 0, i64::MAX);
    /// Measure each QP's post-to-completion latency of signaled send work requests: p50, p90,
    /// p99 and p99.9 in the statistics file and the comm's INFO summary at close.
    wqe_latency_report: bool = "NCCL_IB_WQE_LATENCY_REPORT" in Diagnostics => flag(false);
    /// Number the devices in PCI path order.
    device_pci_order: bool = "NCCL_IB_DEVICE_PCI_ORDER" in Devices => flag(true);
    /// A fatal asynchronous event of a device fails the later calls on it.
    return_async_events: bool = "NCCL_IB_RETURN_ASYNC_EVENTS" in Recovery => flag(true);
    /// INFO when the fused device lists of two peers differ.
    warn_rail_local: bool = "NCCL_IB_WARN_RAIL_LOCAL" in Diagnostics => flag(false);
    /// Retry `ibv_modify_qp` on any error, not only on ETIMEDOUT.
    mqp_retry_all: bool = "NCCL_IB_MQP_RETRY_ALL" in Qps => flag(false);
    /// Retries of `ibv_modify_qp`.
    mqp_retry_cnt: u32 = "NCCL_IB_MQP_RETRY_CNT" in Qps => int(34, 0, 1_000_000);
    /// Sleep (ms) × attempt between the retries of `ibv_modify_qp`.
    mqp_retry_sleep_ms: u64 = "NCCL_IB_MQP_RETRY_SLEEP_MSEC" in Qps => int(100, 0, 3_600_000);
    /// Use `ibv_query_port_speed` where libibverbs has it.
    query_port_speed: bool = "NCCL_IB_QUERY_PORT_SPEED" in Devices => flag(true);
    /// The libibverbs to load (default: `libibverbs.so`, then `libibverbs.so.1`).
    ibverbs_lib: Option<String> = "NCCL_IBVERBS_LIB" in Devices => text("path", "(default)").decides();
    /// Never flush GPU receives.
    gdr_flush_disable: bool = "NCCL_GDR_FLUSH_DISABLE" in Gpu => flag(false);
    /// Allow DMA-BUF registration of GPU memory.
    dmabuf_enable: bool = "NCCL_DMABUF_ENABLE" in Gpu => flag(true);
    /// The IP interfaces the connection side channel may use (chosen automatically when unset).
    socket_ifname: Option<DeviceFilter> = "NCCL_SOCKET_IFNAME" in Setup
        => lenient("interface list", LIST_SYNTAX, None, parse_interfaces, show_interfaces).decides();
    /// The address family of the side channel (any when unset).
    socket_family: Option<AddrFamily> = "NCCL_SOCKET_FAMILY" in Setup
        => strict("address family", "`AF_INET`, `AF_INET6`", None, parse_any_family, show_any_family);
    /// Handshake magic of the side channel.
    socket_magic: u64 = "NCCL_SOCKET_MAGIC" in Setup
        => strict("integer", "a signed 64-bit integer", 0x564a_b9f2_fc4b_9d6c, parse_u64_bits, show_hex);
    /// Give up connection setup after this long (s), like NCCL's socket retry budget.
    connect_timeout_sec: u64 = "FERROCE_CONNECT_TIMEOUT_SEC" in Setup => int(60, 1, 86_400);
    /// WARN when a comm with work in flight made no progress for this long (s), and again at
    /// most once per interval; 0 never.
    hang_warn_sec: u64 = "FERROCE_HANG_WARN_SEC" in Diagnostics => int(30, 0, 86_400);
    /// How long (s) a connection whose QPs failed keeps recovering over new QPs before the comm
    /// fails; 0 turns recovery off. The default outlasts a link flap or a switch reload and stays
    /// well inside PyTorch's 10-minute collective watchdog.
    recovery_timeout_sec: u64 = "FERROCE_RECOVERY_TIMEOUT_SEC" in Recovery => int(120, 0, 86_400);
    /// 0 turns recovery off (NCCL's own IB transport recovers fused NICs only).
    port_recovery: bool = "NCCL_IB_RESILIENCY_PORT_RECOVERY" in Recovery => flag(true).nccl_default("0");
    /// A fused device's recovery moves the QPs of a member whose port is down onto the members
    /// whose ports are up, and back once it is up again.
    port_failover: bool = "NCCL_IB_RESILIENCY_PORT_FAILOVER" in Recovery => flag(true);
    /// A fused device's connections put all their QPs on the first member that is up and keep
    /// one probed QP on each other member, instead of striping; both ends must set it alike.
    active_standby: bool = "FERROCE_ACTIVE_STANDBY" in Recovery => flag(false);
    /// The largest message (bytes) sent eagerly, without waiting for the receiver's CTS, into a
    /// per-connection ring of 16 slots of 32 + this many bytes rounded up to 64; 0 off. The
    /// default makes a 4 KiB ring whose slots fit one 256-byte inline write.
    eager_max: usize = "FERROCE_EAGER_MAX" in DataPath => int(224, 0, 4064);
    /// The newest wire version this process speaks (0: this build's newest); lower it to run
    /// as an older build would.
    wire_version: u16 = "FERROCE_WIRE_VERSION" in Setup => int(0, 0, 65535).special(0, "(newest)");
    /// The wait (ms) after a failed recovery attempt before the next, doubling up to 5 s; the
    /// first attempt is at once.
    recovery_start_delay_ms: u64 = "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY" in Recovery
        => int(100, 0, 5_000).unit("ms");
    /// Attempts of one recovery before the comm fails; 0 leaves the bound to
    /// FERROCE_RECOVERY_TIMEOUT_SEC, so a port being replaced is waited for.
    recovery_attempts_max: u32 = "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX" in Recovery
        => int(0, 0, 1_000_000);
    /// Directory of the per-process statistics file `ferroce-<host>-<pid>.json`; unset keeps no
    /// statistics unless NCCL_DEBUG asks for INFO.
    stats_dir: Option<String> = "FERROCE_STATS" in Diagnostics => text("directory", "(off)");
    /// Also rewrite the statistics file this often (s); 0 only at finalize and exit.
    stats_interval_sec: u64 = "FERROCE_STATS_INTERVAL_SEC" in Diagnostics => int(10, 0, 86_400);
    /// An INFO line for every call NCCL makes into the plugin, with arguments and result; of
    /// the data path calls (isend, irecv, test, iflush) only the first this many; 0 off.
    call_trace: u64 = "FERROCE_CALL_TRACE" in Diagnostics => int(0, 0, i64::MAX);
    /// NCCL's log level, read for one thing: at INFO or TRACE, comms keep statistics and log a
    /// summary when they close.
    debug_info: bool = "NCCL_DEBUG" in Diagnostics
        => strict("log level", "`INFO` and `TRACE` turn this on", false, parse_debug_info, show_debug_info);
    /// NCCL's log subsystems, read for one thing: naming ENV (or ALL) logs the whole `config:`
    /// table, a line per variable (NCCL's default mask has ENV, so only naming it counts).
    debug_subsys_env: bool = "NCCL_DEBUG_SUBSYS" in Diagnostics
        => strict("subsystem list", "`ENV` or `ALL` in the list (not after `^`) turns this on", false,
                  parse_debug_subsys, show_debug_subsys);
}

fn parse_debug_info(text: &str) -> Result<bool, String> {
    let level = text.trim();
    Ok(level.eq_ignore_ascii_case("INFO") || level.eq_ignore_ascii_case("TRACE"))
}

fn show_debug_info(info: &bool) -> String {
    if *info { "INFO" } else { "(below INFO)" }.to_string()
}

fn parse_debug_subsys(text: &str) -> Result<bool, String> {
    Ok(env_subsys_requested(Some(text)))
}

fn show_debug_subsys(env: &bool) -> String {
    if *env { "ENV" } else { "(without ENV)" }.to_string()
}

/// NCCL's IB variables that ferroce does not read (NCCL's own IB transport does), and the
/// prefix of further ones; the doctor tells them from misspellings and the docs list them.
pub const NCCL_ONLY: &[&str] = &[
    "NCCL_IB_DISABLE",
    "NCCL_IB_DATA_DIRECT",
    "NCCL_IB_OOO_RQ",
    "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
    "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
    "NCCL_IB_CUDA_SUPPORT",
    "NCCL_IB_GDR_LEVEL",
];
pub const NCCL_ONLY_PREFIX: &str = "NCCL_IB_RESILIENCY_";
