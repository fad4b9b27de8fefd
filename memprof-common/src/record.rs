//! Decoding the plain-data records the kernel programs write.
//!
//! Every type the kernel hands to userspace (ring-buffer records and map
//! values) is `#[repr(C)]`, made of integers and arrays of integers (or of
//! such structs) only, and has no padding: its bytes are its value, and
//! any bytes are a value. [`Record`] states that once and decodes such a
//! type from a byte slice; the crate's `records!` macro marks the types.

/// A type whose every bit pattern of `size_of::<Self>()` bytes is a valid
/// value, so it can be read straight out of bytes the kernel wrote.
///
/// # Safety
///
/// The implementing type must be `#[repr(C)]`, contain only integers,
/// arrays of integers and other types meeting these rules, and have no
/// padding bytes (check its size at compile time against the sum of its
/// fields). This crate implements it through its `records!` macro.
pub unsafe trait Record: Copy {
    /// Decodes a record from the start of `bytes`; `None` if `bytes` is
    /// shorter than the record. Bytes past the record are ignored.
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < core::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: `bytes` holds at least `size_of::<Self>()` bytes (checked
        // above); `read_unaligned` copies them without requiring `bytes` to
        // be aligned for `Self`; and the `Record` contract (integers only,
        // no padding) makes every bit pattern of those bytes a valid value.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// Marks plain-data types as [`Record`]s (and, for the loader, as
/// `aya::Pod`, so they can be map values), and gives each an inherent
/// `from_bytes` so callers decode with `Type::from_bytes(bytes)` without
/// importing the trait.
///
/// The invocation is an `unsafe impl` of both traits: write a `// SAFETY:`
/// comment above it saying why each type meets [`Record`]'s contract.
macro_rules! records {
    ($($ty:ident),+ $(,)?) => {$(
        // SAFETY: the caller's comment at the invocation.
        unsafe impl $crate::Record for $ty {}

        // SAFETY: `aya::Pod` asks the same as `Record`: plain data, any
        // bit pattern valid.
        #[cfg(feature = "user")]
        unsafe impl aya::Pod for $ty {}

        impl $ty {
            /// Decodes a record from the start of `bytes`; `None` if it is
            /// too short ([`Record::from_bytes`](crate::Record::from_bytes)).
            #[inline]
            pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
                <Self as $crate::Record>::from_bytes(bytes)
            }
        }
    )+};
}
pub(crate) use records;

#[cfg(test)]
mod tests {
    use super::Record;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Pair {
        a: u32,
        b: u32,
        c: u64,
    }

    const _: () = assert!(core::mem::size_of::<Pair>() == 16);

    // SAFETY: `#[repr(C)]`, two u32 then a u64 = 16 bytes (asserted above),
    // no padding; any bit pattern is a valid value.
    super::records!(Pair);

    fn bytes_of<T: Record>(value: &T) -> &[u8] {
        // SAFETY: `value` is a live reference to `size_of::<T>()` bytes, and
        // a `Record` has no padding, so every byte is initialised.
        unsafe {
            core::slice::from_raw_parts((value as *const T).cast::<u8>(), core::mem::size_of::<T>())
        }
    }

    #[test]
    fn a_record_round_trips_through_its_bytes() {
        let p = Pair {
            a: 1,
            b: u32::MAX,
            c: 0x0102_0304_0506_0708,
        };
        assert_eq!(Pair::from_bytes(bytes_of(&p)), Some(p));
        assert_eq!(<Pair as Record>::from_bytes(bytes_of(&p)), Some(p));
    }

    #[test]
    fn short_input_is_refused_and_trailing_bytes_ignored() {
        let p = Pair { a: 7, b: 8, c: 9 };
        let bytes = bytes_of(&p);
        assert_eq!(Pair::from_bytes(&bytes[..15]), None);
        assert_eq!(Pair::from_bytes(&[]), None);
        let mut padded = [0xaau8; 24];
        padded[..16].copy_from_slice(bytes);
        assert_eq!(Pair::from_bytes(&padded), Some(p));
    }

    #[test]
    fn unaligned_input_is_read() {
        let p = Pair { a: 3, b: 4, c: 5 };
        let mut buf = [0u8; 17];
        buf[1..].copy_from_slice(bytes_of(&p));
        assert_eq!(Pair::from_bytes(&buf[1..]), Some(p));
    }
}
