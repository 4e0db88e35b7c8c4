//! The per-process device instance, shared by every context opened on the
//! device: its address, GIDs and MTU, its socket, its MR table, the
//! allocators of keys, handles and QP numbers, and its engine's state.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rdma_sys::ibv_event_type;

use super::addr::ipv4_mapped_gid;
use super::engine_state::Engine;
use super::event::AsyncQueue;
use super::link::{lid_for, LinkConfig, LinkDrops, LinkLayer};
use super::mem::MrTable;
use super::udp::UdpSocket;

/// `ibv_gid_entry.gid_type` values (enum ibv_gid_type).
pub const GID_TYPE_IB: u32 = 0;
pub const GID_TYPE_ROCE_V1: u32 = 1;
pub const GID_TYPE_ROCE_V2: u32 = 2;
/// `ibv_query_gid_type()` values (enum ibv_gid_type_sysfs of rdma-core's driver.h).
pub const GID_TYPE_SYSFS_ROCE_V1: u32 = 0;
pub const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// Per-process device instance, shared by every context opened on the device.
pub struct Device {
    pub index: usize,
    pub name: String,
    pub addr: Ipv4Addr,
    /// Link MTU of the interface the address lives on.
    pub link_mtu: u32,
    /// Active MTU as an `ibv_mtu` enum value (1 = 256 ... 5 = 4096).
    pub active_mtu: u32,
    /// Index of the network interface holding `addr` (`ibv_gid_entry.ndev_ifindex`).
    pub ifindex: u32,
    pub guid: u64,
    /// The port's link layer (docs/softroce-internals.md#infiniband-link-layer).
    pub link: LinkLayer,
    /// An IB port's LID from the subnet-manager stand-in; 0 on RoCE and on an IB port without
    /// a subnet manager (`SOFTROCE_SM=off`) or whose address maps to no LID.
    pub lid: u16,
    /// A subnet manager runs (IB).
    pub sm: bool,
    /// A router serves the subnet (IB, `SOFTROCE_IB_ROUTER`): GID 1 is the routable FLID GID.
    pub router: bool,
    /// Received packets the link layer dropped, by reason.
    pub link_drops: LinkDrops,
    pub sock: UdpSocket,
    pub mrs: MrTable,
    next_key: AtomicU32,
    next_handle: AtomicU32,
    next_qpn: AtomicU32,
    pub engine: Engine,
    /// The asynchronous-event queues of the contexts opened on this device (port events go
    /// to every one, as the kernel sends them to every open context).
    async_queues: Mutex<Vec<Weak<AsyncQueue>>>,
}

impl Device {
    /// A device bound to `sock` (whose address is `sock.local`).
    pub fn new(
        index: usize,
        sock: UdpSocket,
        link_mtu: u32,
        active_mtu: u32,
        ifindex: u32,
        guid: u64,
        link: LinkConfig,
    ) -> Device {
        let ib = link.layer == LinkLayer::Infiniband;
        Device {
            link: link.layer,
            lid: if ib && link.sm {
                lid_for(sock.local).unwrap_or(0)
            } else {
                0
            },
            sm: ib && link.sm,
            router: ib && link.router,
            link_drops: LinkDrops::default(),
            index,
            name: format!("softroce{index}"),
            addr: sock.local,
            link_mtu,
            active_mtu,
            ifindex,
            guid,
            sock,
            mrs: MrTable::default(),
            next_key: AtomicU32::new(0x0000_1201 + ((std::process::id() & 0xff) << 8)),
            next_handle: AtomicU32::new(1),
            next_qpn: AtomicU32::new(0x11),
            engine: Engine::new(),
            async_queues: Mutex::new(Vec::new()),
        }
    }

