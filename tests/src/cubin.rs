//! Hand-built device images for tests that have no nvcc: a minimal CUDA ELF
//! (cubin) whose symbol table names kernels and initialised globals, with
//! optional `.nv.info.<kernel>` parameter records, and
//! fatbin containers holding ELF or PTX entries, optionally LZ4- or
//! zstd-compressed. The code inside is never run (simgpu only times
//! kernels), so each kernel's text is a few placeholder bytes.

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

/// One fatbin entry.
pub enum Entry {
    Elf(Vec<u8>, Compression),
    Ptx(String, Compression),
}

const EM_CUDA: u16 = 190;
const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STO_CUDA_ENTRY: u8 = 0x10;
/// `SHT_CUDA_INFO`: the `.nv.info*` sections.
const SHT_CUDA_INFO: u32 = 0x7000_0000;

struct Section {
    name: &'static str,
    kind: u32,
    link: u32,
    info: u32,
    entsize: u64,
    data: Vec<u8>,
}

fn strtab(names: &[&str]) -> (Vec<u8>, Vec<u32>) {
    let mut table = vec![0u8];
    let mut offsets = Vec::new();
    for n in names {
        offsets.push(table.len() as u32);
        table.extend_from_slice(n.as_bytes());
        table.push(0);
    }
    (table, offsets)
}

fn symbol(name: u32, kind: u8, other: u8, shndx: u16, value: u64, size: u64) -> Vec<u8> {
    let mut s = Vec::with_capacity(24);
    s.extend_from_slice(&name.to_le_bytes());
    s.push(STB_GLOBAL << 4 | kind);
    s.push(other);
    s.extend_from_slice(&shndx.to_le_bytes());
    s.extend_from_slice(&value.to_le_bytes());
    s.extend_from_slice(&size.to_le_bytes());
    s
}

/// A kernel of [`cubin_with_params`]: its name, and the `(offset, size)` of
/// each parameter its `.nv.info.<kernel>` section lists (no section: `None`).
pub type KernelDecl<'a> = (&'a str, Option<&'a [(u16, u32)]>);

/// A cubin for compute capability `sm` with entry points `kernels` and
/// initialised globals `(name, bytes)`.
pub fn cubin(sm: u32, kernels: &[&str], globals: &[(&str, &[u8])]) -> Vec<u8> {
    let plain: Vec<KernelDecl> = kernels.iter().map(|k| (*k, None)).collect();
    cubin_with_params(sm, &plain, globals)
}

/// The records of a `.nv.info.<kernel>` section as ptxas writes them for
/// parameters `(offset, size)`, in order: `EIATTR_CBANK_PARAM_SIZE`
/// (EIFMT_HVAL) and one `EIATTR_KPARAM_INFO` (EIFMT_SVAL, 12 bytes: index,
/// ordinal, offset, and a word whose top 14 bits are the size, constant bank
/// 0x1f) per parameter, last parameter first.
pub fn nv_info_params(params: &[(u16, u32)]) -> Vec<u8> {
    let total = params.iter().map(|&(o, s)| o as u32 + s).max().unwrap_or(0);
    let mut r = vec![0x03, 0x19];
    r.extend_from_slice(&(total as u16).to_le_bytes());
    for (ordinal, &(offset, size)) in params.iter().enumerate().rev() {
        r.extend_from_slice(&[0x04, 0x17]);
        r.extend_from_slice(&12u16.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&(ordinal as u16).to_le_bytes());
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&((size << 18) | (0x1f << 12)).to_le_bytes());
    }
    r
}

