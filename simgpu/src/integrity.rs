//! The answer to cudart's integrity check (export table D4082055, slot 1).
//!
//! cudart computes the same value itself and refuses to run
//! (cudaErrorSoftwareValidityNotEstablished) when the driver's answer
//! differs. For most caller versions the answer is an HMAC over MD2
//! (RFC 1319 hash, RFC 2104 construction) keyed with a fixed 16-byte key, of
//! the driver version, the caller's version, process and thread ids, three
//! addresses inside the driver, the caller's timestamp and, per device, its
//! UUID and PCI location. The layout and key were reverse-engineered by
//! ZLUDA (vosen/ZLUDA, `dark_api`); this is an independent implementation.

/// RFC 1319's permutation of 0..=255 built from the digits of pi.
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// The fixed HMAC key cudart and the driver share.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// Streaming MD2 (RFC 1319): 16-byte blocks, a running checksum appended
/// at the end.
struct Md2 {
    state: [u8; 16],
    checksum: [u8; 16],
    block: [u8; 16],
    filled: usize,
}

impl Md2 {
    fn new() -> Md2 {
        Md2 {
            state: [0; 16],
            checksum: [0; 16],
            block: [0; 16],
            filled: 0,
        }
    }

    fn update(&mut self, data: &[u8]) {
        for &byte in data {
            self.block[self.filled] = byte;
            self.filled += 1;
            if self.filled == 16 {
                self.compress();
                self.filled = 0;
            }
        }
    }

    fn compress(&mut self) {
        let mut last = self.checksum[15];
        for j in 0..16 {
            self.checksum[j] ^= PI_SUBST[(self.block[j] ^ last) as usize];
            last = self.checksum[j];
        }
        let mut x = [0u8; 48];
        for j in 0..16 {
            x[j] = self.state[j];
            x[16 + j] = self.block[j];
            x[32 + j] = self.block[j] ^ self.state[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for byte in x.iter_mut() {
                *byte ^= PI_SUBST[t as usize];
                t = *byte;
            }
            t = t.wrapping_add(round);
        }
        self.state.copy_from_slice(&x[..16]);
    }

    fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.filled) as u8;
        self.update(&vec![pad; pad as usize]);
        let checksum = self.checksum;
        self.update(&checksum);
        self.state
    }
}

/// HMAC (RFC 2104) with MD2 and the shared key (MD2's block is 16 bytes,
/// the key's length, so the key is used as is).
fn hmac_md2(message: &[u8]) -> [u8; 16] {
    let pad = |x: u8| KEY.map(|k| k ^ x);
    let mut inner = Md2::new();
    inner.update(&pad(0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&pad(0x5c));
    outer.update(&inner);
    outer.finish()
}

/// What the check hashes about one device.
pub(crate) struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// Everything the check hashes besides the devices.
pub(crate) struct CheckInput {
    pub driver_version: u32,
    pub caller_version: u32,
    pub pid: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub check_fn: usize,
    pub unix_seconds: u64,
}

/// The two words written to the caller's `u64[2]`.
pub(crate) fn answer(input: &CheckInput, devices: &[DeviceIdentity]) -> [u64; 2] {
    // Old callers expect fixed words.
    match input.caller_version % 10 {
        0 => return [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8],
        1 => return [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8],
        _ => {}
    }
    // The message is the bytes of a C struct {u32 x4; void* x3; u64} (48
    // bytes, no padding) followed by {u8[16]; i32 x3} per device.
    let mut msg = Vec::with_capacity(48 + 28 * devices.len());
    for v in [
        input.driver_version,
        input.caller_version,
        input.pid,
        input.thread,
    ] {
        msg.extend_from_slice(&v.to_le_bytes());
    }
    for v in [input.cudart_table, input.integrity_table, input.check_fn] {
        msg.extend_from_slice(&(v as u64).to_le_bytes());
    }
    msg.extend_from_slice(&input.unix_seconds.to_le_bytes());
    for d in devices {
        msg.extend_from_slice(&d.uuid);
        for v in [d.pci_domain, d.pci_bus, d.pci_device] {
            msg.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mac = hmac_md2(&msg);
    let word = |i: usize| u64::from_le_bytes(mac[i..i + 8].try_into().expect("8 bytes"));
    [word(0), word(8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2_hex(data: &[u8]) -> String {
        let mut h = Md2::new();
        h.update(data);
        h.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_the_rfc_test_suite() {
        assert_eq!(md2_hex(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2_hex(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            md2_hex(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn every_input_bit_changes_the_answer() {
        let input = |thread| CheckInput {
            driver_version: 13020,
            caller_version: 12092,
            pid: 7,
            thread,
            cudart_table: 0x1000,
            integrity_table: 0x2000,
            check_fn: 0x3000,
            unix_seconds: 1_700_000_000,
        };
        let dev = |bus| DeviceIdentity {
            uuid: [1; 16],
            pci_domain: 0,
            pci_bus: bus,
            pci_device: 0,
        };
        let a = answer(&input(1), &[dev(0x18)]);
        assert_ne!(a, answer(&input(3), &[dev(0x18)]));
        assert_ne!(a, answer(&input(1), &[dev(0x19)]));
        assert_ne!(a, answer(&input(1), &[]));
        let mut old = input(1);
        old.caller_version = 12090;
        assert_eq!(answer(&old, &[]), [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]);
    }
}
