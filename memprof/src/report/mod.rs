//! Presentation-independent results: the report model, its JSON form and
//! the text summary.

#[cfg(test)]
pub mod fixtures;
pub mod format;
pub mod model;
pub mod text;

pub use model::Report;
