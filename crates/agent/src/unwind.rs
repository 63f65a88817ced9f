//! Unwind tables for code built without frame pointers (x86_64).
//!
//! ```text
//! binary's .eh_frame / .debug_frame ──gimli──► rows (pc, CFA rule, rbp rule), compacted
//!        keyed by build id, one table per file ──► slice of BPF array `unwind_rows` (budget)
//! process maps ──► per-process `unwind_procs` entry: mapping → (bias, table slice)
//! ```
//!
//! A row says, from its address up to the next row's: where the CFA is
//! (`rsp + n`, `rbp + n`, a PLT entry, or the outermost frame), and where the
//! caller's rbp was saved (unchanged, or at `CFA + n`). The return address is
//! at `CFA − 8` on x86_64. Rules the BPF program cannot follow (DWARF
//! expressions other than the PLT's, registers saved in other registers) are
//! kept as "unsupported" rows so that a stack ending there is marked
//! truncated instead of going astray; gaps between FDEs likewise.
//!
//! Tables are shared by every process that maps the same file and freed
//! when no process maps it any more. The array is sized once from the
//! memory budget (`--unwind-table-budget`); a table that does not fit is
//! not loaded (its binary is unwound with frame pointers) and counted.

use std::collections::{HashMap, HashSet};
use std::fs::File;

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use fathom_agent_ebpf::{
    CfaType, PyProc, RbpType, UNWIND_MAX_MAPPINGS, UnwindMapping, UnwindProc, UnwindRow,
};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, NativeEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};

use crate::elf::{ElfError, ElfLayout};

/// Default memory budget of the unwind tables (kernel memory, not the
/// agent's heap).
pub(crate) const DEFAULT_BUDGET: u64 = 32 << 20;
/// Intervals a table stays loaded after the last process mapping its file
/// went away (and a file without a table is not retried).
const IDLE_INTERVALS: u64 = 6;
/// Files remembered as having no table.
const MAX_REJECTED: usize = 4096;
/// Bytes per row in the BPF array.
pub(crate) const ROW_BYTES: u64 = std::mem::size_of::<UnwindRow>() as u64;

/// Why a binary has no table.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnwindError {
    #[error("reading the ELF file")]
    Elf(#[from] ElfError),
    #[error("parsing its call frame information")]
    Cfi(#[from] gimli::Error),
    #[error("it has no .eh_frame or .debug_frame")]
    NoCfi,
    #[error("its code lies above 4 GiB")]
    TooHigh,
    #[error("its call frame information is larger than {MAX_CFI_BYTES} bytes")]
    TooBig,
    #[error("its FDEs are not sorted by address")]
    Unsorted,
    #[error("it has more rows than estimated from its size")]
    OverEstimate,
    #[error("writing its table into the BPF map")]
    Map(#[from] aya::maps::MapError),
}

/// One address range of an FDE with its rule, before compaction.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    end: u32,
    rule: Rule,
}

/// Largest call frame information (`.eh_frame` + `.debug_frame`) turned
/// into a table by collecting and sorting its spans (a file with a
/// `.debug_frame`, or FDEs that overlap): that costs ~2.5 bytes of
/// transient heap per byte of CFI and ~0.5 µs per row. Bigger files of
/// that kind are unwound with frame pointers; files with sorted FDEs are
/// streamed, up to `MAX_STREAMED_CFI_BYTES`.
pub(crate) const MAX_CFI_BYTES: u64 = 2 << 20;
/// Largest call frame information streamed into a table (no
/// `.debug_frame`, FDEs that do not overlap): the transient heap is the
/// section itself, but the time is ~0.5 µs per row plus a map update each,
/// spent on the collector's thread, which handles no samples meanwhile. A
/// larger limit (8 MiB: a release Rust service such as Garage has 3.2 MB of
/// `.eh_frame`, `node` 2.7 MB) stalled sampling of the processes started
/// at the same time by seconds in a debug build, so it waits until tables
/// are built off that thread.
pub(crate) const MAX_STREAMED_CFI_BYTES: u64 = 2 << 20;
/// Rows per byte of `.eh_frame`, a little above what was measured (libc
/// 0.18, librustc_driver 0.18, python3.11 0.16, Rust debug binaries 0.15).
const ROWS_PER_CFI_BYTE: f64 = 0.2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    cfa: CfaType,
    cfa_off: i16,
    rbp: RbpType,
    rbp_off: i16,
}

