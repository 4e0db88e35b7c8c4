//! placeholder until the softroce issue fills it

pub mod proto;
pub mod wire;
