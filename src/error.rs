//! The plugin's error type and the one place where errors become `ncclResult_t`.
//!
//! Every fallible internal function returns [`Error`]; the FFI layer turns it into a
//! result code with [`Error::result_code`] and logs its message once through NCCL's logger.

use std::fmt;

/// `ncclResult_t` values (docs/nccl-net-abi.md#result-codes). Never renumbered.
pub mod code {
    pub const SUCCESS: i32 = 0;
    pub const UNHANDLED_CUDA_ERROR: i32 = 1;
    pub const SYSTEM_ERROR: i32 = 2;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE_ERROR: i32 = 6;
}

/// What went wrong, from NCCL's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// An OS or verbs call failed, or the local NIC/network failed.
    System,
    /// NCCL misused the plugin (bad arguments, too many requests) or an internal bug.
    Internal,
    /// A bad argument that NCCL passed through from the user.
    InvalidArgument,
    /// User or configuration error (bad environment, impossible device merge).
    InvalidUsage,
    /// The remote peer failed or went away.
    Remote,
}

/// An error with a message that tells the user what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    /// The detailed WARN was already emitted where the error arose (e.g. a completion error
    /// with its hints); the FFI layer then does not log it again.
    pub logged: bool,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            logged: false,
        }
    }
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::System, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidUsage, message)
    }
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Remote, message)
    }

    /// A failed OS or verbs call: `what` failed with the current `errno`, plus the resource-limit
    /// hint when the errno says a limit was hit, or the bad-address hint.
    pub fn last_os(what: &str) -> Self {
        Self::os(what, &std::io::Error::last_os_error())
    }

    /// `what` failed with `err`, with the hints of [`Error::last_os`].
    pub fn os(what: &str, err: &std::io::Error) -> Self {
        Self::system(format!(
            "{what} failed: {err}{}{}",
            limit_suffix(err),
            fault_suffix(err)
        ))
    }

    /// Appends `suffix` (a hint) to the message.
    pub fn suffixed(mut self, suffix: &str) -> Self {
        self.message.push_str(suffix);
        self
    }

    /// The single mapping from error kinds to `ncclResult_t` (docs/nccl-net-abi.md#result-codes,
    /// #rules-ferroce-keeps).
    pub fn result_code(&self) -> i32 {
        match self.kind {
            ErrorKind::System => code::SYSTEM_ERROR,
            ErrorKind::Internal => code::INTERNAL_ERROR,
            ErrorKind::InvalidArgument => code::INVALID_ARGUMENT,
            ErrorKind::InvalidUsage => code::INVALID_USAGE,
            ErrorKind::Remote => code::REMOTE_ERROR,
        }
    }

    /// Marks the error as already reported through the logger.
    pub fn mark_logged(mut self) -> Self {
        self.logged = true;
        self
    }

    /// Prefixes the message with context, keeping the kind.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// A process resource limit: soft and hard values, `None` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

impl Limit {
    /// `getrlimit(resource)`.
    pub fn current(resource: libc::__rlimit_resource_t) -> Option<Limit> {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid out-pointer for the duration of the call.
        if unsafe { libc::getrlimit(resource, &mut rl) } != 0 {
            return None;
        }
        let value = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
        Some(Limit {
            soft: value(rl.rlim_cur),
            hard: value(rl.rlim_max),
        })
    }
}

/// Bytes as `64 KiB`, `8 MiB`, `unlimited`.
pub fn format_bytes(bytes: Option<u64>) -> String {
    match bytes {
        None => "unlimited".into(),
        Some(b) if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        Some(b) if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        Some(b) if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        Some(b) => format!("{b} bytes"),
    }
}

/// Ferroce's file descriptors per connection, at most: a comm within this process keeps a
/// socket at each end, and one with a peer process of wire version 5 or older a socket per
/// comm. Between processes of wire version 6 the comms with one peer process share one
/// side-channel link and the listen comms of a process one listener, so there it is per peer
/// process, not per connection; but a process cannot know its peers' versions before they
/// connect, so this bounds the peak.
pub const FDS_PER_CONNECTION: u64 = 2;

