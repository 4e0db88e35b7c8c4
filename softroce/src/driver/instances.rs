//! The process-wide device instances: created (socket bound following the
//! address rules, engine thread started) on first use, never destroyed.

use std::sync::{Arc, Mutex};

use super::addr::{bind_for, guid_for, ifindex_of, link_mtu_of, mtu_enum_for_link};
use super::device::Device;
use super::engine;
use crate::config;

static INSTANCES: Mutex<Vec<Option<Arc<Device>>>> = Mutex::new(Vec::new());

/// The process-wide instance of device `index`, created on first use.
pub fn instance(index: usize) -> std::io::Result<Arc<Device>> {
    let mut v = INSTANCES.lock().unwrap();
    if v.len() <= index {
        v.resize(index + 1, None);
    }
    if let Some(d) = &v[index] {
        return Ok(d.clone());
    }
    // Never bind or run with settings other than those asked for (see `config`).
    config::check().map_err(|bad| std::io::Error::new(std::io::ErrorKind::InvalidInput, bad.line()))?;
    let (addr, sock) = bind_for(index)?;
    let link_mtu = link_mtu_of(addr);
    let active_mtu = config::mtu_override().unwrap_or_else(|| mtu_enum_for_link(link_mtu));
    let dev = Arc::new(Device::new(
        index,
        sock,
        link_mtu,
        active_mtu,
        ifindex_of(addr),
        guid_for(addr),
    ));
    engine::start(dev.clone())?;
    super::ctl::start(&dev);
    v[index] = Some(dev.clone());
    Ok(dev)
}
