//! Reading the images programs hand to the driver: `__fatBinC_Wrapper_t`
//! wrappers, fatbin containers and their entries (PTX text or ELF, plain,
//! LZ4- or zstd-compressed), bare ELF and PTX text. The result is what
//! simgpu needs to serve the image: kernel names, their parameter layouts
//! (where the image says) and global variables.
//!
//! An entry that cannot be read (unknown kind, corrupt compression) is
//! counted and skipped; only its kernels are missing, so one bad entry never
//! fails a whole module or context.

use crate::elf::{self, GlobalVar, KernelParam};
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io::Read;

/// `__fatBinC_Wrapper_t.magic`.
const WRAPPER_MAGIC: u32 = 0x466243B1;
/// Fatbin container magic.
const FATBIN_MAGIC: u32 = 0xBA55ED50;
const ENTRY_PTX: u16 = 1;
const ENTRY_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// Largest decompressed entry accepted (a guard against corrupt sizes).
const MAX_ENTRY: usize = 1 << 30;
/// Size of the fixed part of an entry header.
const ENTRY_HEADER: usize = 64;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Image {
    pub kernels: Vec<String>,
    pub globals: Vec<GlobalVar>,
    /// Parameter layouts by kernel name: every PTX `.entry` whose parameter
    /// list simgpu could read, and ELF kernels with `EIATTR_KPARAM_INFO`.
    pub params: BTreeMap<String, Vec<KernelParam>>,
    /// Entries simgpu could not read.
    pub unreadable: usize,
}

