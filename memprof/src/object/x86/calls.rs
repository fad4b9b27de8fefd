//! Call instructions: whether the bytes before an offset end with one.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Longest x86 call instruction we look for (`call [rip+disp32]` with a
/// prefix, or `call [base+index*s+disp32]`).
const MAX_CALL_LEN: usize = 7;

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
}
