//! What identifies a simulated device to its clients: name, UUID and PCI
//! location. The driver (`cuDeviceGetUuid`, `cuDeviceGetPCIBusId`,
//! `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`) and the simulated NVML both answer from
//! here, so a client matching CUDA devices to NVML devices finds the same GPU.

pub(crate) const DEVICE_NAME: &str = "NVIDIA H100 80GB HBM3 (simgpu)";
// The simulated NVML (simgpu/nvml) includes this file; the driver itself
// does not report the items marked dead_code.
/// PCI device and subsystem ids of an H100 SXM5 80GB (vendor 0x10de in the
/// low half, as NVML reports them).
#[allow(dead_code)]
pub(crate) const PCI_DEVICE_ID: u32 = 0x2330_10de;
#[allow(dead_code)]
pub(crate) const PCI_SUBSYSTEM_ID: u32 = 0x16c1_10de;
const FIRST_BUS: u32 = 0x18;

/// PCI bus number of physical device `phys` (domain 0, device 0).
pub(crate) fn pci_bus(phys: usize) -> u32 {
    FIRST_BUS + phys as u32
}

/// The 16 UUID bytes of physical device `phys` of `instance`: "simgpu", a
/// hash of the instance name, the device index. Stable across processes.
pub(crate) fn uuid_bytes(instance: &str, phys: usize) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(b"simgpu");
    let h = instance.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    bytes[6..14].copy_from_slice(&h.to_le_bytes());
    bytes[14..16].copy_from_slice(&(phys as u16).to_le_bytes());
    bytes
}

/// NVML's text form of a UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The physical device an entry of `CUDA_VISIBLE_DEVICES` names among
/// `devices` of `instance`, as NVIDIA's driver reads it: an index, or a
/// UUID in NVML's text form (`GPU-…`), whole or as a prefix that only one
/// device's UUID starts with. `None`: no such device, an ambiguous prefix
/// or another form (`MIG-…`: simgpu has no MIG instances); the list ends
/// there.
pub(crate) fn visible_entry(entry: &str, devices: usize, instance: &str) -> Option<usize> {
    if let Ok(index) = entry.parse::<usize>() {
        return (index < devices).then_some(index);
    }
    let digits = entry.strip_prefix("GPU-").filter(|d| !d.is_empty())?;
    let digits = digits.to_ascii_lowercase();
    let mut named = (0..devices).filter(|&phys| {
        uuid_text(&uuid_bytes(instance, phys))["GPU-".len()..].starts_with(&digits)
    });
    let first = named.next()?;
    named.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_entries_name_devices_by_index_or_uuid_as_nvidias_driver_reads_them() {
        let uuid = |phys| uuid_text(&uuid_bytes("inst", phys));
        assert_eq!(visible_entry("1", 2, "inst"), Some(1));
        assert_eq!(visible_entry("2", 2, "inst"), None, "out of range");
        assert_eq!(visible_entry(&uuid(1), 2, "inst"), Some(1));
        assert_eq!(
            visible_entry(&uuid(1).to_uppercase(), 2, "inst"),
            Some(1),
            "hex digits in either case"
        );
        // A prefix one device's UUID starts with; one both share is not.
        let one = &uuid(1)[..uuid(1).len() - 2];
        assert_eq!(visible_entry(one, 2, "inst"), Some(1));
        assert_eq!(visible_entry(&uuid(1)[..12], 2, "inst"), None, "ambiguous");
        assert_eq!(visible_entry("GPU-", 2, "inst"), None);
        assert_eq!(
            visible_entry(&uuid(1), 2, "other"),
            None,
            "another instance's"
        );
        assert_eq!(visible_entry("MIG-0000", 2, "inst"), None, "no MIG");
    }
}
