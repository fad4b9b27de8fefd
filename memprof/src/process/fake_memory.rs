//! A target's memory for unit tests: words at addresses, and regions
//! where every other word reads as zero.

use std::collections::BTreeMap;

use super::chunks::Memory;

/// The memory map of a program with its data, its `.bss` tail past the
/// file's pages, and its `[heap]`.
pub const PROGRAM_MAPS: &str = "\
555555554000-555555556000 r-xp 00000000 08:01 100 /usr/bin/prog
555555556000-555555557000 rw-p 00002000 08:01 100 /usr/bin/prog
555555557000-555555559000 rw-p 00000000 00:00 0 
555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]
";

#[derive(Default)]
pub struct FakeMemory {
    words: BTreeMap<u64, u64>,
    /// Readable ranges (start, length) beyond the words themselves.
    regions: Vec<(u64, u64)>,
}

impl FakeMemory {
    /// Memory of only these words (each readable alone).
    pub fn words(words: &[(u64, u64)]) -> Self {
        Self {
            words: words.iter().copied().collect(),
            regions: Vec::new(),
        }
    }

    /// Makes `[start, start + len)` readable, zero where no word was put.
    pub fn region(mut self, start: u64, len: u64) -> Self {
        self.regions.push((start, len));
        self
    }

    /// Puts `value` at `addr`.
    pub fn word(mut self, addr: u64, value: u64) -> Self {
        self.words.insert(addr, value);
        self
    }
}

impl Memory for FakeMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(end) = addr.checked_add(buf.len() as u64) else {
            return false;
        };
        let in_region = self
            .regions
            .iter()
            .any(|&(start, len)| addr >= start && end <= start + len);
        let one_word = buf.len() == 8 && self.words.contains_key(&addr);
        if !in_region && !one_word {
            return false;
        }
        for (at, byte) in (addr..end).zip(buf.iter_mut()) {
            let word = self.words.get(&(at & !7)).copied().unwrap_or(0);
            *byte = word.to_le_bytes()[(at & 7) as usize];
        }
        true
    }
}