impl Image {
    fn merge(&mut self, other: Image) {
        for k in other.kernels {
            if !self.kernels.contains(&k) {
                self.kernels.push(k);
            }
        }
        for g in other.globals {
            if !self.globals.iter().any(|x| x.name == g.name) {
                self.globals.push(g);
            }
        }
        for (k, p) in other.params {
            self.params.entry(k).or_insert(p);
        }
        self.unreadable += other.unreadable;
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Every `.entry NAME` of a PTX text.
pub(crate) fn ptx_entries(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + 6..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_$.".contains(*c))
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// PTX text without its `//` and `/* */` comments (each replaced by a space).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        let (at, end) = match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => (l, rest[l..].find('\n').map(|e| l + e)),
            (_, Some(b)) => (b, rest[b + 2..].find("*/").map(|e| b + 2 + e + 2)),
            _ => break,
        };
        out.push_str(&rest[..at]);
        out.push(' ');
        match end {
            Some(end) => rest = &rest[end..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// Bytes of one kernel parameter type: the fundamental types, packed
/// half pairs and the opaque 64-bit handle types.
fn ptx_param_type_size(ty: &str) -> Option<usize> {
    match ty {
        "f16" | "bf16" => Some(2),
        "f16x2" | "bf16x2" => Some(4),
        "b128" => Some(16),
        "texref" | "samplerref" | "surfref" => Some(8),
        _ => ptx_type_size(&format!(".{ty}")),
    }
}

/// Layout of one `.param` declaration of a kernel's parameter list (`.param
/// .u64 p`, `.param .align 8 .b8 s[16]`, `.param .u64 .ptr.global.align 16
/// q`): (alignment, size).
fn ptx_param(decl: &str) -> Option<(usize, usize)> {
    // Directives may be glued together (`.ptr.global.align`): split them,
    // and keep an array's `[N]` as a word of its own.
    let spaced = decl.replace('.', " .").replace('[', " [");
    let mut words = spaced.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    let (mut align, mut elem, mut count, mut lanes) = (None, None, 1, 1);
    let mut pointer = false;
    let mut named = false;
    while let Some(w) = words.next() {
        match w {
            ".align" => {
                let n: usize = words.next()?.parse().ok()?;
                // After `.ptr`, `.align` is the pointee's alignment.
                if !pointer {
                    align = Some(n);
                }
            }
            ".ptr" => pointer = true,
            ".global" | ".const" | ".local" | ".shared" => {}
            ".v2" => lanes = 2,
            ".v4" => lanes = 4,
            _ if w.starts_with('[') => {
                count = w
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse()
                    .ok()?;
            }
            _ if w.starts_with('.') && elem.is_none() => {
                elem = Some(ptx_param_type_size(&w[1..])?);
            }
            _ if !w.starts_with('.') && !named => named = true,
            _ => return None,
        }
    }
    let elem = elem? * lanes;
    let align = align.unwrap_or(elem);
    (named && align.is_power_of_two()).then_some((align, elem * count))
}

/// The parameter layout of every `.entry` of a PTX text whose parameter
/// list reads cleanly: offsets follow each parameter's alignment, as the
/// driver lays out the parameter buffer.
pub(crate) fn ptx_params(text: &str) -> BTreeMap<String, Vec<KernelParam>> {
    let text = strip_comments(text);
    let mut out = BTreeMap::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + 6..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let body = rest.trim_start();
        let name: String = body
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_$.".contains(*c))
            .collect();
        let after = body[name.len()..].trim_start();
        let list = match after.strip_prefix('(') {
            Some(l) => match l.find(')') {
                Some(end) => &l[..end],
                None => continue,
            },
            None => "",
        };
        let mut params = Vec::new();
        let mut cursor = 0usize;
        let mut readable = true;
        for decl in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let Some((align, size)) = ptx_param(decl) else {
                readable = false;
                break;
            };
            let offset = cursor.next_multiple_of(align);
            params.push(KernelParam { offset, size });
            cursor = offset + size;
        }
        if readable && !name.is_empty() {
            out.entry(name).or_insert(params);
        }
    }
    out
}

/// Bytes per element of a PTX fundamental type (`.b8`, `.u32`, `.f64`, …).
fn ptx_type_size(ty: &str) -> Option<usize> {
    let bits: usize = ty.strip_prefix('.')?.get(1..)?.parse().ok()?;
    matches!(ty.as_bytes().get(1), Some(b'b' | b'u' | b's' | b'f'))
        .then_some(bits / 8)
        .filter(|&n| [1, 2, 4, 8].contains(&n))
}

/// One PTX initialiser value as `size` little-endian bytes.
fn ptx_value(text: &str, ty: &str, size: usize) -> Option<Vec<u8>> {
    let t = text.trim();
    let bits: u64 = if ty.starts_with(".f") && !t.starts_with("0f") && !t.starts_with("0d") {
        let v: f64 = t.parse().ok()?;
        if size == 4 {
            (v as f32).to_bits() as u64
        } else {
            v.to_bits()
        }
    } else if let Some(h) = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .or_else(|| t.strip_prefix("0f"))
        .or_else(|| t.strip_prefix("0d"))
    {
        u64::from_str_radix(h.trim_end_matches(['U', 'u']), 16).ok()?
    } else {
        t.trim_end_matches(['U', 'u']).parse::<i64>().ok()? as u64
    };
    Some(bits.to_le_bytes()[..size].to_vec())
}

/// Device variables a PTX text defines in the global state space, e.g.
/// `.visible .global .align 4 .b8 table[16] = {1, 2, …};` (size and initial
/// bytes; uninitialised ones are zero).
pub(crate) fn ptx_globals(text: &str) -> Vec<GlobalVar> {
    let mut out: Vec<GlobalVar> = Vec::new();
    for statement in text.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == ".global") else {
            continue;
        };
        if words[..at].contains(&".extern") {
            continue;
        }
        let mut rest = words[at + 1..].iter().copied();
        let mut ty = None;
        let mut declarator = None;
        for w in rest.by_ref() {
            if w == ".align" || w.parse::<usize>().is_ok() || w.starts_with(".v") {
                continue;
            }
            if ty.is_none() && ptx_type_size(w).is_some() {
                ty = Some(w);
                continue;
            }
            declarator = Some(w);
            break;
        }
        let (Some(ty), Some(decl)) = (ty, declarator) else {
            continue;
        };
        let elem = ptx_type_size(ty).unwrap_or(1);
        let decl = decl.trim_end_matches('=');
        let (name, count) = match decl.split_once('[') {
            Some((n, c)) => (n, c.trim_end_matches(']').parse::<usize>().ok()),
            None => (decl, Some(1)),
        };
        let init_text = statement.split_once('=').map(|(_, v)| v.trim());
        let values: Vec<&str> = match init_text {
            Some(v) => v
                .trim_start_matches('{')
                .trim_end_matches('}')
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .collect(),
            None => Vec::new(),
        };
        let count = count.unwrap_or(values.len()).max(1);
        let size = count * elem;
        if name.is_empty() || size > MAX_ENTRY || out.iter().any(|g| g.name == name) {
            continue;
        }
        let mut init = Vec::with_capacity(size);
        for v in values.iter().take(count) {
            match ptx_value(v, ty, elem) {
                Some(bytes) => init.extend(bytes),
                None => break,
            }
        }
        init.resize(size, 0);
        out.push(GlobalVar {
            name: name.to_string(),
            size,
            init,
        });
    }
    out
}

