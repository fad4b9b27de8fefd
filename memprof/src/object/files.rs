//! The target's object files, read once each, and which offsets in them
//! are return addresses.
//!
//! A word on the stack that points into executable file-backed code right
//! after a call instruction is almost certainly a return address: that is
//! how the lock waits' call chains are found without frame pointers (libc
//! has none).

use std::{collections::HashMap, sync::Arc};

use super::{
    debugfile,
    symbolize::returns::Returns,
    unwind::vaddr_in,
    x86::{calls::ends_with_call, wrapper::returns_result},
};
use crate::process::{files::FileCache, objects::open_path};

/// What is asked of the code at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Question {
    FollowsCall,
    ReturnsResult,
}

/// Verdicts per (file, offset, question).
#[derive(Debug, Default)]
pub struct CodeCache {
    verdicts: HashMap<(Arc<str>, u64, Question), bool>,
    /// Which functions of each file return a value, from its debug info
    /// or its debug file's.
    returns: HashMap<Arc<str>, Returns>,
}

impl CodeCache {
    /// Whether the instruction ending right before `offset` in `path` is a
    /// call (so `offset` is where a call returns to).
    pub fn follows_call(&mut self, files: &mut FileCache, path: &Arc<str>, offset: u64) -> bool {
        self.verdict(files, path, offset, Question::FollowsCall, ends_with_call)
    }

    /// Whether the function whose call returns to `offset` in `path`
    /// returns what that call returned (an allocation wrapper): its code
    /// can return the call's `rax`, and its debug info, when there is
    /// any, does not say it returns nothing.
    pub fn returns_result(&mut self, files: &mut FileCache, path: &Arc<str>, offset: u64) -> bool {
        self.verdict(files, path, offset, Question::ReturnsResult, returns_result)
            && self.returns_value(files, path, offset) != Some(false)
    }

    /// Whether the debug info says the function at file offset `offset`
    /// returns a value (None: no debug info there).
    fn returns_value(
        &mut self,
        files: &mut FileCache,
        path: &Arc<str>,
        offset: u64,
    ) -> Option<bool> {
        let code = files.get(path)?;
        let pc = vaddr_in(&code, offset)?;
        let returns = self.returns.entry(path.clone()).or_insert_with(|| {
            let own = Returns::of(&code);
            if !own.is_empty() {
                return own;
            }
            debugfile::find(&open_path(path))
                .and_then(|d| std::fs::read(d).ok())
                .map(|d| Returns::of(&d))
                .unwrap_or_default()
        });
        returns.at(pc)
    }

    fn verdict(
        &mut self,
        files: &mut FileCache,
        path: &Arc<str>,
        offset: u64,
        question: Question,
        answer: fn(&[u8], usize) -> bool,
    ) -> bool {
        let key = (path.clone(), offset, question);
        if let Some(&v) = self.verdicts.get(&key) {
            return v;
        }
        let verdict = files.get(path).is_some_and(|b| answer(&b, offset as usize));
        self.verdicts.insert(key, verdict);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_cached_and_missing_files_say_no() {
        let (mut cache, mut files) = (CodeCache::default(), FileCache::default());
        let missing: Arc<str> = Arc::from("/nonexistent/lib.so");
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert_eq!(cache.verdicts.len(), 1);
    }
}