/// As [`cubin`], each kernel with the parameters `(offset, size)` its
/// `.nv.info.<kernel>` section lists (no such section for `None`).
pub fn cubin_with_params(sm: u32, kernels: &[KernelDecl], globals: &[(&str, &[u8])]) -> Vec<u8> {
    // Sections: 0 null, 1 .shstrtab, 2 .strtab, 3 .symtab, 4 .nv.global.init,
    // then one .text.<kernel> per kernel, then the .nv.info.<kernel> ones.
    let infos: Vec<(&str, &[(u16, u32)])> = kernels
        .iter()
        .filter_map(|(k, p)| p.map(|p| (*k, p)))
        .collect();
    let kernels: Vec<&str> = kernels.iter().map(|k| k.0).collect();
    let kernels = kernels.as_slice();
    let mut names: Vec<&str> = kernels.to_vec();
    names.extend(globals.iter().map(|g| g.0));
    let (strings, name_at) = strtab(&names);
    let mut init = Vec::new();
    let mut symtab = vec![0u8; 24];
    for (i, _) in kernels.iter().enumerate() {
        symtab.extend(symbol(
            name_at[i],
            STT_FUNC,
            STO_CUDA_ENTRY,
            5 + i as u16,
            0,
            16,
        ));
    }
    for (j, (_, bytes)) in globals.iter().enumerate() {
        let at = init.len() as u64;
        init.extend_from_slice(bytes);
        init.resize(init.len().next_multiple_of(8), 0);
        let name = name_at[kernels.len() + j];
        symtab.extend(symbol(name, STT_OBJECT, 0, 4, at, bytes.len() as u64));
    }
    let section_names: Vec<String> = [".shstrtab", ".strtab", ".symtab", ".nv.global.init"]
        .iter()
        .map(|s| s.to_string())
        .chain(kernels.iter().map(|k| format!(".text.{k}")))
        .chain(infos.iter().map(|(k, _)| format!(".nv.info.{k}")))
        .collect();
    let refs: Vec<&str> = section_names.iter().map(String::as_str).collect();
    let (shstrtab, sh_name) = strtab(&refs);
    let mut sections = vec![
        Section {
            name: "",
            kind: SHT_STRTAB,
            link: 0,
            info: 0,
            entsize: 0,
            data: shstrtab,
        },
        Section {
            name: "",
            kind: SHT_STRTAB,
            link: 0,
            info: 0,
            entsize: 0,
            data: strings,
        },
        Section {
            name: "",
            kind: SHT_SYMTAB,
            link: 2,
            info: 1,
            entsize: 24,
            data: symtab,
        },
        Section {
            name: "",
            kind: SHT_PROGBITS,
            link: 0,
            info: 0,
            entsize: 0,
            data: init,
        },
    ];
    for _ in kernels {
        sections.push(Section {
            name: "",
            kind: SHT_PROGBITS,
            link: 0,
            info: 0,
            entsize: 0,
            data: vec![0u8; 16],
        });
    }
    for (_, params) in &infos {
        sections.push(Section {
            name: "",
            kind: SHT_CUDA_INFO,
            link: 3,
            info: 0,
            entsize: 0,
            data: nv_info_params(params),
        });
    }
    let mut body = Vec::new();
    let mut offsets = Vec::new();
    for s in &sections {
        offsets.push(64 + body.len() as u64);
        body.extend_from_slice(&s.data);
        body.resize(body.len().next_multiple_of(8), 0);
    }
    let shoff = 64 + body.len() as u64;
    let shnum = sections.len() as u16 + 1;
    let mut elf = Vec::new();
    elf.extend_from_slice(b"\x7fELF");
    elf.extend_from_slice(&[2, 1, 1, 0x33, 7, 0, 0, 0, 0, 0, 0, 0]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&EM_CUDA.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&0u64.to_le_bytes()); // entry
    elf.extend_from_slice(&0u64.to_le_bytes()); // phoff
    elf.extend_from_slice(&shoff.to_le_bytes());
    elf.extend_from_slice(&sm.to_le_bytes()); // flags: the SM version
    elf.extend_from_slice(&64u16.to_le_bytes()); // ehsize
    elf.extend_from_slice(&56u16.to_le_bytes()); // phentsize
    elf.extend_from_slice(&0u16.to_le_bytes()); // phnum
    elf.extend_from_slice(&64u16.to_le_bytes()); // shentsize
    elf.extend_from_slice(&shnum.to_le_bytes());
    elf.extend_from_slice(&1u16.to_le_bytes()); // shstrndx
    elf.extend_from_slice(&body);
    elf.extend_from_slice(&[0u8; 64]);
    for (i, s) in sections.iter().enumerate() {
        let _ = s.name;
        elf.extend_from_slice(&sh_name[i].to_le_bytes());
        elf.extend_from_slice(&s.kind.to_le_bytes());
        elf.extend_from_slice(&0u64.to_le_bytes()); // flags
        elf.extend_from_slice(&0u64.to_le_bytes()); // addr
        elf.extend_from_slice(&offsets[i].to_le_bytes());
        elf.extend_from_slice(&(s.data.len() as u64).to_le_bytes());
        elf.extend_from_slice(&s.link.to_le_bytes());
        elf.extend_from_slice(&s.info.to_le_bytes());
        elf.extend_from_slice(&8u64.to_le_bytes()); // addralign
        elf.extend_from_slice(&s.entsize.to_le_bytes());
    }
    elf
}

fn compress(data: &[u8], how: Compression) -> Vec<u8> {
    match how {
        Compression::None => data.to_vec(),
        Compression::Lz4 => lz4_flex::block::compress(data),
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

/// A fatbin container (`fatBinaryHeader` and entries) as nvcc embeds it.
pub fn fatbin(entries: &[Entry]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in entries {
        let (kind, plain, how) = match e {
            Entry::Elf(b, c) => (2u16, b.clone(), *c),
            Entry::Ptx(t, c) => {
                let mut b = t.clone().into_bytes();
                b.push(0);
                (1u16, b, *c)
            }
        };
        let stored = compress(&plain, how);
        let padded = stored.len().next_multiple_of(8);
        let flag = match how {
            Compression::None => 0u64,
            Compression::Lz4 => 0x2000,
            Compression::Zstd => 0x8000,
        };
        let (payload_size, compressed_size) = match how {
            Compression::None => (padded as u32, 0u32),
            _ => (padded as u32, stored.len() as u32),
        };
        let mut h = vec![0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..12].copy_from_slice(&payload_size.to_le_bytes());
        h[16..20].copy_from_slice(&compressed_size.to_le_bytes());
        h[28..32].copy_from_slice(&90u32.to_le_bytes());
        h[32..36].copy_from_slice(&64u32.to_le_bytes());
        h[40..48].copy_from_slice(&(0x11 | flag).to_le_bytes());
        h[56..64].copy_from_slice(&(plain.len() as u64).to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(&stored);
        body.resize(body.len() + (padded - stored.len()), 0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0xBA55ED50u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}
