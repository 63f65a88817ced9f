//! What an uploaded file is: its GNU build id, what it can symbolize with
//! (DWARF, an ELF symbol table) and the layout of its loadable segments, to
//! turn a frame's file offset into the virtual address DWARF speaks of.

use object::read::elf::{ElfFile, FileHeader, ProgramHeader};
use object::{Object, ObjectSection, SectionKind};
use serde::{Deserialize, Serialize};

/// Why a file cannot be used as debug info.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not an ELF file ({0})")]
    NotElf(String),
    #[error("the ELF file has no GNU build id note (.note.gnu.build-id)")]
    NoBuildId,
    #[error(
        "the ELF file has neither DWARF (.debug_info), nor a symbol table (.symtab), nor a Go .gopclntab: nothing to symbolize with"
    )]
    NothingToSymbolize,
    #[error("the ELF file is truncated or corrupt: {0}")]
    Corrupt(String),
}

/// What a debug info file holds, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// DWARF: functions, inlined frames, files and lines.
    Dwarf,
    /// A Go binary's `.gopclntab` (kept by stripping): functions, files
    /// and lines, without inlined frames.
    Gopclntab,
    /// An ELF symbol table only: function names.
    Symtab,
}

/// A loadable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
    pub executable: bool,
}

/// What [`inspect`] learnt of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElfInfo {
    /// Lowercase hex.
    pub build_id: String,
    pub kind: Kind,
    /// The segments as the original executable had them (reconstructed for
    /// a separate debug file, whose segments have no file contents).
    pub segments: Vec<Segment>,
}

impl ElfInfo {
    /// The virtual address of file offset `offset` in the original
    /// executable, if a loadable segment holds it.
    pub fn offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz.max(1))
            .and_then(|s| s.vaddr.checked_add(offset - s.offset))
    }
}

/// Reads the build id, kind and segments of an ELF file, refusing what
/// cannot symbolize anything. Never panics on any input.
pub fn inspect(data: &[u8]) -> Result<ElfInfo, ElfError> {
    match object::FileKind::parse(data) {
        Ok(object::FileKind::Elf64) => {
            inspect_as::<object::elf::FileHeader64<object::Endianness>>(data)
        }
        Ok(object::FileKind::Elf32) => {
            inspect_as::<object::elf::FileHeader32<object::Endianness>>(data)
        }
        Ok(other) => Err(ElfError::NotElf(format!("a {other:?} file"))),
        Err(_) if data.len() < 4 || &data[..4] != b"\x7fELF" => {
            Err(ElfError::NotElf("no ELF magic at the start".into()))
        }
        Err(e) => Err(ElfError::Corrupt(e.to_string())),
    }
}

/// The GNU build id of an ELF file as lowercase hex.
pub fn build_id(data: &[u8]) -> Result<String, ElfError> {
    let f = object::File::parse(data).map_err(|e| {
        if data.starts_with(b"\x7fELF") {
            ElfError::Corrupt(e.to_string())
        } else {
            ElfError::NotElf("no ELF magic at the start".into())
        }
    })?;
    match f.build_id() {
        Ok(Some(b)) if !b.is_empty() => Ok(hex::encode(b)),
        Ok(_) => Err(ElfError::NoBuildId),
        Err(e) => Err(ElfError::Corrupt(e.to_string())),
    }
}