fn is_ptx(text: &str) -> bool {
    text.contains(".version") || text.contains(".entry")
}

fn ptx_image(text: &[u8]) -> Option<Image> {
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).ok()?;
    is_ptx(text).then(|| Image {
        kernels: ptx_entries(text),
        globals: ptx_globals(text),
        params: ptx_params(text),
        unreadable: 0,
    })
}

fn elf_image(bytes: &[u8]) -> Option<Image> {
    let s = elf::symbols(bytes)?;
    Some(Image {
        kernels: s.kernels,
        globals: s.globals,
        params: s.params,
        unreadable: 0,
    })
}

/// The payload of one entry, decompressed when its flags say so.
fn payload(entry: &[u8], header_size: usize, stored: usize) -> Option<Vec<u8>> {
    let flags = u64_at(entry, 40)?;
    let data = entry.get(header_size..header_size.checked_add(stored)?)?;
    let expected = u64_at(entry, 56).unwrap_or(0) as usize;
    if flags & FLAG_LZ4 != 0 {
        if expected == 0 || expected > MAX_ENTRY {
            return None;
        }
        lz4_flex::block::decompress(data, expected).ok()
    } else if flags & FLAG_ZSTD != 0 {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(data).ok()?;
        let mut out = Vec::with_capacity(expected.min(MAX_ENTRY));
        decoder
            .by_ref()
            .take(MAX_ENTRY as u64)
            .read_to_end(&mut out)
            .ok()?;
        Some(out)
    } else {
        Some(data.to_vec())
    }
}

/// One entry of a container, located but not yet read.
struct EntryRef<'a> {
    kind: u16,
    /// Target compute capability ×10 (90 for sm_90).
    sm: u32,
    header: &'a [u8],
    header_size: usize,
    stored: usize,
}

/// The compute capability simgpu's devices report (9.0), ×10.
const DEVICE_SM: u32 = 90;

/// The entries a driver would use on a 9.0 device: SASS (ELF) built for
/// 9.x, else the newest PTX not newer than 9.0, else (nothing compatible)
/// every entry, so kernel names are still known. Real containers hold the
/// same kernels in every entry, once per target; reading only the chosen
/// ones keeps loading fast (PyTorch ships thousands of entries).
fn chosen<'a, 'b>(entries: &'b [EntryRef<'a>]) -> Vec<&'b EntryRef<'a>> {
    let sass: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == ENTRY_ELF && e.sm / 10 == DEVICE_SM / 10 && e.sm <= DEVICE_SM)
        .collect();
    if !sass.is_empty() {
        return sass;
    }
    let newest_ptx = entries
        .iter()
        .filter(|e| e.kind == ENTRY_PTX && e.sm <= DEVICE_SM)
        .map(|e| e.sm)
        .max();
    if let Some(sm) = newest_ptx {
        return entries
            .iter()
            .filter(|e| e.kind == ENTRY_PTX && e.sm == sm)
            .collect();
    }
    entries.iter().collect()
}

/// The chosen entries of one fatbin container (`b` starts at its header).
fn container(b: &[u8]) -> Option<Image> {
    if u32_at(b, 0)? != FATBIN_MAGIC {
        return None;
    }
    let header_size = u16_at(b, 6)? as usize;
    let files_size = u64_at(b, 8)? as usize;
    let mut rest = b.get(header_size..header_size.checked_add(files_size)?)?;
    let mut image = Image::default();
    let mut entries = Vec::new();
    while rest.len() >= ENTRY_HEADER {
        let kind = u16_at(rest, 0)?;
        let entry_header = u32_at(rest, 4)? as usize;
        let payload_size = u32_at(rest, 8)? as usize;
        let compressed_size = u32_at(rest, 16)? as usize;
        let flags = u64_at(rest, 40)?;
        let stored = if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
            compressed_size
        } else {
            payload_size
        };
        let step = entry_header.checked_add(payload_size.max(compressed_size))?;
        if entry_header < ENTRY_HEADER || step > rest.len() {
            image.unreadable += 1;
            break;
        }
        if kind == ENTRY_ELF || kind == ENTRY_PTX {
            entries.push(EntryRef {
                kind,
                sm: u32_at(rest, 28)?,
                header: &rest[..step],
                header_size: entry_header,
                stored,
            });
        } else {
            image.unreadable += 1;
        }
        rest = &rest[step..];
    }
    for e in chosen(&entries) {
        let read = payload(e.header, e.header_size, e.stored).and_then(|data| match e.kind {
            ENTRY_ELF => elf_image(&data),
            _ => ptx_image(&data),
        });
        match read {
            Some(entry) => image.merge(entry),
            None => image.unreadable += 1,
        }
    }
    Some(image)
}