const UNSUPPORTED: Rule = Rule {
    cfa: CfaType::Unsupported,
    cfa_off: 0,
    rbp: RbpType::Same,
    rbp_off: 0,
};

/// The PLT's CFA expression: `rsp + 8 + ((rip & 15) >= N) << 3`
/// (DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litN;
/// DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus). Returns N.
fn plt_threshold(expr: &[u8]) -> Option<i16> {
    match expr {
        [0x77, 8, 0x80, 0, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
            if (0x30..=0x4f).contains(lit) =>
        {
            Some(i16::from(*lit - 0x30))
        }
        _ => None,
    }
}

fn small(v: i64) -> Option<i16> {
    i16::try_from(v).ok()
}

fn rule_of<R: gimli::Reader>(
    row: &gimli::UnwindTableRow<R::Offset>,
    section: &impl UnwindSection<R>,
) -> Rule {
    let (cfa, cfa_off) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = if *register == X86_64::RSP {
                CfaType::Rsp
            } else if *register == X86_64::RBP {
                CfaType::Rbp
            } else {
                return UNSUPPORTED;
            };
            match small(*offset) {
                Some(o) => (kind, o),
                None => return UNSUPPORTED,
            }
        }
        CfaRule::Expression(e) => {
            let bytes = e
                .get(section)
                .ok()
                .and_then(|e| e.0.to_slice().ok().map(|b| b.into_owned()));
            match bytes.as_deref().and_then(plt_threshold) {
                Some(n) => (CfaType::Plt, n),
                None => return UNSUPPORTED,
            }
        }
    };
    if matches!(row.register(X86_64::RA), Some(RegisterRule::Undefined)) {
        return Rule {
            cfa: CfaType::End,
            cfa_off: 0,
            rbp: RbpType::Same,
            rbp_off: 0,
        };
    }
    let (rbp, rbp_off) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => (RbpType::Same, 0),
        Some(RegisterRule::Offset(o)) => match small(o) {
            Some(o) => (RbpType::Offset, o),
            None => (RbpType::Lost, 0),
        },
        _ => (RbpType::Lost, 0),
    };
    Rule {
        cfa,
        cfa_off,
        rbp,
        rbp_off,
    }
}

fn spans_of<R: gimli::Reader, S: UnwindSection<R>>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut dyn FnMut(Span) -> Result<(), UnwindError>,
) -> Result<(), UnwindError> {
    // FDEs in address order (linkers mostly, but not always, write them
    // so: libc's are not): their start and offset, 16 bytes per function.
    let mut fdes = Vec::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        // An FDE that does not parse (a CIE version we do not know) leaves a
        // gap, which unwinds as truncated.
        if let Ok(fde) = partial.parse(S::cie_from_offset) {
            fdes.push((fde.initial_address(), fde.offset()));
        }
    }
    fdes.sort_unstable_by_key(|&(addr, _)| addr);
    let mut ctx = Box::new(UnwindContext::new());
    // Neighbours with the same rule (an FDE's rows that only change
    // registers the unwinder ignores) are one span.
    let mut pending: Option<Span> = None;
    for (_, offset) in fdes {
        let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        else {
            continue;
        };
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
            continue;
        };
        while let Some(row) = table.next_row()? {
            if row.end_address() > row.start_address() {
                let (Ok(start), Ok(end)) = (
                    u32::try_from(row.start_address()),
                    u32::try_from(row.end_address()),
                ) else {
                    return Err(UnwindError::TooHigh);
                };
                let rule = rule_of(row, section);
                if let Some(last) = pending.as_mut()
                    && last.end == start
                    && last.rule == rule
                {
                    last.end = end;
                    continue;
                }
                if let Some(done) = pending.replace(Span { start, end, rule }) {
                    out(done)?;
                }
            }
        }
    }
    if let Some(done) = pending {
        out(done)?;
    }
    Ok(())
}

/// The compacted unwind table of an ELF file, sorted by address. Empty when
/// the file has CFI that covers nothing.
#[cfg(test)]
pub(crate) fn build_table(file: &File) -> Result<Vec<UnwindRow>, UnwindError> {
    let layout = ElfLayout::read(file)?;
    if cfi_bytes(&layout) > MAX_CFI_BYTES {
        return Err(UnwindError::TooBig);
    }
    build_rows(file, &layout)
}

