//! What the sampled accesses of one participant (a lock call site on
//! one thread) touched: per 8-byte word, reads, writes, the bytes and the
//! values stored ([`super::analysis`] joins them; [`super::classes`]
//! compares two participants' sets).

use super::analysis::{Access, WORDS_MAX, WORDS_TOTAL_MAX, WORD_BYTES};
use crate::features::FastMap;

/// What one word's sampled accesses did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WordUse {
    pub reads: u32,
    pub writes: u32,
    /// Bytes of the word read, and written (bit i: byte i).
    pub read_bytes: u8,
    pub write_bytes: u8,
    /// What the writes stored.
    pub stored: Stored,
}

/// The values a word's sampled writes stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stored {
    /// No write sampled.
    #[default]
    Nothing,
    /// Every write stored this constant, `size` bytes at byte `at` of
    /// the word.
    Constant { at: u8, size: u8, value: u64 },
    /// Values computed at run time, or several constants, or writes of
    /// different bytes.
    Varies,
}

impl Stored {
    /// After a write of `a` to `word` (a constant only when the write
    /// lies within the word).
    pub(super) fn add(self, a: &Access, word: u64) -> Stored {
        let inside = a.addr >= word && a.addr + u64::from(a.size.max(1)) <= word + WORD_BYTES;
        let this = match a.value {
            Some(value) if inside => Stored::Constant {
                at: (a.addr - word) as u8,
                size: a.size.max(1) as u8,
                value,
            },
            _ => Stored::Varies,
        };
        match self {
            Stored::Nothing => this,
            c if c == this => c,
            _ => Stored::Varies,
        }
    }
}

impl WordUse {
    pub(super) fn bytes(&self) -> u8 {
        self.read_bytes | self.write_bytes
    }
}

/// The sections of one participant and what they were sampled touching.
#[derive(Debug, Clone, Default)]
pub struct Participant {
    pub sections: u64,
    /// Sections with at least one sampled access.
    pub sampled_sections: u64,
    pub accesses: u64,
    /// Accesses sampled outside every known section at this lock's
    /// section code ([`super::analysis::SectionCode`]), in `words` and `private` but not
    /// in `accesses`.
    pub inferred: u64,
    /// Accesses known not to conflict ([`Access::private`]).
    pub private: u64,
    /// Per 8-byte word (address of its first byte).
    pub words: FastMap<u64, WordUse>,
    /// Accesses to words beyond [`WORDS_MAX`] (taken as shared
    /// conflicting: they keep a pair from looking unnecessary).
    pub words_unkept: u64,
}

impl Participant {
    /// Adds a sampled access; `used` counts the words of the whole
    /// analysis ([`WORDS_TOTAL_MAX`]).
    pub(super) fn add(&mut self, a: &Access, used: &mut usize) {
        self.accesses += 1;
        self.add_words(a, used);
    }

    /// Adds an inferred access ([`SectionCode`]).
    pub(super) fn add_inferred(&mut self, a: &Access, used: &mut usize) {
        self.inferred += 1;
        self.add_words(a, used);
    }

    fn add_words(&mut self, a: &Access, used: &mut usize) {
        if a.private {
            self.private += 1;
            return;
        }
        let first = a.addr & !(WORD_BYTES - 1);
        let end = a.addr + u64::from(a.size.max(1));
        let mut word = first;
        while word < end {
            let lo = a.addr.max(word) - word;
            let hi = end.min(word + WORD_BYTES) - word;
            let mask = (((1u16 << hi) - 1) & !((1u16 << lo) - 1)) as u8;
            if !self.words.contains_key(&word) {
                if self.words.len() >= WORDS_MAX || *used >= WORDS_TOTAL_MAX {
                    self.words_unkept += 1;
                    return;
                }
                *used += 1;
            }
            let w = self.words.entry(word).or_default();
            if a.write {
                w.writes += 1;
                w.write_bytes |= mask;
                w.stored = w.stored.add(a, word);
            } else {
                w.reads += 1;
                w.read_bytes |= mask;
            }
            word += WORD_BYTES;
        }
    }
}
