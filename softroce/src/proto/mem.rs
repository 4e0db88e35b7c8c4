//! Memory access seam between the protocol core and the verbs layer.
//!
//! The core never touches raw pointers: the verbs layer owns memory regions
//! and implements [`MemoryAccess`] (scoped to the QP's protection domain).
//! [`InMemory`] is a safe implementation backed by `Vec<u8>`s for tests and
//! simulations.

/// Access flags, numerically equal to `enum ibv_access_flags`.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
}

/// Why a local (lkey) access failed. Maps to `IBV_WC_LOC_PROT_ERR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalAccessError {
    /// No MR with this lkey in the QP's PD.
    InvalidKey,
    /// `[addr, addr+len)` is not inside the MR.
    OutOfBounds,
    /// The MR lacks `IBV_ACCESS_LOCAL_WRITE` for a write.
    Permission,
}

/// Why a remote (rkey) access failed. Maps to a NAK "remote access error".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccessError {
    /// No MR with this rkey in the QP's PD.
    InvalidKey,
    /// `[va, va+len)` is not inside the MR.
    OutOfBounds,
    /// The MR lacks the REMOTE_WRITE/READ/ATOMIC permission.
    Permission,
    /// Atomic target not 8-byte aligned (NAK invalid request on the wire).
    Misaligned,
}

/// The kind of remote access to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccess {
    Write,
    Read,
    Atomic,
}

/// An atomic operation on a remote, 8-byte aligned, host-order u64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// `if *va == compare { *va = swap }`; returns the original value.
    CompareSwap { compare: u64, swap: u64 },
    /// `*va = (*va).wrapping_add(add)`; returns the original value.
    FetchAdd { add: u64 },
}

impl AtomicOp {
    /// Apply to `orig`, returning the new value.
    pub fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        }
    }
}

/// Memory of one protection domain, as seen by one QP.
///
/// Every method checks the key, bounds and permission first and touches no
/// memory when the check fails. Zero-length accesses with any key succeed
/// for `local_*` (IBA: a zero-length SGE is not checked) and `remote_*`.
pub trait MemoryAccess {
    /// Check that `[addr, addr+len)` lies in the MR `lkey` (and, if `write`,
    /// that the MR has LOCAL_WRITE).
    fn local_check(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<(), LocalAccessError>;
    /// Read local memory (gather for SEND/WRITE payloads). On `Ok` every
    /// byte of `buf` must have been written (the core reuses buffers
    /// without clearing them).
    fn local_read(&self, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), LocalAccessError>;
    /// Write local memory (scatter of received SENDs, READ responses, atomic results).
    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), LocalAccessError>;
    /// Check that `[va, va+len)` lies in the MR `rkey` with permission `what`.
    fn remote_check(&self, rkey: u32, va: u64, len: u64, what: RemoteAccess) -> Result<(), RemoteAccessError>;
    /// Execute an incoming RDMA WRITE segment.
    fn remote_write(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), RemoteAccessError>;
    /// Serve an RDMA READ response segment. On `Ok` every byte of `buf`
    /// must have been written.
    fn remote_read(&self, rkey: u32, va: u64, buf: &mut [u8]) -> Result<(), RemoteAccessError>;
    /// Execute an atomic on the host-order u64 at `va` (must be 8-byte
    /// aligned); returns the original value.
    fn remote_atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError>;
    /// Shared receive queue hook (see above).
    fn take_srq_recv(&mut self) -> Option<super::RecvWr> {
        None
    }
}

/// One registered region of [`InMemory`].
#[derive(Debug, Clone)]
pub struct Region {
    pub addr: u64,
    pub data: Vec<u8>,
    pub lkey: u32,
    pub rkey: u32,
    pub access: u32,
}

/// A safe, `Vec`-backed [`MemoryAccess`] for tests and simulations.
#[derive(Debug, Clone, Default)]
pub struct InMemory {
    pub regions: Vec<Region>,
    /// The SRQ served by [`MemoryAccess::take_srq_recv`].
    pub srq: std::collections::VecDeque<super::RecvWr>,
    next_key: u32,
}

impl InMemory {
    pub fn new() -> Self {
        InMemory {
            regions: Vec::new(),
            srq: Default::default(),
            next_key: 0x100,
        }
    }

    /// Register `len` zeroed bytes at virtual address `addr`; returns `(lkey, rkey)`.
    pub fn register(&mut self, addr: u64, len: usize, access: u32) -> (u32, u32) {
        let lkey = self.next_key;
        let rkey = self.next_key + 1;
        self.next_key += 0x100;
        self.regions.push(Region {
            addr,
            data: vec![0; len],
            lkey,
            rkey,
            access,
        });
        (lkey, rkey)
    }