/// What to tell the user when a call fails with `errno` because of a resource limit, with the
/// current limit read now: locked memory for registrations, CQs and QPs (ENOMEM, EPERM), file
/// descriptors for the side channel (EMFILE, ENFILE). `None` for other errors.
pub fn limit_hint(errno: i32) -> Option<String> {
    match errno {
        libc::ENOMEM | libc::EPERM => Some(memlock_hint(Limit::current(libc::RLIMIT_MEMLOCK))),
        libc::EMFILE => Some(nofile_hint(Limit::current(libc::RLIMIT_NOFILE), open_fds())),
        libc::ENFILE => Some(
            "the system-wide open-file table is full (fs.file-max); raise it with `sysctl fs.file-max=…` or close other programs".into(),
        ),
        _ => None,
    }
}

fn memlock_hint(limit: Option<Limit>) -> String {
    let now = limit.map_or("unknown".into(), |l| {
        format!("{} (hard {})", format_bytes(l.soft), format_bytes(l.hard))
    });
    format!(
        "RDMA registrations, CQs and QPs pin memory, which counts against RLIMIT_MEMLOCK, now {now}. \
         Raise it: `ulimit -l unlimited` in the job's shell, `* - memlock unlimited` in \
         /etc/security/limits.conf (LimitMEMLOCK=infinity for a systemd service), \
         `--ulimit memlock=-1:-1` for a container; `ferroce-doctor --conns N` checks it"
    )
}

fn nofile_hint(limit: Option<Limit>, open: Option<u64>) -> String {
    let now = limit.map_or("unknown".into(), |l| {
        let show = |v: Option<u64>| v.map_or("unlimited".into(), |v| v.to_string());
        format!("{} (hard {})", show(l.soft), show(l.hard))
    });
    let open = open.map_or(String::new(), |n| format!(", {n} open"));
    format!(
        "out of file descriptors: RLIMIT_NOFILE is {now}{open}. ferroce needs {FDS_PER_CONNECTION} per \
         connection at most (with peers of an older ferroce, or within one process; between processes of \
         this version one per peer process, and one listener), so a job of N connections per process \
         needs at most about {FDS_PER_CONNECTION}×N + 64. Raise it: `ulimit -n 65536`, `* - nofile 65536` in \
         /etc/security/limits.conf (LimitNOFILE= for a systemd service), `--ulimit nofile=65536:65536` \
         for a container; `ferroce-doctor --conns N` checks it"
    )
}

/// `" — <hint>"` when `err` is a resource-limit error ([`limit_hint`]), else empty: appended to
/// the message wherever such an error is reported.
pub fn limit_suffix(err: &std::io::Error) -> String {
    err.raw_os_error()
        .and_then(limit_hint)
        .map(|h| format!(" — {h}"))
        .unwrap_or_default()
}

/// `" — <hint>"` when `err` is EFAULT, which a registration gets for memory the NIC cannot pin:
/// most often a GPU buffer on a NIC without a GPU path. Else empty.
pub fn fault_suffix(err: &std::io::Error) -> String {
    if err.raw_os_error() != Some(libc::EFAULT) {
        return String::new();
    }
    " — the memory is not mapped in this process with the access the NIC needs. For a GPU buffer: \
     the NIC reaches GPU memory only through nvidia_peermem or DMA-BUF (see the INFO line \
     'GPUDirect peer memory' and ferroce-doctor's 'gpudirect' check; softroce never can), so leave \
     NCCL_NET_GDR_LEVEL unset or set it to LOC to keep GPU buffers off this NIC"
        .into()
}

/// `" — <hint>"` when a DMA-BUF registration failed with EOPNOTSUPP: the NIC's driver cannot
/// import that buffer (for NCCL, always a GPU's). Else empty.
pub fn dmabuf_suffix(err: &std::io::Error) -> String {
    if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return String::new();
    }
    " — the NIC's driver cannot import this DMA-BUF. For a GPU buffer, DMA-BUF needs the GPU \
     driver's export (NVIDIA's open kernel modules, CUDA 11.7 or later, Linux 5.12 or later) and \
     a NIC driver that imports it (ferroce-doctor's 'gpudirect' check says which is missing; \
     softroce never can). NCCL_DMABUF_ENABLE=0 makes NCCL register GPU buffers through \
     nvidia_peermem instead; NCCL_NET_GDR_LEVEL=LOC keeps them off this NIC"
        .into()
}

