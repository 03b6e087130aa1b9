//! The loxilb fleet as a whole: HA roles across the loxilbs and their record (`roles`).
//! docs/fleet.md.

pub mod roles;