/// Reads an image held in memory: a fatbin container, an ELF or PTX text.
/// `None` when it is none of them.
pub(crate) fn from_bytes(b: &[u8]) -> Option<Image> {
    if u32_at(b, 0) == Some(FATBIN_MAGIC) {
        container(b)
    } else if b.starts_with(b"\x7fELF") {
        elf_image(b)
    } else {
        ptx_image(b)
    }
}

/// Reads an image a client passed by pointer: a `__fatBinC_Wrapper_t`, a
/// fatbin container, an ELF or NUL-terminated PTX text. `None` when it is
/// none of them.
///
/// # Safety
/// `p` must point to an image as the CUDA driver API defines it: the
/// lengths this reads come from the image's own headers.
pub(crate) unsafe fn from_ptr(p: *const u8) -> Option<Image> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every image starts with at least 8 readable bytes (wrapper and
    // container headers are 16, ELF headers 64, PTX has ".version").
    let head = unsafe { std::slice::from_raw_parts(p, 8) };
    match u32_at(head, 0)? {
        WRAPPER_MAGIC => {
            // SAFETY: a wrapper is {u32 magic, u32 version, ptr data, ptr list}.
            let (version, data, list) = unsafe {
                (
                    p.add(4).cast::<u32>().read_unaligned(),
                    p.add(8).cast::<*const u8>().read_unaligned(),
                    p.add(16).cast::<*const *const u8>().read_unaligned(),
                )
            };
            // SAFETY: the wrapper's data is a fatbin container.
            let mut image = unsafe { from_ptr(data) }?;
            if version == 2 && !list.is_null() {
                // Version 2 also lists prelinked containers, NULL-terminated.
                for i in 0.. {
                    // SAFETY: the list is NULL-terminated.
                    let item = unsafe { list.add(i).read_unaligned() };
                    if item.is_null() {
                        break;
                    }
                    // SAFETY: each item is a fatbin container.
                    if let Some(more) = unsafe { from_ptr(item) } {
                        image.merge(more);
                    }
                }
            }
            Some(image)
        }
        FATBIN_MAGIC => {
            // SAFETY: a container header is 16 bytes.
            let header = unsafe { std::slice::from_raw_parts(p, 16) };
            let len = u16_at(header, 6)? as usize + u64_at(header, 8)? as usize;
            // SAFETY: the container is header plus `files_size` bytes.
            container(unsafe { std::slice::from_raw_parts(p, len) })
        }
        _ if head.starts_with(b"\x7fELF") => {
            // SAFETY: an ELF header is 64 bytes.
            let header = unsafe { std::slice::from_raw_parts(p, 64) };
            let len = elf::image_len(header)?;
            // SAFETY: the image spans its headers' tables.
            elf_image(unsafe { std::slice::from_raw_parts(p, len) })
        }
        _ => {
            // SAFETY: otherwise the image is NUL-terminated PTX text.
            let text = unsafe { CStr::from_ptr(p.cast()) };
            ptx_image(text.to_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_are_found() {
        let text = ".version 8.0\n.visible .entry add(\n) {}\n.entry  mul_2(){}";
        assert_eq!(ptx_entries(text), ["add", "mul_2"]);
    }

    fn entry(kind: u16, flags: u64, stored: &[u8], plain_len: usize) -> Vec<u8> {
        entry_for(kind, 0, flags, stored, plain_len)
    }

    fn entry_for(kind: u16, sm: u32, flags: u64, stored: &[u8], plain_len: usize) -> Vec<u8> {
        let mut e = vec![0u8; ENTRY_HEADER];
        e[28..32].copy_from_slice(&sm.to_le_bytes());
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[2..4].copy_from_slice(&0x101u16.to_le_bytes());
        e[4..8].copy_from_slice(&(ENTRY_HEADER as u32).to_le_bytes());
        let compressed = flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
        let payload = if compressed { 0 } else { stored.len() };
        e[8..12].copy_from_slice(&(payload as u32).to_le_bytes());
        let csize = if compressed { stored.len() } else { 0 };
        e[16..20].copy_from_slice(&(csize as u32).to_le_bytes());
        e[40..48].copy_from_slice(&flags.to_le_bytes());
        e[56..64].copy_from_slice(&(plain_len as u64).to_le_bytes());
        e.extend_from_slice(stored);
        e
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut b = Vec::new();
        b.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
        b
    }

    #[test]
    fn compressed_ptx_entries_are_read_and_bad_ones_skipped() {
        let ptx = b".version 8.0\n.entry lz4_kernel(){}\0".to_vec();
        let lz4 = lz4_flex::block::compress(&ptx);
        let ptx2 = b".version 8.0\n.entry zstd_kernel(){}\0".to_vec();
        let zstd = ruzstd::encoding::compress_to_vec(
            &ptx2[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let bad = vec![0xffu8; 40];
        let image = from_bytes(&fatbin(&[
            entry(ENTRY_PTX, FLAG_LZ4, &lz4, ptx.len()),
            entry(ENTRY_PTX, FLAG_ZSTD, &zstd, ptx2.len()),
            entry(ENTRY_PTX, FLAG_ZSTD, &bad, 100),
            entry(7, 0, b"??", 2),
        ]))
        .expect("a container");
        assert_eq!(image.kernels, ["lz4_kernel", "zstd_kernel"]);
        assert_eq!(image.unreadable, 2);
    }

    #[test]
    fn the_entries_a_9_0_device_uses_are_read() {
        let ptx = |name: &str| format!(".version 8.0\n.entry {name}(){{}}\0").into_bytes();
        let both = |sm_ptx: u32, sm_other: u32| {
            let a = ptx("for_a");
            let b = ptx("for_b");
            from_bytes(&fatbin(&[
                entry_for(ENTRY_PTX, sm_ptx, 0, &a, a.len()),
                entry_for(ENTRY_PTX, sm_other, 0, &b, b.len()),
            ]))
            .expect("a container")
            .kernels
        };
        // The newest PTX not newer than the device.
        assert_eq!(both(80, 90), ["for_b"]);
        assert_eq!(both(90, 100), ["for_a"]);
        // Nothing compatible: every entry, so names are still known.
        assert_eq!(both(100, 120), ["for_a", "for_b"]);
    }

    #[test]
    fn ptx_parameters_follow_their_alignment() {
        let text = ".version 8.0\n\
            .visible .entry k(.param .u32 a, // a count\n\
              .param .align 16 .b8 s[20], /* a struct */ .param .f64 d,\n\
              .param .v2 .u32 v, .param .bf16 h, .param .u64 .ptr .shared .align 4 p) {}\n\
            .entry bare {}\n\
            .entry bad(.param .u32 a, .param .b8 b[n]) {}\n\
            .entry glued(.param .align 4 .b8 g[3],.param .u16 x){}";
        let p = ptx_params(text);
        let layout =
            |k: &str| -> Vec<(usize, usize)> { p[k].iter().map(|x| (x.offset, x.size)).collect() };
        assert_eq!(
            layout("k"),
            [(0, 4), (16, 20), (40, 8), (48, 8), (56, 2), (64, 8)]
        );
        assert_eq!(layout("bare"), []);
        assert_eq!(layout("glued"), [(0, 3), (4, 2)]);
        assert!(!p.contains_key("bad"), "an unreadable list is no layout");
    }

    #[test]
    fn comments_are_stripped() {
        assert_eq!(strip_comments("a // b\nc /* d\ne */ f"), "a  \nc   f");
        assert_eq!(strip_comments("x /* never closed"), "x  ");
    }

    #[test]
    fn ptx_globals_have_sizes_and_initial_bytes() {
        let text = ".version 8.0\n.visible .global .align 1 .b8 table[4] = {1, 2, 0x10, 255};\n\
                    .global .align 4 .u32 counter;\n.global .f32 half = 0.5;\n\
                    .extern .global .b8 elsewhere[];\n.visible .global .align 8 .u64 wide[2] = {7};";
        let g = ptx_globals(text);
        let find = |n: &str| g.iter().find(|x| x.name == n).cloned();
        assert_eq!(find("table").map(|x| x.init), Some(vec![1, 2, 16, 255]));
        assert_eq!(
            find("counter").map(|x| (x.size, x.init)),
            Some((4, vec![0; 4]))
        );
        assert_eq!(
            find("half").map(|x| x.init),
            Some(0.5f32.to_le_bytes().to_vec())
        );
        let wide = find("wide").expect("wide");
        assert_eq!((wide.size, wide.init[0], wide.init[8]), (16, 7, 0));
        assert!(find("elsewhere").is_none());
    }
}
