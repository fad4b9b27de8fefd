//! Symbol names as the user wrote them.
//!
//! Only names that carry a mangling prefix are demangled. A C name is not
//! mangled, and an Itanium demangler reads a bare one- or two-letter name
//! as a builtin type code: `w` is `wchar_t`, `m` is `unsigned long`, `n`
//! is `__int128`, `ab` fails or worse. Blazesym's own demangling (0.2.7)
//! tries the C++ demangler on any name of a language it does not know,
//! which is every C program, so the symbolizer turns it off and names
//! go through [`demangle`].

use std::borrow::Cow;

/// `name` demangled when it is a Rust (`_R…`, legacy `_ZN…E`) or C++
/// (`_Z…`) mangled name; any other name as it is.
pub fn demangle(name: &str) -> Cow<'_, str> {
    let mangled = name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z");
    if !mangled {
        return Cow::Borrowed(name);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // `{:#}` leaves out the legacy hash suffix (`::h0123…`).
        return Cow::Owned(format!("{rust:#}"));
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|sym| sym.demangle().ok())
        .map_or(Cow::Borrowed(name), Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::demangle;

    /// The names a C demangler misreads as type codes stay as they are.
    #[test]
    fn short_c_names_are_not_type_codes() {
        for name in ["w", "m", "g", "n", "ab", "i", "Ss", "St", "v", "_", "main"] {
            assert_eq!(demangle(name), name);
        }
    }

    #[test]
    fn mangled_names_are_demangled() {
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE"),
            "std::rt::lang_start"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        // Not a valid mangling after all: kept.
        assert_eq!(demangle("_Zfoo"), "_Zfoo");
    }
}
