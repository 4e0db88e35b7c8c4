//! `docs/configuration.md`, generated from the declaration table. The checked-in file is
//! compared with `markdown()` by tests/config_table.rs (`FERROCE_BLESS=1 cargo test --release
//! --test config_table` rewrites it).

use super::table::{tunables, Group, Tunable, NCCL_ONLY, NCCL_ONLY_PREFIX};

const INTRO: &str = "\
# Configuration

<!-- Generated from src/config/table.rs by ferroce::config::doc::markdown(); do not edit.
     Regenerate: FERROCE_BLESS=1 cargo test --release --test config_table -->

ferroce reads NCCL's own `NCCL_IB_*` and `NCCL_SOCKET_*` variables, with NCCL's defaults
(where ferroce's default differs, the table gives NCCL's too), and a few `FERROCE_*` variables
of its own. Each is read once per process. A value that does not parse, or lies outside its
range, gives one WARN naming the variable, the value and what is expected, and the default is
used; a device list keeps its valid entries. Integers are read as C's `strtoll(.., 0)` reads
them: decimal, `0x` hex, a leading `0` for octal. A flag is 0 (off) or any other integer (on).

At `NCCL_DEBUG=INFO` the plugin logs one `config:` line with the variables that decide devices,
GIDs and QPs and every variable that is set; `NCCL_DEBUG_SUBSYS=ENV` (or `INIT,ENV`) adds one
`config: NAME=value (set|default)` line per variable. `ferroce-doctor` checks the values and
flags names that ferroce does not read, with the declared name they are closest to.
";

/// The whole of `docs/configuration.md`.
pub fn markdown() -> String {
    let all = tunables();
    let mut out = String::from(INTRO);
    for group in Group::ALL {
        let rows: Vec<&Tunable> = all.iter().filter(|t| t.group == group).collect();
        if rows.is_empty() {
            continue;
        }
        out.push_str(&format!("\n## {}\n\n", group.title()));
        out.push_str("| Variable | Type | Default | Accepted | Meaning |\n");
        out.push_str("|---|---|---|---|---|\n");
        for t in rows {
            out.push_str(&row(t));
        }
    }
    out.push_str(&format!(
        "\n## Read by NCCL, not by ferroce\n\n\
         NCCL's own IB transport reads these; ferroce ignores them (and `ferroce-doctor` says so): {}, \
         and the `{NCCL_ONLY_PREFIX}*` variables not in the tables above.\n",
        NCCL_ONLY
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out
}

fn row(t: &Tunable) -> String {
    let default = match t.nccl_default {
        Some(nccl) => format!("{} (NCCL: {nccl})", t.default),
        None => t.default.clone(),
    };
    format!(
        "| `{}` | {} | {} | {} | {} |\n",
        t.name,
        cell(t.ty),
        cell(&default),
        cell(&t.accepts),
        cell(&t.meaning)
    )
}

/// Text made safe for a table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}
