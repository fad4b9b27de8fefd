//! Presentation-independent results: the report model, its JSON form and
//! the text summary.

pub mod model;
pub mod text;

pub use model::Report;