/// The `.eh_frame` section of a file and the base addresses its pointers
/// are relative to.
fn eh_frame_of(
    file: &File,
    layout: &ElfLayout,
) -> Result<Option<(Vec<u8>, BaseAddresses)>, UnwindError> {
    let Some(s) = layout.section(".eh_frame") else {
        return Ok(None);
    };
    let data = layout.read_section(file, s)?;
    let addr = layout.file_offset_to_vaddr(s.offset).unwrap_or(0);
    let mut bases = BaseAddresses::default().set_eh_frame(addr);
    if let Some(t) = layout.section(".text")
        && let Some(a) = layout.file_offset_to_vaddr(t.offset)
    {
        bases = bases.set_text(a);
    }
    if let Some(g) = layout.section(".got")
        && let Some(a) = layout.file_offset_to_vaddr(g.offset)
    {
        bases = bases.set_got(a);
    }
    Ok(Some((data, bases)))
}

/// Makes the table of a file that has only `.eh_frame` row by row into
/// `emit`, FDE by FDE in address order, holding neither the spans nor the
/// rows: the transient memory is the section itself and 16 bytes per FDE.
/// [`UnwindError::Unsorted`] for a file whose FDEs overlap (then
/// [`build_rows`] sorts their rows), [`UnwindError::NoCfi`] when it has a
/// `.debug_frame` to merge or no `.eh_frame`.
fn stream_rows(
    file: &File,
    layout: &ElfLayout,
    emit: &mut dyn FnMut(UnwindRow) -> Result<(), UnwindError>,
) -> Result<(), UnwindError> {
    if layout.section(".debug_frame").is_some() {
        return Err(UnwindError::NoCfi);
    }
    let Some((data, bases)) = eh_frame_of(file, layout)? else {
        return Err(UnwindError::NoCfi);
    };
    let mut eh = EhFrame::new(&data, NativeEndian);
    eh.set_address_size(8);
    let mut c = Compactor::new(emit);
    spans_of(&eh, &bases, &mut |s| c.span(s))?;
    c.finish()
}

/// [`build_table`] without the size limit.
fn build_rows(file: &File, layout: &ElfLayout) -> Result<Vec<UnwindRow>, UnwindError> {
    let mut spans = Vec::new();
    let mut found = false;
    if let Some((data, bases)) = eh_frame_of(file, layout)? {
        found = true;
        let mut eh = EhFrame::new(&data, NativeEndian);
        eh.set_address_size(8);
        spans_of(&eh, &bases, &mut |s| {
            spans.push(s);
            Ok(())
        })?;
    }
    if let Some(s) = layout.section(".debug_frame") {
        found = true;
        let data = layout.read_section(file, s)?;
        let mut df = DebugFrame::new(&data, NativeEndian);
        df.set_address_size(8);
        let mut more = Vec::new();
        spans_of(&df, &BaseAddresses::default(), &mut |s| {
            more.push(s);
            Ok(())
        })?;
        // .eh_frame wins where both describe an address.
        let covered: Vec<(u32, u32)> = {
            let mut c: Vec<(u32, u32)> = spans.iter().map(|s| (s.start, s.end)).collect();
            c.sort_unstable();
            c
        };
        more.retain(|s| {
            let i = covered.partition_point(|&(a, _)| a <= s.start);
            i == 0 || covered[i - 1].1 <= s.start
        });
        spans.extend(more);
    }
    if !found {
        return Err(UnwindError::NoCfi);
    }
    compact(spans)
}

/// Bytes of call frame information of a file.
fn cfi_bytes(layout: &ElfLayout) -> u64 {
    [".eh_frame", ".debug_frame"]
        .iter()
        .filter_map(|n| layout.section(n))
        .map(|s| s.size)
        .sum()
}

/// Sorted, non-overlapping rows; a gap between spans gets a `None` row.
fn compact(mut spans: Vec<Span>) -> Result<Vec<UnwindRow>, UnwindError> {
    spans.sort_by_key(|s| (s.start, s.end));
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(spans.len() / 2);
    let mut c = Compactor::new(|r| {
        rows.push(r);
        Ok(())
    });
    for s in spans {
        c.span(s)?;
    }
    c.finish()?;
    Ok(rows)
}

const GAP: Rule = Rule {
    cfa: CfaType::None,
    cfa_off: 0,
    rbp: RbpType::Same,
    rbp_off: 0,
};

fn row_of(pc: u32, r: Rule) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_off: r.cfa_off,
        rbp_off: r.rbp_off,
        cfa_type: r.cfa as u8,
        rbp_type: r.rbp as u8,
        reserved: 0,
    }
}

