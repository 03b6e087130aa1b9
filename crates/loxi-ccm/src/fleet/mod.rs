//! The loxilb fleet as a whole: HA roles across the loxilbs and their record (`roles`), and
//! one worker per loxilb that probes it, replays it and keeps its BGP in step (`workers`).
//! docs/fleet.md.

pub mod roles;
pub mod workers;
