//! An analysis's own part of the report, kept in the analysis's directory:
//! the summary, the JSON file and the dashboard render every [`Section`]
//! of a report without naming it, so adding one touches nothing here.
//!
//! In the JSON form a section is one top-level key beside the common
//! header. A report read back gives each section to the analysis that
//! registered its key ([`crate::features::SLICES`]); a key no analysis of
//! this build knows is kept as it was ([`Stored`]).

use std::fmt::Write as _;

use ratatui::{layout::Rect, Frame};
use serde::{ser::SerializeMap, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::{features::AsAny, report::Report, tui::Selection};

/// One analysis's part of a report.
pub trait Section: AsAny + std::fmt::Debug + Send + Sync {
    /// Its top-level key in the JSON report.
    fn key(&self) -> &str;
    /// Its JSON value.
    fn to_json(&self) -> Value;
    /// Its part of the text summary, laid out for
    /// [`crate::report::text::WIDTH`] columns (longer lines are cut).
    fn write_text(&self, out: &mut String);
    /// The title of its dashboard tab, when it has one (the dashboard
    /// numbers it).
    fn tab_title(&self) -> Option<&str> {
        None
    }
    /// Rows ↑/↓ select on its tab.
    fn tab_rows(&self) -> usize {
        0
    }
    /// Draws its tab's body in `area` (`report` is the whole report, for
    /// the header's figures), with the row `selection` selects.
    fn render_tab(&self, _report: &Report, _frame: &mut Frame, _area: Rect, _selection: Selection) {
    }
    /// A copy (reports are cloned for the dashboard).
    fn clone_box(&self) -> Box<dyn Section>;
}

/// How a section is read back from JSON: its key, and the reader its
/// analysis registers.
pub struct SectionKind {
    pub key: &'static str,
    pub read: fn(Value) -> serde_json::Result<Box<dyn Section>>,
}

impl SectionKind {
    /// The kind of a section that is a plain serde type.
    pub const fn of<T>(key: &'static str) -> Self
    where
        T: Section + serde::de::DeserializeOwned + 'static,
    {
        Self {
            key,
            read: |v| Ok(Box::new(serde_json::from_value::<T>(v)?)),
        }
    }
}

/// A report's sections, in the order the analyses wrote them.
#[derive(Debug, Default)]
pub struct Sections(Vec<Box<dyn Section>>);

impl Sections {
    /// Adds `section`, replacing one of the same key.
    pub fn put(&mut self, section: Box<dyn Section>) {
        match self.0.iter_mut().find(|s| s.key() == section.key()) {
            Some(old) => *old = section,
            None => self.0.push(section),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Section> {
        self.0.iter().map(|s| s.as_ref())
    }

    /// The sections that have a dashboard tab.
    pub fn tabs(&self) -> impl Iterator<Item = &dyn Section> {
        self.iter().filter(|s| s.tab_title().is_some())
    }

    /// The section of type `T`, typed.
    pub fn find<T: 'static>(&self) -> Option<&T> {
        self.iter().find_map(|s| s.as_any().downcast_ref::<T>())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Clone for Sections {
    fn clone(&self) -> Self {
        Self(self.0.iter().map(|s| s.clone_box()).collect())
    }
}

impl Serialize for Sections {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for section in &self.0 {
            map.serialize_entry(section.key(), &section.to_json())?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Sections {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries = serde_json::Map::<String, Value>::deserialize(d)?;
        let mut sections = Sections::default();
        for (key, value) in entries {
            let kind = crate::features::SLICES
                .iter()
                .flat_map(|s| s.sections)
                .find(|k| k.key == key);
            let section = match kind {
                Some(kind) => (kind.read)(value)
                    .map_err(|e| serde::de::Error::custom(format!("section {key}: {e}")))?,
                None => Box::new(Stored { key, value }),
            };
            sections.0.push(section);
        }
        Ok(sections)
    }
}

/// A section of an analysis this build does not have, kept as read so
/// that the report writes it back unchanged.
#[derive(Debug, Clone)]
pub struct Stored {
    key: String,
    value: Value,
}

impl Section for Stored {
    fn key(&self) -> &str {
        &self.key
    }

    fn to_json(&self) -> Value {
        self.value.clone()
    }

    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{}: in the JSON report (written by an analysis this build does not have)",
            self.key
        );
    }

    fn clone_box(&self) -> Box<dyn Section> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_no_analysis_knows_is_kept_as_read() {
        let json = r#"{"someone_else": {"n": [1, 2]}}"#;
        let sections: Sections = serde_json::from_str(json).unwrap();
        let back = serde_json::to_value(&sections).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(json).unwrap());
        let mut text = String::new();
        sections.iter().for_each(|s| s.write_text(&mut text));
        assert!(
            text.starts_with("someone_else: in the JSON report"),
            "{text}"
        );
        assert_eq!(sections.tabs().count(), 0);
    }

    #[test]
    fn a_section_replaces_the_one_of_its_key() {
        let mut sections = Sections::default();
        for n in [1, 2] {
            sections.put(Box::new(Stored {
                key: "k".into(),
                value: n.into(),
            }));
        }
        assert_eq!(serde_json::to_string(&sections).unwrap(), r#"{"k":2}"#);
        assert!(sections.find::<Stored>().is_some());
    }
}
