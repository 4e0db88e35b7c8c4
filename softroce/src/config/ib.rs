//! The kinds of softroce's InfiniBand variables: `SOFTROCE_LINK_LAYER` (one link layer, or one
//! per device) and `SOFTROCE_PKEYS` (a P_Key table).

use super::Kind;
use crate::proto::limits::MAX_PKEYS;

/// P_Keys, comma-separated (`0x` hex or decimal), 1 to [`MAX_PKEYS`] of them, none 0 (an empty
/// entry).
pub struct Pkeys;

impl Kind for Pkeys {
    type Value = Vec<u16>;
    fn type_name(&self) -> &'static str {
        "P_Key list"
    }
    fn expected(&self) -> String {
        format!("16-bit P_Keys (0x hex or decimal, not 0), comma-separated, at most {MAX_PKEYS}")
    }
    fn parse(&self, text: &str) -> Result<Vec<u16>, Option<String>> {
        let keys = text
            .split(',')
            .map(|x| {
                let x = x.trim();
                let v = match x.strip_prefix("0x").or_else(|| x.strip_prefix("0X")) {
                    Some(hex) => u16::from_str_radix(hex, 16),
                    None => x.parse::<u16>(),
                };
                v.ok()
                    .filter(|&k| k != 0)
                    .ok_or_else(|| Some(format!("`{x}` is not one")))
            })
            .collect::<Result<Vec<u16>, _>>()?;
        if keys.len() > usize::from(MAX_PKEYS) {
            return Err(Some(format!("{} entries", keys.len())));
        }
        Ok(keys)
    }
}

/// `roce` or `ib`, or several comma-separated, entry i for device i (the last for the devices
/// past the list); the value is, per entry, whether it is `ib`.
pub struct LinkLayers;

impl Kind for LinkLayers {
    type Value = Vec<bool>;
    fn type_name(&self) -> &'static str {
        "word list"
    }
    fn expected(&self) -> String {
        "roce or ib, or a comma-separated list of them: entry i for device i, the last for the rest".into()
    }
    fn parse(&self, text: &str) -> Result<Vec<bool>, Option<String>> {
        text.split(',')
            .map(|x| match x.trim() {
                "ib" => Ok(true),
                "roce" => Ok(false),
                x => Err(Some(format!("`{x}` is not one"))),
            })
            .collect()
    }
}
