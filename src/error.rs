//! The plugin's error type and the one place where errors become `ncclResult_t`.
//!
//! Every fallible internal function returns [`Error`]; the FFI layer turns it into a
//! result code with [`Error::result_code`] and logs its message once through NCCL's logger.

use std::fmt;

/// `ncclResult_t` values (spec §1.1). Never renumbered.
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

    /// A failed OS or verbs call: `what` failed with the current `errno`.
    pub fn last_os(what: &str) -> Self {
        let err = std::io::Error::last_os_error();
        Self::system(format!("{what} failed: {err}"))
    }

    /// The single mapping from error kinds to `ncclResult_t` (spec §1.1, §11 rule 11).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_its_nccl_code() {
        assert_eq!(Error::system("x").result_code(), 2);
        assert_eq!(Error::internal("x").result_code(), 3);
        assert_eq!(Error::invalid_argument("x").result_code(), 4);
        assert_eq!(Error::usage("x").result_code(), 5);
        assert_eq!(Error::remote("x").result_code(), 6);
    }

    #[test]
    fn context_keeps_kind_and_prefixes_message() {
        let e = Error::remote("peer closed").context("isend");
        assert_eq!(e.kind, ErrorKind::Remote);
        assert_eq!(e.message, "isend: peer closed");
    }
}
