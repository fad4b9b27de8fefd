//! Telling return addresses from other numbers on a stack.
//!
//! A word on the stack that points into executable file-backed code right
//! after a call instruction is almost certainly a return address: that is
//! how the lock waits' call chains are found without frame pointers (libc
//! has none). The code bytes come from the files, read once each.

use std::{collections::HashMap, sync::Arc};

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Longest x86 call instruction we look for (`call [rip+disp32]` with a
/// prefix, or `call [base+index*s+disp32]`).
const MAX_CALL_LEN: usize = 7;
/// Files larger than this are not read (no lock implementation is).
const MAX_FILE: u64 = 512 << 20;

/// The bytes of the object files seen, read once each and shared by the
/// return-address checks and the unwinder.
#[derive(Debug, Default)]
pub struct FileCache {
    files: HashMap<Arc<str>, Option<Arc<[u8]>>>,
}

impl FileCache {
    /// The whole file, or None if it cannot be read or is too large.
    pub fn get(&mut self, path: &Arc<str>) -> Option<Arc<[u8]>> {
        self.files
            .entry(path.clone())
            .or_insert_with(|| {
                let too_big = std::fs::metadata(&**path).map_or(true, |m| m.len() > MAX_FILE);
                (!too_big)
                    .then(|| std::fs::read(&**path).ok())
                    .flatten()
                    .map(Arc::from)
            })
            .clone()
    }
}

/// Verdicts per (file, offset).
#[derive(Debug, Default)]
pub struct CodeCache {
    verdicts: HashMap<(Arc<str>, u64), bool>,
}

impl CodeCache {
    /// Whether the instruction ending right before `offset` in `path` is a
    /// call (so `offset` is where a call returns to).
    pub fn follows_call(&mut self, files: &mut FileCache, path: &Arc<str>, offset: u64) -> bool {
        if let Some(&v) = self.verdicts.get(&(path.clone(), offset)) {
            return v;
        }
        let verdict = files
            .get(path)
            .is_some_and(|b| ends_with_call(&b, offset as usize));
        self.verdicts.insert((path.clone(), offset), verdict);
        verdict
    }
}

/// Whether some call instruction ends exactly at `end` in `code`.
pub fn ends_with_call(code: &[u8], end: usize) -> bool {
    (2..=MAX_CALL_LEN).any(|len| {
        let Some(start) = end.checked_sub(len) else {
            return false;
        };
        let Some(bytes) = code.get(start..end) else {
            return false;
        };
        let insn = Decoder::new(64, bytes, DecoderOptions::NONE).decode();
        !insn.is_invalid()
            && insn.len() == len
            && matches!(
                insn.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_recognised_by_the_bytes_before_the_return_address() {
        // call rel32 at 0, then mov.
        let code = [0xe8, 1, 2, 3, 4, 0x48, 0x89, 0xc7];
        assert!(ends_with_call(&code, 5));
        assert!(!ends_with_call(&code, 8), "after a mov");
        assert!(!ends_with_call(&code, 4), "inside the call");
        // call *%rax (ff d0)
        assert!(ends_with_call(&[0x90, 0xff, 0xd0], 3));
        // call *0x10(%rip) (ff 15 disp32)
        assert!(ends_with_call(&[0xff, 0x15, 0x10, 0, 0, 0], 6));
        assert!(!ends_with_call(&[], 0));
    }

    #[test]
    fn verdicts_are_cached_and_missing_files_say_no() {
        let (mut cache, mut files) = (CodeCache::default(), FileCache::default());
        let missing: Arc<str> = Arc::from("/nonexistent/lib.so");
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert_eq!(cache.verdicts.len(), 1);
    }
}
