//! The P_Key a port's QPs use: `NCCL_IB_PKEY_VALUE` looked up in the port's P_Key table, else
//! the entry at `NCCL_IB_PKEY` (docs/nccl-net-abi.md#qp-attributes).

/// The P_Key a port's QPs use and its index, from a port's P_Key table of `table_len` entries
/// whose entry at `i` is `pkey(i)`: the entry `NCCL_IB_PKEY_VALUE` (`value`) names when set
/// ([`pkey_value_index`]), else the one at `NCCL_IB_PKEY` (`index`, [`pkey_index_check`]); or
/// why the port cannot use it.
pub fn port_pkey(
    index: u16,
    value: Option<u16>,
    table_len: u16,
    pkey: &dyn Fn(u16) -> std::result::Result<u16, String>,
) -> std::result::Result<(u16, u16), String> {
    match value {
        Some(v) => pkey_value_index(v, table_len, pkey),
        None => pkey_index_check(index, table_len, pkey).map(|key| (index, key)),
    }
}

/// Bits of a P_Key naming the partition; the top bit is the membership (full or limited).
const PKEY_PARTITION: u16 = 0x7fff;

/// `NCCL_IB_PKEY_VALUE` (`value`) looked up in a port's P_Key table: the index of the entry
/// equal to it, else of the first entry of the same partition (the low 15 bits; the membership
/// bit may differ), with that entry; or why the port cannot use it (no such entry: the line
/// lists the filled entries, a real port's table having mostly empty ones; an unreadable
/// entry). Empty entries (0x0000) never match.
pub fn pkey_value_index(
    value: u16,
    table_len: u16,
    pkey: &dyn Fn(u16) -> std::result::Result<u16, String>,
) -> std::result::Result<(u16, u16), String> {
    let var = crate::config::var::pkey_value;
    let mut table = Vec::with_capacity(usize::from(table_len));
    for i in 0..table_len {
        table.push(pkey(i)?);
    }
    let exact = table.iter().position(|&k| k == value);
    let same_partition = || {
        table
            .iter()
            .position(|&k| k != 0 && k & PKEY_PARTITION == value & PKEY_PARTITION)
    };
    match exact.filter(|_| value != 0).or_else(same_partition) {
        Some(i) => Ok((i as u16, table[i])),
        None => Err(format!(
            "{var}={value:#06x} is not in the port's P_Key table (its filled entries: {}) — ask the subnet manager for the partition, or choose a P_Key `ferroce-doctor` lists",
            table
                .iter()
                .filter(|&&k| k != 0)
                .map(|k| format!("{k:#06x}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// `NCCL_IB_PKEY` (`index`) against a port's P_Key table of `table_len` entries, whose entry at
/// `index` is `pkey(index)`: the P_Key the QPs will use, or why the port cannot use it (an index
/// past the table, an empty entry, an unreadable one).
pub fn pkey_index_check(
    index: u16,
    table_len: u16,
    pkey: &dyn Fn(u16) -> std::result::Result<u16, String>,
) -> std::result::Result<u16, String> {
    let var = crate::config::var::pkey_index;
    if index >= table_len {
        return Err(format!(
            "{var}={index} is outside the port's P_Key table ({table_len} entr{}, indices 0 to {}) — choose an index `ferroce-doctor` lists, or unset {var}",
            if table_len == 1 { "y" } else { "ies" },
            table_len.saturating_sub(1)
        ));
    }
    match pkey(index)? {
        0 => Err(format!(
            "{var}={index} names an empty P_Key table entry (0x0000) — ask the subnet manager for the partition, or choose another index"
        )),
        key => Ok(key),
    }
}