fn inspect_as<'d, H: FileHeader<Endian = object::Endianness>>(
    data: &'d [u8],
) -> Result<ElfInfo, ElfError> {
    let f = ElfFile::<'d, H>::parse(data).map_err(|e| ElfError::Corrupt(e.to_string()))?;
    let build_id = match f.build_id() {
        Ok(Some(b)) if !b.is_empty() => hex::encode(b),
        Ok(_) => return Err(ElfError::NoBuildId),
        Err(e) => return Err(ElfError::Corrupt(e.to_string())),
    };
    let has_data = |name: &str| {
        f.section_by_name(name).is_some_and(|s| {
            s.kind() != SectionKind::UninitializedData
                && s.file_range().is_some_and(|(_, size)| size > 0)
        })
    };
    let kind = if has_data(".debug_info") {
        Kind::Dwarf
    } else if has_data(".gopclntab") {
        Kind::Gopclntab
    } else if has_data(".symtab") {
        Kind::Symtab
    } else {
        return Err(ElfError::NothingToSymbolize);
    };
    // Every section's data must be inside the file: a truncated upload is
    // refused here rather than failing at query time.
    for s in f.sections() {
        if let Some((off, size)) = s.file_range()
            && off
                .checked_add(size)
                .is_none_or(|end| end > data.len() as u64)
        {
            return Err(ElfError::Corrupt(format!(
                "section {} ends past the end of the file ({} bytes)",
                s.name().unwrap_or("?"),
                data.len()
            )));
        }
    }
    let e = f.endian();
    let mut segments: Vec<Segment> = f
        .elf_program_headers()
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD)
        .map(|p| Segment {
            vaddr: p.p_vaddr(e).into(),
            offset: p.p_offset(e).into(),
            filesz: p.p_filesz(e).into(),
            memsz: p.p_memsz(e).into(),
            align: p.p_align(e).into(),
            executable: p.p_flags(e) & object::elf::PF_X != 0,
        })
        .collect();
    if segments.iter().any(|s| s.executable && s.filesz == 0) {
        segments = reconstruct(&segments);
    }
    Ok(ElfInfo {
        build_id,
        kind,
        segments,
    })
}

/// The file offsets the original executable's segments had, from a
/// separate debug file's segments (`objcopy --only-keep-debug` keeps their
/// addresses and sizes but not their file contents or offsets). Linkers
/// (GNU ld, gold, lld, Go's) place the first segment at offset 0 and each
/// next one at the first offset past the previous one's contents that is
/// congruent to its address modulo its alignment; read-only and executable
/// segments have as many bytes in the file as in memory.
fn reconstruct(segments: &[Segment]) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len());
    let mut next = 0u64;
    for s in segments {
        let align = s.align.max(1);
        let want = s.vaddr % align;
        let base = next - next % align;
        let mut off = base.saturating_add(want);
        if off < next {
            off = off.saturating_add(align);
        }
        let filesz = s.memsz;
        out.push(Segment {
            offset: off,
            filesz,
            ..*s
        });
        next = off.saturating_add(filesz);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_elf() {
        assert!(matches!(inspect(b"hello"), Err(ElfError::NotElf(_))));
        assert!(matches!(inspect(b""), Err(ElfError::NotElf(_))));
        assert!(matches!(
            inspect(b"\x7fELF\x02\x01\x01"),
            Err(ElfError::Corrupt(_) | ElfError::NotElf(_))
        ));
    }

    #[test]
    fn reconstructs_ld_and_lld_layouts() {
        let seg = |vaddr, memsz, executable| Segment {
            vaddr,
            offset: 0,
            filesz: 0,
            memsz,
            align: 0x1000,
            executable,
        };
        // GNU ld with separate code (a PIE): R at 0, RX page aligned.
        let ld = reconstruct(&[seg(0, 0x618, false), seg(0x1000, 0x1ad, true)]);
        assert_eq!(ld[1].offset, 0x1000);
        // lld: RX one page above its offset.
        let lld = reconstruct(&[seg(0, 0x3b0c0, false), seg(0x3c0c0, 0x500, true)]);
        assert_eq!(lld[1].offset, 0x3b0c0);
        // Go: one RX segment with the headers, at 0x400000.
        let go = reconstruct(&[seg(0x400000, 0x9000, true)]);
        assert_eq!(go[0].offset, 0);
        let info = ElfInfo {
            build_id: String::new(),
            kind: Kind::Dwarf,
            segments: lld,
        };
        assert_eq!(info.offset_to_vaddr(0x3b0c4), Some(0x3c0c4));
        assert_eq!(info.offset_to_vaddr(0x3b0c0 + 0x500), None);
    }
}
