//! The traced process as the rest of the program sees it: where its
//! addresses lie ([`maps`]: the memory map, [`maps::Place`]).
//!
//! The pure analyses, the report and the symbolizer name places in the
//! target through this module, not through the collector that reads the
//! events.

pub mod launch;
pub mod maps;
pub mod threads;