    fn find(&self, key: u32, local: bool) -> Option<usize> {
        self.regions
            .iter()
            .position(|r| if local { r.lkey == key } else { r.rkey == key })
    }

    fn range(r: &Region, addr: u64, len: u64) -> Option<core::ops::Range<usize>> {
        let start = addr.checked_sub(r.addr)?;
        let end = start.checked_add(len)?;
        if end > r.data.len() as u64 {
            return None;
        }
        Some(start as usize..end as usize)
    }

    /// Test helper: bytes at `[addr, addr+len)` of whichever region holds them.
    pub fn peek(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.regions
            .iter()
            .find_map(|r| Self::range(r, addr, len as u64).map(|rg| &r.data[rg]))
    }

    /// Test helper: overwrite bytes at `addr` of whichever region holds them.
    pub fn poke(&mut self, addr: u64, data: &[u8]) -> bool {
        for r in self.regions.iter_mut() {
            if let Some(rg) = Self::range(r, addr, data.len() as u64) {
                r.data[rg].copy_from_slice(data);
                return true;
            }
        }
        false
    }

    fn local_range(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(usize, core::ops::Range<usize>), LocalAccessError> {
        let i = self.find(lkey, true).ok_or(LocalAccessError::InvalidKey)?;
        let r = &self.regions[i];
        if write && r.access & access::LOCAL_WRITE == 0 {
            return Err(LocalAccessError::Permission);
        }
        let rg = Self::range(r, addr, len).ok_or(LocalAccessError::OutOfBounds)?;
        Ok((i, rg))
    }

    fn remote_range(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        what: RemoteAccess,
    ) -> Result<(usize, core::ops::Range<usize>), RemoteAccessError> {
        let i = self.find(rkey, false).ok_or(RemoteAccessError::InvalidKey)?;
        let r = &self.regions[i];
        let need = match what {
            RemoteAccess::Write => access::REMOTE_WRITE,
            RemoteAccess::Read => access::REMOTE_READ,
            RemoteAccess::Atomic => access::REMOTE_ATOMIC,
        };
        if r.access & need == 0 {
            return Err(RemoteAccessError::Permission);
        }
        let rg = Self::range(r, va, len).ok_or(RemoteAccessError::OutOfBounds)?;
        Ok((i, rg))
    }
}

impl MemoryAccess for InMemory {
    fn local_check(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<(), LocalAccessError> {
        if len == 0 {
            return Ok(());
        }
        self.local_range(lkey, addr, len, write).map(|_| ())
    }
    fn local_read(&self, lkey: u32, addr: u64, buf: &mut [u8]) -> Result<(), LocalAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        let (i, rg) = self.local_range(lkey, addr, buf.len() as u64, false)?;
        buf.copy_from_slice(&self.regions[i].data[rg]);
        Ok(())
    }
    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), LocalAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        let (i, rg) = self.local_range(lkey, addr, data.len() as u64, true)?;
        self.regions[i].data[rg].copy_from_slice(data);
        Ok(())
    }
    fn remote_check(&self, rkey: u32, va: u64, len: u64, what: RemoteAccess) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        if what == RemoteAccess::Atomic && !va.is_multiple_of(8) {
            return Err(RemoteAccessError::Misaligned);
        }
        self.remote_range(rkey, va, len, what).map(|_| ())
    }
    fn remote_write(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), RemoteAccessError> {
        if data.is_empty() {
            return Ok(());
        }
        let (i, rg) = self.remote_range(rkey, va, data.len() as u64, RemoteAccess::Write)?;
        self.regions[i].data[rg].copy_from_slice(data);
        Ok(())
    }
    fn remote_read(&self, rkey: u32, va: u64, buf: &mut [u8]) -> Result<(), RemoteAccessError> {
        if buf.is_empty() {
            return Ok(());
        }
        let (i, rg) = self.remote_range(rkey, va, buf.len() as u64, RemoteAccess::Read)?;
        buf.copy_from_slice(&self.regions[i].data[rg]);
        Ok(())
    }
    fn remote_atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        if !va.is_multiple_of(8) {
            return Err(RemoteAccessError::Misaligned);
        }
        let (i, rg) = self.remote_range(rkey, va, 8, RemoteAccess::Atomic)?;
        let word = &mut self.regions[i].data[rg];
        let mut b = [0u8; 8];
        b.copy_from_slice(word);
        let orig = u64::from_ne_bytes(b);
        word.copy_from_slice(&op.apply(orig).to_ne_bytes());
        Ok(orig)
    }
    fn take_srq_recv(&mut self) -> Option<super::RecvWr> {
        self.srq.pop_front()
    }
}
