//! The ResourceSlice the plugin publishes for its node: one device per GPU,
//! shareable by consumable capacity (KEP-5075): each claim on a GPU takes
//! part of its `memory` (bytes) and of its `sm` (percent of its time, the
//! guaranteed share), and the scheduler admits claims while both last.
//!
//! A claim that asks for neither capacity takes the whole GPU (the
//! request policy's defaults are the whole capacity): nothing is shared
//! unless asked for.

use crate::DRIVER;
use dilu_deviceplugin::devices::Gpu;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// The capacity of a GPU's memory, in bytes.
pub const MEMORY: &str = "memory";
/// The capacity of a GPU's time, in percent: what a claim takes is its
/// guaranteed SM share.
pub const SM: &str = "sm";
/// The smallest memory a claim may take, and the step requests are
/// rounded up to.
pub const MEMORY_STEP: &str = "1Mi";

/// The device name of GPU `index` in the slice.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index a device name of the slice stands for.
pub fn gpu_index(device: &str) -> Option<u32> {
    device.strip_prefix("gpu-")?.parse().ok()
}

/// The slice's object name for `node`: one per node and driver.
pub fn slice_name(node: &str) -> String {
    let mut name = format!("{node}-{DRIVER}");
    name.truncate(253);
    name
}

fn capacity(value: String, default: String, min: &str, step: &str) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.clone()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(default)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(min.to_string()),
                max: Some(Quantity(value)),
                step: Some(Quantity(step.to_string())),
            }),
            valid_values: None,
        }),
    }
}

fn device(gpu: &Gpu) -> Device {
    let attributes = BTreeMap::from([
        (
            "model".to_string(),
            DeviceAttribute {
                string: Some(gpu.model.clone()),
                ..Default::default()
            },
        ),
        (
            "uuid".to_string(),
            DeviceAttribute {
                string: Some(gpu.uuid.clone()),
                ..Default::default()
            },
        ),
        (
            "index".to_string(),
            DeviceAttribute {
                int: Some(i64::from(gpu.index)),
                ..Default::default()
            },
        ),
    ]);
    let memory = gpu.memory_bytes.to_string();
    let capacities = BTreeMap::from([
        (
            MEMORY.to_string(),
            capacity(memory.clone(), memory, MEMORY_STEP, MEMORY_STEP),
        ),
        (
            SM.to_string(),
            capacity("100".into(), "100".into(), "1", "1"),
        ),
    ]);
    Device {
        name: device_name(gpu.index),
        attributes: Some(attributes),
        capacity: Some(capacities),
        allow_multiple_allocations: Some(true),
        ..Default::default()
    }
}

/// The slice for `node`'s `gpus`: its pool is named after the node (one
/// slice, generation `generation`: bumped when the GPUs change).
pub fn resource_slice(node: &str, gpus: &[Gpu], generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 << 30,
            minor: index,
        }
    }

    #[test]
    fn every_gpu_is_one_shareable_device_with_its_memory_and_time() {
        let slice = resource_slice("node-a", &[gpu(0), gpu(1)], 1);
        let json = serde_json::to_value(&slice).unwrap();
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(json["kind"], "ResourceSlice");
        assert_eq!(json["metadata"]["name"], "node-a-gpu.dilu.io");
        assert_eq!(json["spec"]["driver"], DRIVER);
        assert_eq!(json["spec"]["nodeName"], "node-a");
        assert_eq!(json["spec"]["pool"]["name"], "node-a");
        let devices = json["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        let one = &devices[1];
        assert_eq!(one["name"], "gpu-1");
        assert_eq!(gpu_index("gpu-1"), Some(1));
        assert_eq!(one["allowMultipleAllocations"], true);
        assert_eq!(one["attributes"]["index"]["int"], 1);
        assert_eq!(
            one["attributes"]["model"]["string"],
            "NVIDIA H100 80GB HBM3"
        );
        assert!(
            one["attributes"]["uuid"]["string"]
                .as_str()
                .unwrap()
                .starts_with("GPU-")
        );
        let memory = &one["capacity"][MEMORY];
        assert_eq!(memory["value"], (80u64 << 30).to_string());
        assert_eq!(
            memory["requestPolicy"]["default"], memory["value"],
            "whole by default"
        );
        assert_eq!(one["capacity"][SM]["value"], "100");
        assert_eq!(
            one["capacity"][SM]["requestPolicy"]["validRange"]["min"],
            "1"
        );
    }
}