/// Turns spans sorted by start into table rows as they come, holding back
/// one row (a later span starting at the same address replaces it), so a
/// table can be written out without collecting the spans first.
struct Compactor<F: FnMut(UnwindRow) -> Result<(), UnwindError>> {
    emit: F,
    /// The last row made, not emitted yet.
    held: Option<(u32, Rule)>,
    /// Rule of the last row emitted.
    emitted: Option<Rule>,
    /// Rule of the last row made (held or emitted).
    last: Option<Rule>,
    /// End of the code covered so far.
    end: u32,
    /// Start of the last span (spans must come sorted).
    prev_start: u32,
}

impl<F: FnMut(UnwindRow) -> Result<(), UnwindError>> Compactor<F> {
    fn new(emit: F) -> Self {
        Compactor {
            emit,
            held: None,
            emitted: None,
            last: None,
            end: 0,
            prev_start: 0,
        }
    }

    fn push(&mut self, pc: u32, r: Rule) -> Result<(), UnwindError> {
        if self.last == Some(r) {
            return Ok(());
        }
        self.last = Some(r);
        if let Some((held_pc, held)) = self.held.take()
            && held_pc != pc
        {
            (self.emit)(row_of(held_pc, held))?;
            self.emitted = Some(held);
        }
        // (A held row at the same address is replaced by this one; the row
        // before it may then have the same rule.)
        if self.emitted != Some(r) {
            self.held = Some((pc, r));
        }
        Ok(())
    }

    /// The next span; [`UnwindError::Unsorted`] when it starts before the
    /// previous one.
    fn span(&mut self, s: Span) -> Result<(), UnwindError> {
        if s.start < self.prev_start {
            return Err(UnwindError::Unsorted);
        }
        self.prev_start = s.start;
        if s.start < self.end {
            // Overlapping FDEs (rare, broken CFI): the first one wins.
            if s.end <= self.end {
                return Ok(());
            }
        } else if s.start > self.end && self.last.is_some() {
            self.push(self.end, GAP)?;
        }
        self.push(s.start.max(self.end), s.rule)?;
        self.end = self.end.max(s.end);
        Ok(())
    }

    /// Closes the table with a gap row after the last span.
    fn finish(mut self) -> Result<(), UnwindError> {
        if self.last.is_some() {
            self.push(self.end, GAP)?;
        }
        if let Some((pc, r)) = self.held.take() {
            (self.emit)(row_of(pc, r))?;
        }
        Ok(())
    }
}

/// What the loaded tables cost, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableStats {
    pub(crate) tables: usize,
    pub(crate) rows_used: u64,
    pub(crate) rows_budget: u64,
}

struct Table {
    start: u32,
    len: u32,
    users: HashSet<u32>,
    /// Interval since which no process maps it (kept a while: short-lived
    /// processes of one program, e.g. compilers, would rebuild it each time).
    idle_since: Option<u64>,
    /// To turn a mapping's file offset into the table's addresses.
    layout: ElfLayout,
}

/// One executable file mapping of a process, as the collector sees it.
pub(crate) struct MappedFile<'a> {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) offset: u64,
    /// Build id, or another stable identity of the file.
    pub(crate) key: &'a str,
    /// Opens the file (only called for a file without a table yet).
    pub(crate) open: &'a dyn Fn() -> Option<File>,
}

/// Outcome of making a table for one file, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejected {
    /// It does not fit in what is left of the budget.
    Budget,
    /// No CFI, unreadable, or addresses beyond 32 bits.
    NoTable,
}

/// The BPF maps of the unwinder and what is in them.
pub(crate) struct Unwinder {
    rows: Array<MapData, PodRow>,
    procs: BpfHashMap<MapData, u32, PodProc>,
    py: BpfHashMap<MapData, u32, PodPy>,
    /// Rows of the array; 0: table unwinding is off.
    capacity: u32,
    /// Free slices of `rows`: start → len.
    free: Vec<(u32, u32)>,
    tables: HashMap<String, Table>,
    /// Files that have no usable table, and the interval they were last
    /// mapped in: not retried for a while.
    none: HashMap<String, u64>,
    /// Push intervals so far (the clock for eviction).
    interval: u64,
    /// pid → table keys it uses.
    procs_keys: HashMap<u32, Vec<String>>,
    rows_used: u64,
    /// Rejections since the last call to `take_rejections`.
    rejected: Vec<Rejected>,
}

