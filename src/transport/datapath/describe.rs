//! The INFO line a connection logs when its data path starts, as NCCL's IB transport does: its
//! QPs, devices, MTU, GID and route, traffic class and service level, and how messages use the
//! QPs.

use crate::transport::conn::{qps, Conn};

/// The INFO line of a new connection: peer, QPs both ends, MTU, GID, how the first QP
/// addresses its peer (LIDs on InfiniBand), tc/sl, QP use.
pub(super) fn describe_connection(c: &Conn, kind: &str) -> String {
    let local = c
        .qps
        .iter()
        .map(|q| format!("{:#x}", q.qp.qpn()))
        .collect::<Vec<_>>()
        .join(",");
    let remote = c
        .peer
        .qps
        .iter()
        .map(|q| format!("{:#x}", q.qpn))
        .collect::<Vec<_>>()
        .join(",");
    let d0 = &c.devs[0].dev;
    // The GID the connection was made with (the port's pick now, which a GID change moves).
    let (gid_index, gid) = d0.gid_now().unwrap_or((d0.gid_index, d0.gid));
    let mtu_code = c
        .peer
        .devs
        .first()
        .map_or(d0.active_mtu, |p| d0.active_mtu.min(u32::from(p.mtu)))
        .clamp(1, 5);
    let mode = if c.qps_per_req > 1 && c.qps_per_req == c.qps.len() {
        "each message split over all QPs"
    } else {
        "messages round-robin over the QPs"
    };
    let route = c
        .qps
        .first()
        .and_then(|q| c.peer.devs.get(q.remote_dev))
        .map_or_else(String::new, |r| format!(", {}", qps::describe_route(d0, r)));
    format!(
        "{kind} connection with {}: {} QP(s) on {} (local QPNs {local}; peer QPNs {remote}), MTU {}, GID index {} {}{route}, tc {} sl {}, {mode}",
        c.chan.peer(),
        c.qps.len(),
        c.devs.iter().map(|d| d.dev.label()).collect::<Vec<_>>().join("+"),
        128u32 << mtu_code,
        gid_index,
        crate::device::format_gid(&gid),
        c.peer.tc,
        c.peer.sl,
    )
}
