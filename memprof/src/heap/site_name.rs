//! How an allocation site is named wherever memory is named (heap objects
//! of false sharing and cache use, locks inside heap blocks): by the
//! first call that is not inside an allocation wrapper.
//!
//! Out-of-line wrappers are passed in the kernel (the site is the
//! wrapper's caller; [`super::Heap::site_via`] keeps the call inside the
//! wrapper). Inlined helpers leave no frame to pass: their calls are the
//! site's inline chain, and frames of it in a header file (a `static
//! inline` helper, a C++ container's allocation) or named as wrappers
//! ([`is_wrapper_name`]) are passed over here, while an outer frame is
//! left.

use crate::{
    object::symbolize::{Frame, Inlined},
    process::maps::Place,
    report::{model::CodeRef, names::code_ref, names::Names},
};

/// An allocation site named past its wrappers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteName {
    /// The site's call, at its own line, with the callers it was inlined
    /// into.
    pub chain: Inlined,
    /// The wrapper passed (the function called at the site), if any.
    pub via: Option<String>,
}

impl SiteName {
    /// "worker.c:133", or "worker.c:133 via xcalloc".
    pub fn label(&self) -> String {
        match &self.via {
            Some(via) => format!("{} via {via}", self.chain.frame.site_label()),
            None => self.chain.frame.site_label(),
        }
    }

    /// The JSON's `alloc_site`.
    pub fn code_ref(&self) -> CodeRef {
        CodeRef {
            via: self.via.clone(),
            ..code_ref(&self.chain)
        }
    }
}

/// Functions known to wrap the allocator (whatever their code says):
/// `xmalloc` and friends, GLib's, redis's, CPython's, FFmpeg's,
/// `operator new`.
pub fn is_wrapper_name(function: &str) -> bool {
    const EXACT: [&str; 22] = [
        "xmalloc",
        "xcalloc",
        "xrealloc",
        "xzalloc",
        "xmemdup",
        "xstrdup",
        "xstrndup",
        "g_malloc",
        "g_malloc0",
        "g_realloc",
        "g_try_malloc",
        "g_try_malloc0",
        "g_malloc_n",
        "g_malloc0_n",
        "g_slice_alloc",
        "g_slice_alloc0",
        "PyMem_Malloc",
        "PyMem_RawMalloc",
        "PyObject_Malloc",
        "av_malloc",
        "av_mallocz",
        "emalloc",
    ];
    const PREFIXES: [&str; 6] = [
        "zmalloc",
        "zcalloc",
        "zrealloc",
        "ztrymalloc",
        "ztrycalloc",
        "operator new",
    ];
    EXACT.contains(&function) || PREFIXES.iter().any(|p| function.starts_with(p))
}

/// Whether an inlined frame at an allocation call is a helper to pass
/// over: in a header, or named as an allocation wrapper.
fn is_inline_helper(frame: &Frame) -> bool {
    const HEADERS: [&str; 6] = [".h", ".hh", ".hpp", ".hxx", ".inl", ".tcc"];
    let in_header = frame
        .file
        .as_deref()
        .is_some_and(|f| HEADERS.iter().any(|h| f.ends_with(h)) || f.contains("/include/c++/"));
    in_header || is_wrapper_name(&frame.function)
}

/// `chain` with its inlined helper frames passed over, and the helper
/// called from the frame left (the outermost passed).
pub fn past_inline_helpers(mut chain: Inlined) -> (Inlined, Option<String>) {
    let mut via = None;
    while !chain.inlined_into.is_empty() && is_inline_helper(&chain.frame) {
        let caller = chain.inlined_into.remove(0);
        via = Some(std::mem::replace(&mut chain.frame, caller).function);
    }
    (chain, via)
}

/// The name of the allocation call at `site`, reached through the call
/// inside a wrapper at `via`, if any.
pub fn name_at(site: &Place, via: Option<&Place>, names: &mut dyn Names) -> SiteName {
    let (chain, inline_via) = past_inline_helpers(names.code_inlined(site));
    let via = via.map(|p| {
        // The call inside the wrapper: named by the wrapper's function
        // (its outermost, if that call was inlined too).
        names.code_inlined(p).outermost().function.clone()
    });
    SiteName {
        chain,
        via: via.or(inline_via),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            module: "prog".into(),
            file: Some(file.into()),
            line: Some(line),
        }
    }

    #[test]
    fn inlined_helpers_in_headers_or_named_as_wrappers_are_passed_over() {
        // A static inline helper from a header, inlined into main.
        let chain = Inlined {
            frame: frame("CALLOC", "/src/util.h", 58),
            inlined_into: vec![frame("main", "/src/prog.c", 133)],
        };
        let (site, via) = past_inline_helpers(chain);
        assert_eq!(site.frame, frame("main", "/src/prog.c", 133));
        assert!(site.inlined_into.is_empty());
        assert_eq!(via.as_deref(), Some("CALLOC"));
        let name = SiteName { chain: site, via };
        assert_eq!(name.label(), "prog.c:133 via CALLOC");
        assert_eq!(name.code_ref().via.as_deref(), Some("CALLOC"));
        // xmalloc inlined into a .c helper inlined into main: the helper
        // in the .c file is the program's own code and names the site.
        let chain = Inlined {
            frame: frame("xmalloc", "/src/x.c", 5),
            inlined_into: vec![
                frame("make_table", "/src/table.c", 20),
                frame("main", "/src/prog.c", 9),
            ],
        };
        let (site, via) = past_inline_helpers(chain);
        assert_eq!(site.frame.function, "make_table");
        assert_eq!(site.inlined_into.len(), 1);
        assert_eq!(via.as_deref(), Some("xmalloc"));
        // A helper compiled on its own (no caller in the chain) stays.
        let alone = Inlined::alone(frame("CALLOC", "/src/util.h", 58));
        assert_eq!(past_inline_helpers(alone.clone()), (alone, None));
    }
}
