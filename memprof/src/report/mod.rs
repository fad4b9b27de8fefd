//! Presentation-independent results: the report model, its JSON form and
//! the text summary, and the names report assembly gives code and data.

pub mod export;
#[cfg(test)]
pub mod fixtures;
pub mod flame;
pub mod format;
pub mod model;
pub mod names;
pub mod pprof;
pub mod profiles;
pub mod push;
pub mod section;
pub mod text;

pub use model::Report;
