//! What simgpu needs from a CUDA ELF (cubin): kernel names and global
//! variables (name, size, initial bytes) from its symbol table, and each
//! kernel's parameter layout from its `.nv.info.<kernel>` section. Nothing
//! is executed: simgpu computes no kernel results.

use std::collections::BTreeMap;

/// One device variable of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GlobalVar {
    pub name: String,
    pub size: usize,
    /// Initial contents (zeros for `.nv.global`, which is NOBITS).
    pub init: Vec<u8>,
}

/// Where one kernel parameter lies in the parameter buffer (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelParam {
    pub offset: usize,
    pub size: usize,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Symbols {
    pub kernels: Vec<String>,
    pub globals: Vec<GlobalVar>,
    /// Parameter layouts, for the kernels whose `.nv.info.<kernel>` says.
    pub params: BTreeMap<String, Vec<KernelParam>>,
}

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
/// `SHT_CUDA_INFO` (`SHT_LOPROC`): the `.nv.info*` sections.
const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// `.nv.info` record formats: `EIFMT_SVAL` records carry a u16 length and
/// that many bytes; every other format is the 4-byte header alone.
const EIFMT_SVAL: u8 = 0x04;
/// `EIATTR_KPARAM_INFO`: one parameter (u32 index, u16 ordinal, u16 offset,
/// u32 whose top 14 bits are the size).
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// `EIATTR_CBANK_PARAM_SIZE`: the parameter buffer's total size (u16).
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
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
    name: u32,
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
                name: u32_at(b, h)?,
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
    let names = u16_at(b, 0x3e)
        .and_then(|i| secs.get(i as usize))
        .and_then(|s| b.get(s.offset..s.offset.checked_add(s.size)?));
    for s in secs.iter().filter(|s| s.kind == SHT_CUDA_INFO) {
        let Some(name) = names.and_then(|n| name_at(n, s.name as usize)) else {
            continue;
        };
        let Some(kernel) = name.strip_prefix(".nv.info.") else {
            continue;
        };
        let records = b.get(s.offset..s.offset.checked_add(s.size)?)?;
        if let Some(params) = kparam_info(records) {
            out.params.insert(kernel.to_string(), params);
        }
    }
    Some(out)
}

/// A kernel's parameters from the records of its `.nv.info.<kernel>`
/// section, in ordinal order; `None` when the records do not describe them
/// (no `EIATTR_KPARAM_INFO` although the parameter buffer is not empty, as
/// with the newer `EIATTR_KPARAM_INFO_V2`, which simgpu does not read; or
/// ordinals with gaps).
fn kparam_info(mut records: &[u8]) -> Option<Vec<KernelParam>> {
    let mut params: Vec<(u16, KernelParam)> = Vec::new();
    let mut buffer_size = 0;
    while records.len() >= 4 {
        let (format, attr) = (records[0], records[1]);
        let value = u16_at(records, 2)?;
        let len = if format == EIFMT_SVAL {
            value as usize
        } else {
            0
        };
        let data = records.get(4..4 + len)?;
        match attr {
            EIATTR_KPARAM_INFO if format == EIFMT_SVAL && len >= 12 => {
                let ordinal = u16_at(data, 4)?;
                let offset = u16_at(data, 6)? as usize;
                let size = (u32_at(data, 8)? >> 18) as usize;
                params.push((ordinal, KernelParam { offset, size }));
            }
            EIATTR_CBANK_PARAM_SIZE => buffer_size = value,
            _ => {}
        }
        records = &records[4 + len..];
    }
    if params.is_empty() && buffer_size > 0 {
        return None;
    }
    params.sort_by_key(|p| p.0);
    // Ordinals must be 0, 1, 2, …: anything else is not a layout to trust.
    if params.iter().enumerate().any(|(i, p)| p.0 as usize != i) {
        return None;
    }
    Some(params.into_iter().map(|p| p.1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(format: u8, attr: u8, value: u16, data: &[u8]) -> Vec<u8> {
        let mut r = vec![format, attr];
        r.extend_from_slice(&value.to_le_bytes());
        r.extend_from_slice(data);
        r
    }

    fn kparam(ordinal: u16, offset: u16, size: u32) -> Vec<u8> {
        let mut d = 0u32.to_le_bytes().to_vec();
        d.extend_from_slice(&ordinal.to_le_bytes());
        d.extend_from_slice(&offset.to_le_bytes());
        d.extend_from_slice(&((size << 18) | 0x1f000).to_le_bytes());
        record(EIFMT_SVAL, EIATTR_KPARAM_INFO, 12, &d)
    }

    #[test]
    fn kparam_records_give_the_layout_in_ordinal_order() {
        let records = [
            record(0x04, 0x37, 4, &[0x80, 0, 0, 0]),
            record(0x03, EIATTR_CBANK_PARAM_SIZE, 24, &[]),
            kparam(2, 16, 8),
            kparam(1, 8, 4),
            kparam(0, 0, 8),
            record(0x01, 0x50, 0, &[]),
        ]
        .concat();
        let p = kparam_info(&records).expect("a layout");
        let got: Vec<(usize, usize)> = p.iter().map(|x| (x.offset, x.size)).collect();
        assert_eq!(got, [(0, 8), (8, 4), (16, 8)]);
    }

    #[test]
    fn unknown_layouts_are_not_guessed() {
        // Parameters exist (a buffer of 16 bytes) but no record describes them.
        let v2_only = [
            record(0x03, EIATTR_CBANK_PARAM_SIZE, 16, &[]),
            record(0x04, 0x45, 4, &[0; 4]),
        ]
        .concat();
        assert_eq!(kparam_info(&v2_only), None);
        // A gap in the ordinals.
        assert_eq!(
            kparam_info(&[kparam(0, 0, 8), kparam(2, 8, 8)].concat()),
            None
        );
        // No parameters at all.
        assert_eq!(
            kparam_info(&record(0x03, EIATTR_CBANK_PARAM_SIZE, 0, &[])),
            Some(vec![])
        );
    }
}