/// aya needs to know the row and process types are plain data.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct PodRow(pub(crate) UnwindRow);
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct PodProc(pub(crate) UnwindProc);
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct PodPy(pub(crate) PyProc);

impl Unwinder {
    pub(crate) fn new(
        rows: Array<MapData, PodRow>,
        procs: BpfHashMap<MapData, u32, PodProc>,
        py: BpfHashMap<MapData, u32, PodPy>,
        capacity: u32,
    ) -> Self {
        Unwinder {
            rows,
            procs,
            py,
            capacity,
            free: vec![(0, capacity)],
            tables: HashMap::new(),
            none: HashMap::new(),
            interval: 0,
            procs_keys: HashMap::new(),
            rows_used: 0,
            rejected: Vec::new(),
        }
    }

    pub(crate) fn stats(&self) -> TableStats {
        TableStats {
            tables: self.tables.len(),
            rows_used: self.rows_used,
            rows_budget: u64::from(self.capacity),
        }
    }

    pub(crate) fn take_rejections(&mut self) -> Vec<Rejected> {
        std::mem::take(&mut self.rejected)
    }

    fn alloc(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn release(&mut self, start: u32, len: u32) {
        self.free.push((start, len));
        self.free.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.free.len());
        for &(s, l) in &self.free {
            if let Some(last) = merged.last_mut()
                && last.0 + last.1 == s
            {
                last.1 += l;
                continue;
            }
            merged.push((s, l));
        }
        self.free = merged;
    }

    /// Writes the table of a file into the array: `(first row, rows)`, or
    /// `None` when it does not fit even after evicting every idle table.
    /// Streamed row by row when its FDEs do not overlap (room for an
    /// estimate of its rows is taken first, the rest given back); else
    /// collected and sorted, up to `MAX_CFI_BYTES` of CFI.
    fn load(&mut self, file: &File, layout: &ElfLayout) -> Result<Option<(u32, u32)>, UnwindError> {
        let cfi = cfi_bytes(layout);
        let estimate = (cfi as f64 * ROWS_PER_CFI_BYTE) as u64 + 2;
        if estimate > self.free_rows() {
            return Ok(None);
        }
        let estimate = u32::try_from(estimate).map_err(|_| UnwindError::TooBig)?;
        if cfi <= MAX_STREAMED_CFI_BYTES {
            let Some(start) = self.alloc_evicting(estimate) else {
                return Ok(None);
            };
            let mut n = 0u32;
            let rows = &mut self.rows;
            let streamed = stream_rows(file, layout, &mut |r| {
                if n >= estimate {
                    return Err(UnwindError::OverEstimate);
                }
                rows.set(start + n, PodRow(r), 0)?;
                n += 1;
                Ok(())
            });
            match streamed {
                Ok(()) if n > 0 => {
                    if n < estimate {
                        self.release(start + n, estimate - n);
                    }
                    return Ok(Some((start, n)));
                }
                Ok(()) => {
                    self.release(start, estimate);
                    return Err(UnwindError::NoCfi);
                }
                Err(UnwindError::Unsorted | UnwindError::OverEstimate | UnwindError::NoCfi) => {
                    self.release(start, estimate);
                }
                Err(e) => {
                    self.release(start, estimate);
                    return Err(e);
                }
            }
        }
        if cfi > MAX_CFI_BYTES {
            return Err(UnwindError::TooBig);
        }
        let rows = build_rows(file, layout)?;
        if rows.is_empty() {
            return Err(UnwindError::NoCfi);
        }
        let len = u32::try_from(rows.len()).map_err(|_| UnwindError::TooBig)?;
        let Some(start) = self.alloc_evicting(len) else {
            return Ok(None);
        };
        for (i, r) in (0..).zip(&rows) {
            if let Err(e) = self.rows.set(start + i, PodRow(*r), 0) {
                self.release(start, len);
                return Err(e.into());
            }
        }
        Ok(Some((start, len)))
    }

