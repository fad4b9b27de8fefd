//! The global that keeps a heap block. A block allocated before tracing
//! has no allocation site, but a program usually keeps it in a variable
//! (`g_table = calloc(...)`), and that variable says which object it is.
//! Found by reading the target's writable data (the program's and its
//! libraries' `.data` and `.bss`) for a word that points into the block.

use super::{chunks::Memory, maps::ProcMaps};

/// Bytes read per read of the target's memory.
const STEP: usize = 64 << 10;

/// Bytes of the target's globals read, at most, each time blocks are
/// named (a program's and its libraries' writable data is usually a few
/// MiB; the dashboard makes a report a second).
pub const SCAN_MAX: u64 = 32 << 20;

/// How a block is named after the global that points into it.
pub fn pointed_to_by(name: String, global: Option<String>) -> String {
    match global {
        Some(global) => format!("{name}, pointed to by {global}"),
        None => name,
    }
}

/// Where a word of the target's object files' writable data points into
/// `[start, end)`: the first such word, in address order (a PIE program's
/// own data comes before its libraries'), within `budget` bytes read,
/// which it spends.
pub fn pointer_into(
    maps: &ProcMaps,
    mem: &dyn Memory,
    (start, end): (u64, u64),
    budget: &mut u64,
) -> Option<u64> {
    let mut buf = vec![0u8; STEP];
    for (from, to) in maps.data_images() {
        let mut at = from;
        while at < to && *budget > 0 {
            let len = ((to - at).min(STEP as u64).min(*budget) as usize) & !7;
            if len == 0 || !mem.read(at, &mut buf[..len]) {
                break;
            }
            *budget -= len as u64;
            let hit = buf[..len]
                .chunks_exact(8)
                .position(|w| (start..end).contains(&u64::from_le_bytes(w.try_into().unwrap())));
            if let Some(i) = hit {
                return Some(at + 8 * i as u64);
            }
            at += len as u64;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::fake_memory::{FakeMemory, PROGRAM_MAPS as MAPS};

    /// The program's writable data of [`MAPS`]: its `.data` holds an
    /// unrelated heap pointer, the `.bss` beyond the file's page one into
    /// [`BLOCK`] (not at its start).
    fn program_data() -> FakeMemory {
        FakeMemory::default()
            .region(0x5555_5555_6000, 0x3000)
            .word(0x5555_5555_6010, 0x5555_5555_9100)
            .word(0x5555_5555_7a08, 0x5555_5555_a010)
    }

    const BLOCK: (u64, u64) = (0x5555_5555_a000, 0x5555_5555_a040);

    #[test]
    fn the_word_in_the_programs_bss_that_points_into_the_block_is_found() {
        let (maps, mem) = (ProcMaps::parse(MAPS), program_data());
        let mut budget = 1 << 20;
        assert_eq!(
            pointer_into(&maps, &mem, BLOCK, &mut budget),
            Some(0x5555_5555_7a08)
        );
        assert_eq!(budget, (1 << 20) - 0x3000, "read up to the hit's step");
    }

    #[test]
    fn no_pointer_or_no_budget_finds_nothing() {
        let (maps, mem) = (ProcMaps::parse(MAPS), program_data());
        let mut budget = 1 << 20;
        let elsewhere = (0x1000, 0x2000);
        assert_eq!(pointer_into(&maps, &mem, elsewhere, &mut budget), None);
        // The heap itself is not read: only object files' data.
        assert_eq!(budget, (1 << 20) - 0x3000);
        // The budget runs out in .data, before the pointer in .bss.
        let mut budget = 0x1000;
        assert_eq!(pointer_into(&maps, &mem, BLOCK, &mut budget), None);
        assert_eq!(budget, 0);
    }
}