/// File descriptors open in this process.
fn open_fds() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_address_says_what_to_check() {
        let fault = fault_suffix(&std::io::Error::from_raw_os_error(libc::EFAULT));
        assert!(
            fault.contains("nvidia_peermem") && fault.contains("NCCL_NET_GDR_LEVEL"),
            "{fault}"
        );
        assert_eq!(fault_suffix(&std::io::Error::from_raw_os_error(libc::ENOMEM)), "");
        let dmabuf = dmabuf_suffix(&std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        assert!(
            dmabuf.contains("NCCL_DMABUF_ENABLE=0") && dmabuf.contains("gpudirect"),
            "{dmabuf}"
        );
        assert_eq!(dmabuf_suffix(&std::io::Error::from_raw_os_error(libc::EINVAL)), "");
    }

    #[test]
    fn every_kind_maps_to_its_nccl_code() {
        assert_eq!(Error::system("x").result_code(), 2);
        assert_eq!(Error::internal("x").result_code(), 3);
        assert_eq!(Error::invalid_argument("x").result_code(), 4);
        assert_eq!(Error::usage("x").result_code(), 5);
        assert_eq!(Error::remote("x").result_code(), 6);
    }

    #[test]
    fn limit_errors_carry_the_limit_and_the_fix() {
        let memlock = memlock_hint(Some(Limit {
            soft: Some(64 << 10),
            hard: Some(8 << 20),
        }));
        assert!(memlock.contains("RLIMIT_MEMLOCK, now 64 KiB (hard 8 MiB)"), "{memlock}");
        assert!(memlock.contains("ulimit -l unlimited") && memlock.contains("limits.conf"));
        assert!(memlock.contains("--ulimit memlock"));

        let nofile = nofile_hint(
            Some(Limit {
                soft: Some(512),
                hard: None,
            }),
            Some(510),
        );
        assert!(
            nofile.contains("RLIMIT_NOFILE is 512 (hard unlimited), 510 open"),
            "{nofile}"
        );
        assert!(nofile.contains("needs 2 per connection") && nofile.contains("ulimit -n"));

        for errno in [libc::ENOMEM, libc::EPERM, libc::EMFILE, libc::ENFILE] {
            assert!(limit_hint(errno).is_some(), "{errno}");
        }
        assert_eq!(limit_hint(libc::EINVAL), None);
        let enomem = limit_suffix(&std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(
            enomem.starts_with(" — ") && enomem.contains("RLIMIT_MEMLOCK"),
            "{enomem}"
        );
        assert_eq!(limit_suffix(&std::io::Error::from_raw_os_error(libc::EINVAL)), "");
        // SAFETY: setting errno for the calling thread.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        let e = Error::last_os("ibv_reg_mr(mlx5_0, 0x1000, 4096 bytes)");
        assert!(e
            .message
            .starts_with("ibv_reg_mr(mlx5_0, 0x1000, 4096 bytes) failed: Cannot allocate memory"));
        assert!(e.message.contains("RLIMIT_MEMLOCK"), "{}", e.message);
    }

    #[test]
    fn byte_counts() {
        assert_eq!(format_bytes(None), "unlimited");
        assert_eq!(format_bytes(Some(8 << 20)), "8 MiB");
        assert_eq!(format_bytes(Some(64 << 10)), "64 KiB");
        assert_eq!(format_bytes(Some(3 << 30)), "3 GiB");
        assert_eq!(format_bytes(Some(1000)), "1000 bytes");
    }

    #[test]
    fn context_keeps_kind_and_prefixes_message() {
        let e = Error::remote("peer closed").context("isend");
        assert_eq!(e.kind, ErrorKind::Remote);
        assert_eq!(e.message, "isend: peer closed");
    }
}