    /// The table of one file (first row, rows, bias of this mapping),
    /// loading it into the array on first use.
    fn table(&mut self, pid: u32, f: &MappedFile<'_>) -> Option<(u32, u32, u64)> {
        if self.capacity == 0 {
            return None;
        }
        if let Some(t) = self.tables.get_mut(f.key) {
            t.users.insert(pid);
            t.idle_since = None;
            let vaddr = t.layout.mapping_vaddr(f.offset)?;
            return Some((t.start, t.len, f.start.wrapping_sub(vaddr)));
        }
        if let Some(seen) = self.none.get_mut(f.key) {
            *seen = self.interval;
            return None;
        }
        let Some((file, layout)) = (f.open)().and_then(|file| {
            let layout = ElfLayout::read(&file).ok()?;
            layout
                .mapping_vaddr(f.offset)
                .is_some()
                .then_some((file, layout))
        }) else {
            self.reject(f.key, Rejected::NoTable);
            return None;
        };
        let (start, len) = match self.load(&file, &layout) {
            Ok(Some(loaded)) => loaded,
            Ok(None) => {
                tracing::info!(
                    key = f.key,
                    cfi_bytes = cfi_bytes(&layout),
                    "unwind table does not fit in the budget; its code is unwound with frame pointers"
                );
                self.reject(f.key, Rejected::Budget);
                return None;
            }
            Err(e) => {
                tracing::debug!(key = f.key, error = %crate::chain(&e), "no unwind table");
                self.reject(f.key, Rejected::NoTable);
                return None;
            }
        };
        self.rows_used += u64::from(len);
        let vaddr = layout.mapping_vaddr(f.offset)?;
        self.tables.insert(
            f.key.to_owned(),
            Table {
                start,
                len,
                users: HashSet::from([pid]),
                idle_since: None,
                layout,
            },
        );
        Some((start, len, f.start.wrapping_sub(vaddr)))
    }

    /// Gives process `pid` the tables of its executable file mappings
    /// (sorted by start). A process none of whose files has a table gets no
    /// entry: it is unwound with frame pointers.
    pub(crate) fn set_process(&mut self, pid: u32, files: &[MappedFile<'_>]) {
        let mut proc = UnwindProc {
            len: 0,
            reserved: 0,
            maps: [UnwindMapping::default(); UNWIND_MAX_MAPPINGS],
        };
        let mut keys = Vec::new();
        for f in files {
            if proc.len as usize >= UNWIND_MAX_MAPPINGS {
                break;
            }
            let Some((table_start, table_len, bias)) = self.table(pid, f) else {
                keys.push(f.key.to_owned());
                continue;
            };
            keys.push(f.key.to_owned());
            proc.maps[proc.len as usize] = UnwindMapping {
                start: f.start,
                end: f.end,
                bias,
                table_start,
                table_len,
            };
            proc.len += 1;
        }
        let old = self.procs_keys.insert(pid, keys);
        if proc.len == 0 {
            let _ = self.procs.remove(&pid);
        } else if let Err(error) = self.procs.insert(pid, PodProc(proc), 0) {
            tracing::debug!(pid, error = %crate::chain(&error), "adding a process to the unwinder");
        }
        if let Some(old) = old {
            let now: HashSet<&String> = self.procs_keys[&pid].iter().collect();
            let gone: Vec<String> = old.into_iter().filter(|k| !now.contains(k)).collect();
            for k in gone {
                self.drop_user(pid, &k);
            }
        }
    }

    fn drop_user(&mut self, pid: u32, key: &str) {
        if let Some(t) = self.tables.get_mut(key) {
            t.users.remove(&pid);
            if t.users.is_empty() {
                t.idle_since = Some(self.interval);
            }
        }
    }

    fn reject(&mut self, key: &str, why: Rejected) {
        self.rejected.push(why);
        if self.none.len() >= MAX_REJECTED {
            self.none.clear();
        }
        self.none.insert(key.to_owned(), self.interval);
    }

    /// Rows free now plus those of idle tables.
    fn free_rows(&self) -> u64 {
        let idle: u64 = self
            .tables
            .values()
            .filter(|t| t.idle_since.is_some())
            .map(|t| u64::from(t.len))
            .sum();
        u64::from(self.capacity) - self.rows_used + idle
    }

    fn evict(&mut self, key: &str) {
        if let Some(t) = self.tables.remove(key) {
            self.release(t.start, t.len);
            self.rows_used -= u64::from(t.len);
        }
    }

    /// `alloc`, evicting idle tables (longest idle first) until it fits.
    fn alloc_evicting(&mut self, len: u32) -> Option<u32> {
        loop {
            if let Some(s) = self.alloc(len) {
                return Some(s);
            }
            let oldest = self
                .tables
                .iter()
                .filter_map(|(k, t)| Some((t.idle_since?, k.clone())))
                .min()?;
            self.evict(&oldest.1);
        }
    }

    /// Ends a push interval: tables no process has mapped for
    /// `IDLE_INTERVALS` are freed, and files without a table are retried
    /// after as long unmapped.
    pub(crate) fn end_interval(&mut self) {
        self.interval += 1;
        let now = self.interval;
        let stale: Vec<String> = self
            .tables
            .iter()
            .filter(|(_, t)| t.idle_since.is_some_and(|i| now - i > IDLE_INTERVALS))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.evict(&k);
        }
        self.none.retain(|_, seen| now - *seen <= IDLE_INTERVALS);
    }