    /// A context opened on this device: it gets the port's events from now on.
    pub fn watch_events(&self, q: &Arc<AsyncQueue>) {
        if let Ok(mut v) = self.async_queues.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(q));
        }
    }

    /// An unaffiliated event (`element`: the port number, or 0) to every open context, as the
    /// kernel sends port and device events to every context.
    pub fn device_event(&self, ev: ibv_event_type, element: usize) {
        let queues: Vec<Arc<AsyncQueue>> = match self.async_queues.lock() {
            Ok(v) => v.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => return,
        };
        for q in queues {
            q.push(ev, element);
        }
    }

    /// An InfiniBand port with a LID (its subnet manager made it ACTIVE).
    pub fn ib_active(&self) -> bool {
        self.link == LinkLayer::Infiniband && self.lid != 0
    }

    /// One line for `softroce-ctl status`: the link layer, an IB port's LIDs, the link's drops.
    pub fn describe_link(&self) -> String {
        match self.link {
            LinkLayer::Ethernet => format!("link layer Ethernet, {}", self.link_drops.describe()),
            LinkLayer::Infiniband => format!(
                "link layer InfiniBand, LID {:#x}, SM LID {:#x}, {}",
                self.lid,
                if self.sm { super::link::SM_LID } else { 0 },
                self.link_drops.describe()
            ),
        }
    }

    /// The GID at `index`, or None for an empty slot. An IB port has GID 0: the default subnet
    /// prefix fe80::/64 with the port GUID (which is the node GUID); with a router, GID 1: the
    /// prefix fec0:0:FLID:0 (the FLID, here the port's LID, in bytes 4 and 5; the subnet bits,
    /// bytes 6 and 7, as GID 0's) with the GUID, as NCCL's `NCCL_IB_ROUTABLE_FLID_GID_INDEX` finds.
    pub fn gid(&self, index: usize) -> Option<[u8; 16]> {
        if self.link == LinkLayer::Infiniband && index == 1 && self.router && self.lid != 0 {
            let mut g = [0u8; 16];
            g[..2].copy_from_slice(&[0xfe, 0xc0]);
            g[4..6].copy_from_slice(&self.lid.to_be_bytes());
            g[8..].copy_from_slice(&self.guid.to_be_bytes());
            return Some(g);
        }
        if self.link == LinkLayer::Infiniband && index != 0 {
            return None;
        }
        match self.unholed(index)? {
            0 | 1 => {
                let mut g = [0u8; 16];
                g[0] = 0xfe;
                g[1] = 0x80;
                g[8..].copy_from_slice(&self.guid.to_be_bytes());
                Some(g)
            }
            i @ 2..=5 if self.sock.faults.ipv4_gid_slot().is_some_and(|s| i == s || i == s + 1) => {
                Some(ipv4_mapped_gid(self.addr))
            }
            _ => None,
        }
    }

    /// A RoCE table index less the empty entries at its head (`SOFTROCE_GID_HOLES`); None for
    /// one of them. An IB port has no holes.
    fn unholed(&self, index: usize) -> Option<usize> {
        match self.link {
            LinkLayer::Ethernet => index.checked_sub(crate::config::gid_holes()),
            LinkLayer::Infiniband => Some(index),
        }
    }

    /// GID type for `ibv_gid_entry` (0 = IB, 1 = RoCE v1, 2 = RoCE v2).
    pub fn gid_type(&self, index: usize) -> Option<u32> {
        if self.link == LinkLayer::Infiniband {
            return self.gid(index).map(|_| GID_TYPE_IB);
        }
        match self.unholed(index)? {
            0 | 2 | 4 => Some(GID_TYPE_ROCE_V1),
            1 | 3 | 5 => Some(GID_TYPE_ROCE_V2),
            _ => None,
        }
    }

    pub fn alloc_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh lkey/rkey: an index in the upper 24 bits and a generation byte.
    pub fn alloc_key(&self) -> u32 {
        loop {
            let k = self.next_key.fetch_add(0x101, Ordering::Relaxed);
            if k != 0 && !self.mrs.read().contains_key(&k) {
                return k;
            }
        }
    }

    /// A fresh 24-bit QP number (0 and 1 are reserved for QP0/QP1).
    pub fn alloc_qpn(&self) -> u32 {
        loop {
            let q = self.next_qpn.fetch_add(1, Ordering::Relaxed) & crate::wire::MASK_24;
            if q >= 2 && !self.engine.has_qp(q) {
                return q;
            }
        }
    }

    pub fn gid_index_of(&self, gid: &[u8; 16]) -> Option<usize> {
        (0..super::limits::GID_TABLE_LEN).find(|&i| self.gid(i).as_ref() == Some(gid))
    }

    /// A PD is still used by an MR or a QP (`ibv_dealloc_pd` fails with EBUSY).
    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.mrs.pd_in_use(pd) || self.engine.pd_in_use(pd)
    }
}
