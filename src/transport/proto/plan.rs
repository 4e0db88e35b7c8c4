//! What the core asks the I/O layer to post: plain descriptions of work requests, turned into
//! `ibv_send_wr` / `ibv_recv_wr` by the driver (or executed by the simulated NIC in tests).

/// A local buffer piece (`ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The remote side of an RDMA operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Remote {
    pub addr: u64,
    pub rkey: u32,
}

/// The RDMA operation of a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write,
    /// RDMA WRITE WITH IMMEDIATE; the value in host order (the driver converts).
    WriteImm(u32),
    Read,
}

/// One send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    pub wr_id: u64,
    pub op: Op,
    /// `None`: no SGE (a zero-length write).
    pub local: Option<Sge>,
    pub remote: Remote,
    pub signaled: bool,
    /// Post the payload inline (the driver checks it against the QP's `max_inline_data`).
    pub inline: bool,
    /// Bytes written in front of `local`'s, from the plan itself (an eager message's header):
    /// only on an inline WR, whose bytes the NIC copies at the post.
    pub prefix: Option<[u8; super::eager::EAGER_HEADER_BYTES]>,
}

impl WorkRequest {
    pub const EMPTY: WorkRequest = WorkRequest {
        wr_id: 0,
        op: Op::Write,
        local: None,
        remote: Remote { addr: 0, rkey: 0 },
        signaled: false,
        inline: false,
        prefix: None,
    };

    /// Bytes the request moves.
    pub fn len(&self) -> usize {
        self.local.map_or(0, |s| s.len as usize) + self.prefix.map_or(0, |p| p.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One thing to post, in order. A `Send` chain is posted with one `ibv_post_send` (a long one
/// in batches), `count` receives with one `ibv_post_recv`.
#[derive(Clone, Copy, Debug)]
pub enum Post<'a> {
    /// A chain of send WRs on QP `qp` (index in the connection).
    Send { qp: usize, chain: &'a [WorkRequest] },
    /// `count` zero-SGE receives on QP `qp`, all with `wr_id`.
    Recv { qp: usize, wr_id: u64, count: usize },
    /// A GPU-flush read on the loopback QP of local member device `dev`.
    Flush { dev: usize, wr: WorkRequest },
    /// Copy `len` bytes of an eager message from our landing ring (`src`) into the receive
    /// buffer at `dst` (host memory NCCL posted): the receiver's delivery, by the CPU.
    Deliver { src: u64, dst: u64, len: usize },
}

/// Where a QP of the connection lives: its local member device and the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpRoute {
    pub dev: usize,
    pub remote_dev: usize,
}

/// Take a recovery's new routes (a fused device's QPs moved between members): as many QPs as
/// before, each on a local device below `ldevs` and a peer device below `rdevs` (the devices
/// the connection's buffers and keys cover).
pub fn reroute(routes: &mut [QpRoute], new: &[QpRoute], ldevs: usize, rdevs: usize) -> crate::error::Result<()> {
    let fits = new.len() == routes.len() && new.iter().all(|r| r.dev < ldevs && r.remote_dev < rdevs);
    if !fits {
        return Err(crate::error::Error::internal(format!(
            "recovery: new routes {new:?} do not fit the connection's {} QPs over {ldevs} local and {rdevs} peer devices",
            routes.len()
        )));
    }
    routes.copy_from_slice(new);
    Ok(())
}

/// A registered block of this side (the sender's FIFO, the receiver's CTS staging): its
/// address and its lkey on every member device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LocalBlock {
    pub addr: u64,
    pub lkeys: [u32; super::limits::MAX_DEVS],
}

/// The peer's remote-writable block (its FIFO, or its completion records): address and rkey
/// per peer member device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteBlock {
    pub addr: u64,
    pub rkeys: [u32; super::limits::MAX_DEVS],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(dev: usize, remote_dev: usize) -> QpRoute {
        QpRoute { dev, remote_dev }
    }

    #[test]
    fn reroute_takes_routes_within_the_connections_devices_only() {
        let mut routes = vec![r(0, 0), r(1, 1)];
        reroute(&mut routes, &[r(0, 0), r(0, 1)], 2, 2).expect("fits");
        assert_eq!(routes, vec![r(0, 0), r(0, 1)]);
        for bad in [vec![r(0, 0)], vec![r(2, 0), r(0, 0)], vec![r(0, 0), r(0, 2)]] {
            assert!(reroute(&mut routes, &bad, 2, 2).is_err(), "{bad:?}");
            assert_eq!(routes, vec![r(0, 0), r(0, 1)], "a refused reroute changes nothing");
        }
    }
}
