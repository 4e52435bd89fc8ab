//! What simgpu needs from a CUDA ELF (cubin): kernel names and global
//! variables (name, size, initial bytes) from its symbol table. Nothing is
//! executed: simgpu computes no kernel results.

/// One device variable of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GlobalVar {
    pub name: String,
    pub size: usize,
    /// Initial contents (zeros for `.nv.global`, which is NOBITS).
    pub init: Vec<u8>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Symbols {
    pub kernels: Vec<String>,
    pub globals: Vec<GlobalVar>,
}

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
/// `st_other` bit that marks a kernel entry point in a cubin.
const STO_CUDA_ENTRY: u8 = 0x10;
/// Largest global variable read from an image (a guard against corrupt sizes).
const MAX_GLOBAL: usize = 1 << 30;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
}

fn sections(b: &[u8]) -> Option<Vec<Section>> {
    let shoff = u64_at(b, 0x28)? as usize;
    let entsize = u16_at(b, 0x3a)? as usize;
    let count = u16_at(b, 0x3c)? as usize;
    if entsize < 64 {
        return None;
    }
    (0..count)
        .map(|i| {
            let h = shoff.checked_add(i.checked_mul(entsize)?)?;
            Some(Section {
                kind: u32_at(b, h + 4)?,
                offset: u64_at(b, h + 0x18)? as usize,
                size: u64_at(b, h + 0x20)? as usize,
                link: u32_at(b, h + 0x28)?,
            })
        })
        .collect()
}

fn name_at(strtab: &[u8], at: usize) -> Option<String> {
    let rest = strtab.get(at..)?;
    let end = rest.iter().position(|&c| c == 0)?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// Size in bytes of the ELF image that starts at `b` (as far as its headers
/// say: the end of the section and program header tables and of every
/// section), or `None` when `b` is not a 64-bit little-endian ELF header.
pub(crate) fn image_len(header: &[u8]) -> Option<usize> {
    if !header.starts_with(b"\x7fELF") || header.get(4) != Some(&2) || header.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(header, 0x28)? as usize;
    let shent = u16_at(header, 0x3a)? as usize;
    let shnum = u16_at(header, 0x3c)? as usize;
    let phoff = u64_at(header, 0x20)? as usize;
    let phent = u16_at(header, 0x36)? as usize;
    let phnum = u16_at(header, 0x38)? as usize;
    Some((shoff + shent * shnum).max(phoff + phent * phnum).max(64))
}

/// Kernels and globals of a 64-bit little-endian ELF; `None` when the bytes
/// are not one or its tables are out of bounds.
pub(crate) fn symbols(b: &[u8]) -> Option<Symbols> {
    image_len(b)?;
    let secs = sections(b)?;
    let mut out = Symbols::default();
    for symtab in secs.iter().filter(|s| s.kind == SHT_SYMTAB) {
        let strtab = secs.get(symtab.link as usize)?;
        let strings = b.get(strtab.offset..strtab.offset.checked_add(strtab.size)?)?;
        let table = b.get(symtab.offset..symtab.offset.checked_add(symtab.size)?)?;
        for sym in table.chunks_exact(24) {
            let info = sym[4];
            let other = sym[5];
            let shndx = u16_at(sym, 6)? as usize;
            let value = u64_at(sym, 8)? as usize;
            let size = u64_at(sym, 16)? as usize;
            let Some(name) = name_at(strings, u32_at(sym, 0)? as usize) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            match info & 0xf {
                STT_FUNC if other & STO_CUDA_ENTRY != 0 && !out.kernels.contains(&name) => {
                    out.kernels.push(name);
                }
                STT_OBJECT
                    if size > 0
                        && size <= MAX_GLOBAL
                        && !out.globals.iter().any(|g| g.name == name) =>
                {
                    let init = match secs.get(shndx) {
                        Some(s) if s.kind != SHT_NOBITS => {
                            let start = s.offset.checked_add(value)?;
                            b.get(start..start.checked_add(size)?)
                                .map(<[u8]>::to_vec)
                                .unwrap_or_else(|| vec![0; size])
                        }
                        _ => vec![0; size],
                    };
                    out.globals.push(GlobalVar { name, size, init });
                }
                _ => {}
            }
        }
    }
    Some(out)
}