    /// The kernel's entry for `pid` (tests).
    #[cfg(test)]
    pub(crate) fn kernel_entry(&self, pid: u32) -> Option<UnwindProc> {
        self.procs.get(&pid, 0).ok().map(|p| p.0)
    }

    /// Tells the BPF program where process `pid`'s Python frames are.
    pub(crate) fn set_python(&mut self, pid: u32, p: PyProc) {
        if let Err(error) = self.py.insert(pid, PodPy(p), 0) {
            tracing::debug!(pid, error = %crate::chain(&error), "adding a Python process");
        }
    }

    /// Process `pid` is gone (or exec'd): its entry goes, and the tables
    /// no other process uses are freed.
    pub(crate) fn forget_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
        let _ = self.py.remove(&pid);
        if let Some(keys) = self.procs_keys.remove(&pid) {
            for k in keys {
                self.drop_user(pid, &k);
            }
        }
    }
}

// SAFETY: UnwindRow, UnwindProc and PyProc are repr(C) structs of integers with no
// padding bytes that matter to the kernel (reserved fields are explicit), so
// any bit pattern is valid and they can be copied to and from map values.
#[allow(unsafe_code)]
unsafe impl aya::Pod for PodRow {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for PodProc {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for PodPy {}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, cfa: CfaType, cfa_off: i16) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_off,
            rbp_off: 0,
            cfa_type: cfa as u8,
            rbp_type: RbpType::Same as u8,
            reserved: 0,
        }
    }

    fn span(start: u32, end: u32, cfa: CfaType, off: i16) -> Span {
        Span {
            start,
            end,
            rule: Rule {
                cfa,
                cfa_off: off,
                rbp: RbpType::Same,
                rbp_off: 0,
            },
        }
    }

    #[test]
    fn compaction_merges_equal_neighbours_and_marks_gaps() {
        let rows = compact(vec![
            span(0x1000, 0x1001, CfaType::Rsp, 8),
            span(0x1001, 0x1010, CfaType::Rsp, 16),
            // Next FDE starts with the same rule as the previous row ended.
            span(0x1010, 0x1011, CfaType::Rsp, 16),
            span(0x1011, 0x1020, CfaType::Rsp, 8),
            // A gap from 0x1020 to 0x2000.
            span(0x2000, 0x2010, CfaType::Rbp, 16),
        ])
        .unwrap();
        assert_eq!(
            rows,
            vec![
                row(0x1000, CfaType::Rsp, 8),
                row(0x1001, CfaType::Rsp, 16),
                row(0x1011, CfaType::Rsp, 8),
                row(0x1020, CfaType::None, 0),
                row(0x2000, CfaType::Rbp, 16),
                row(0x2010, CfaType::None, 0),
            ]
        );
    }

    #[test]
    fn plt_expression_is_recognized() {
        let e = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&e), Some(11));
        assert_eq!(plt_threshold(&e[..10]), None);
    }

    /// The table of this very test binary (Rust, with .eh_frame): covers
    /// this function, and its rules are ones the BPF program follows.
    #[test]
    fn table_of_the_test_binary_covers_its_code() {
        let exe = std::env::current_exe().unwrap();
        let file = File::open(&exe).unwrap();
        // A debug test binary is above MAX_CFI_BYTES; the rows are the same.
        let rows = build_rows(&file, &ElfLayout::read(&file).unwrap()).unwrap();
        assert!(rows.len() > 1000, "{} rows", rows.len());
        assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc), "sorted");
        // Our own address, as an ELF virtual address.
        let here = table_of_the_test_binary_covers_its_code as *const () as u64;
        let maps = crate::procfs::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let m = crate::procfs::find_mapping(&maps, here).unwrap();
        let layout = ElfLayout::read(&file).unwrap();
        let vaddr = layout
            .file_offset_to_vaddr(here - m.start + m.offset)
            .unwrap();
        let i = rows.partition_point(|r| u64::from(r.pc) <= vaddr) - 1;
        let r = rows[i];
        assert!(
            r.cfa_type == CfaType::Rsp as u8 || r.cfa_type == CfaType::Rbp as u8,
            "{r:?}"
        );
        let unsupported = rows
            .iter()
            .filter(|r| r.cfa_type == CfaType::Unsupported as u8)
            .count();
        assert!(
            unsupported * 100 < rows.len(),
            "{unsupported} unsupported rows"
        );
    }

    /// libc (no frame pointers): its table has PLT rows and an outermost
    /// frame rule (`clone3`/`_start` mark the return address undefined).
    #[test]
    fn table_of_libc() {
        let maps = crate::procfs::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let libc = maps
            .iter()
            .find_map(|m| match &m.backing {
                crate::procfs::Backing::File { path, .. } if path.contains("libc.so") => {
                    Some(path.clone())
                }
                _ => None,
            })
            .expect("this test links libc");
        let rows = build_table(&File::open(libc).unwrap()).unwrap();
        assert!(rows.len() > 10_000, "{} rows", rows.len());
        assert!(rows.iter().any(|r| r.cfa_type == CfaType::End as u8));
        assert!(rows.iter().any(|r| r.cfa_type == CfaType::Plt as u8));
        assert!(rows.iter().any(|r| r.rbp_type == RbpType::Offset as u8));
    }

    fn streamed(path: &str) -> Result<Vec<UnwindRow>, UnwindError> {
        let file = File::open(path).unwrap();
        let layout = ElfLayout::read(&file).unwrap();
        let mut rows = Vec::new();
        stream_rows(&file, &layout, &mut |r| {
            rows.push(r);
            Ok(())
        })?;
        Ok(rows)
    }

    fn key(r: &UnwindRow) -> (u32, i16, i16, u8, u8) {
        (r.pc, r.cfa_off, r.rbp_off, r.cfa_type, r.rbp_type)
    }

    /// The streamed table (no spans or rows held) is the collected, sorted
    /// one, for libc, Python and this test binary (above `MAX_CFI_BYTES`).
    #[test]
    fn streamed_tables_equal_collected_ones() {
        let exe = std::env::current_exe().unwrap();
        let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
        for path in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            python.to_str().unwrap(),
            exe.to_str().unwrap(),
        ] {
            let file = File::open(path).unwrap();
            let layout = ElfLayout::read(&file).unwrap();
            let collected = build_rows(&file, &layout).unwrap();
            let streamed = streamed(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(collected.len() > 1000, "{path}: {} rows", collected.len());
            assert_eq!(streamed.len(), collected.len(), "{path}");
            assert!(
                streamed.iter().map(key).eq(collected.iter().map(key)),
                "{path}: the rows differ"
            );
            // Few enough rows for the estimate the array slice is taken by.
            let estimate = cfi_bytes(&layout) as f64 * ROWS_PER_CFI_BYTE;
            assert!((streamed.len() as f64) < estimate, "{path}");
        }
    }

    #[test]
    fn compactor_refuses_unsorted_spans() {
        let mut c = Compactor::new(|_| Ok(()));
        c.span(span(0x200, 0x300, CfaType::Rsp, 8)).unwrap();
        assert!(matches!(
            c.span(span(0x100, 0x180, CfaType::Rsp, 8)),
            Err(UnwindError::Unsorted)
        ));
    }
}

#[cfg(test)]
mod probe {
    /// `FATHOM_UNWIND_PROBE=path,path…`: rows, .eh_frame size and build
    /// time of each file's table.
    #[test]
    #[ignore = "probe: prints figures for the files given"]
    fn unwind_table_probe() {
        let paths = std::env::var("FATHOM_UNWIND_PROBE").unwrap_or_default();
        for p in paths.split(',').filter(|p| !p.is_empty()) {
            let f = std::fs::File::open(p).unwrap();
            let layout = super::ElfLayout::read(&f).unwrap();
            let eh = layout.section(".eh_frame").map_or(0, |s| s.size);
            let t0 = std::time::Instant::now();
            let rows = super::build_table(&f).map(|r| r.len());
            println!(
                "{p}: eh_frame {eh} bytes, rows {rows:?}, {:?}",
                t0.elapsed()
            );
        }
    }
}
