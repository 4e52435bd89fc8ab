//! What a pod asks of dilu GPUs, read from its annotations or, failing
//! that, from its first container's resources (requests, then limits):
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `dilu.io/sm-request` | guaranteed SM share, 0–1 | required |
//! | `dilu.io/sm-limit` | SM share it may burst to | the request |
//! | `dilu.io/memory` | GPU memory per GPU (`20GiB`, `512Mi`, bytes) | required |
//! | `dilu.io/class` | `latency` or `batch` | `latency` |
//! | `dilu.io/gpus` | GPUs for a gang (training) | `nvidia.com/gpu` or 1 |
//! | `dilu.io/profile` | the JSON `dilu profile --json` prints: class, SM request and limit from it | — |
//!
//! Keys set beside `dilu.io/profile` win over what the profile says.
//! A pod with neither `dilu.io/sm-request` nor `dilu.io/memory` is not a
//! dilu pod: the extender leaves it alone.

use dilu_abi::units::parse_size;
use serde_json::Value;

use super::wire::Pod;
use crate::model::{InstanceDemand, WorkClass};

pub const SM_REQUEST: &str = "dilu.io/sm-request";
pub const SM_LIMIT: &str = "dilu.io/sm-limit";
pub const MEMORY: &str = "dilu.io/memory";
pub const CLASS: &str = "dilu.io/class";
pub const GPUS: &str = "dilu.io/gpus";
pub const PROFILE: &str = "dilu.io/profile";

fn lookup(pod: &Pod, key: &str) -> Option<String> {
    if let Some(value) = pod.metadata.annotations.get(key) {
        return Some(value.clone());
    }
    let resources = &pod.spec.containers.first()?.resources;
    let value = resources
        .requests
        .get(key)
        .or_else(|| resources.limits.get(key))?;
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn share(pod: &Pod, key: &str) -> Result<Option<f64>, String> {
    let Some(text) = lookup(pod, key) else {
        return Ok(None);
    };
    let value = parse_share(&text).ok_or_else(|| {
        format!("{key}={text:?}: expected a share between 0 and 1 such as 0.3, 30% or 300m")
    })?;
    Ok(Some(value))
}

/// `0.3`, `30%` or Kubernetes milli-units `300m`.
fn parse_share(text: &str) -> Option<f64> {
    let text = text.trim();
    let value = if let Some(percent) = text.strip_suffix('%') {
        percent.trim().parse::<f64>().ok()? / 100.0
    } else if let Some(milli) = text.strip_suffix('m') {
        milli.trim().parse::<f64>().ok()? / 1000.0
    } else {
        text.parse::<f64>().ok()?
    };
    (value.is_finite() && (0.0..=1.0).contains(&value)).then_some(value)
}

/// `Ok(None)` for pods that do not use dilu; `Err` names the bad key.
pub fn pod_demand(pod: &Pod) -> Result<Option<InstanceDemand>, String> {
    let profile = match lookup(pod, PROFILE) {
        Some(text) => Some(
            dilu_profile::profile::Profile::from_text(&text)
                .map_err(|error| format!("{PROFILE}: {error}"))?,
        ),
        None => None,
    };
    let from_profile = |percent: fn(&dilu_profile::profile::Profile) -> u32| {
        profile.as_ref().map(|p| f64::from(percent(p)) / 100.0)
    };
    let request = share(pod, SM_REQUEST)?.or(from_profile(|p| p.sm_request));
    let memory = lookup(pod, MEMORY);
    if request.is_none() && memory.is_none() {
        return Ok(None);
    }
    let sm_request =
        request.ok_or_else(|| format!("{MEMORY} is set but {SM_REQUEST} is missing"))?;
    let memory_text =
        memory.ok_or_else(|| format!("{SM_REQUEST} is set but {MEMORY} is missing"))?;
    let memory_bytes = parse_size(&memory_text).map_err(|error| format!("{MEMORY}: {error}"))?;
    let sm_limit = share(pod, SM_LIMIT)?
        .or(from_profile(|p| p.sm_limit))
        .unwrap_or(sm_request);
    if sm_limit < sm_request {
        return Err(format!(
            "{SM_LIMIT} ({sm_limit}) is below {SM_REQUEST} ({sm_request})"
        ));
    }
    let profile_class = profile.as_ref().map(|p| match p.class {
        dilu_profile::profile::Class::Latency => "latency".to_string(),
        dilu_profile::profile::Class::Batch => "batch".to_string(),
    });
    let class = match lookup(pod, CLASS)
        .or(profile_class)
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("latency") | Some("inference") => WorkClass::Latency,
        Some("batch") | Some("training") => WorkClass::Batch,
        Some(other) => return Err(format!("{CLASS}={other:?}: expected latency or batch")),
    };
    let gpus_text = lookup(pod, GPUS).or_else(|| lookup(pod, "nvidia.com/gpu"));
    let gpus = match gpus_text {
        None => 1,
        Some(text) => match text.trim().parse::<u32>() {
            Ok(count) if (1..=64).contains(&count) => count,
            _ => {
                return Err(format!(
                    "{GPUS}={text:?}: expected a whole number from 1 to 64"
                ));
            }
        },
    };
    Ok(Some(InstanceDemand {
        class,
        sm_request,
        sm_limit,
        memory_bytes,
        gpus,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        for (key, value) in annotations {
            pod.metadata
                .annotations
                .insert(key.to_string(), value.to_string());
        }
        pod
    }

    #[test]
    fn annotations_give_the_demand() {
        let demand = pod_demand(&pod(&[
            (SM_REQUEST, "300m"),
            (SM_LIMIT, "50%"),
            (MEMORY, "20Gi"),
            (CLASS, "batch"),
            (GPUS, "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(demand.sm_request, 0.3);
        assert_eq!(demand.sm_limit, 0.5);
        assert_eq!(demand.memory_bytes, 20 << 30);
        assert_eq!((demand.class, demand.gpus), (WorkClass::Batch, 2));
    }

    #[test]
    fn container_resources_are_the_fallback_and_plain_pods_are_ignored() {
        let mut with_resources = Pod::default();
        let mut container = super::super::wire::Container::default();
        container
            .resources
            .limits
            .insert(SM_REQUEST.into(), Value::from("0.25"));
        container
            .resources
            .limits
            .insert(MEMORY.into(), Value::from("8Gi"));
        with_resources.spec.containers.push(container);
        let demand = pod_demand(&with_resources).unwrap().unwrap();
        assert_eq!((demand.sm_request, demand.sm_limit), (0.25, 0.25));
        assert!(pod_demand(&Pod::default()).unwrap().is_none());
    }

    #[test]
    fn a_profile_annotation_gives_class_request_and_limit_and_keys_beside_it_win() {
        let profile = r#"{"class":"batch","batch":16,"sm_request":40,"sm_limit":70,"throughput_at_request":600.0,"throughput_at_limit":640.0,"trials":5,"method":"dilu"}"#;
        let demand = pod_demand(&pod(&[(PROFILE, profile), (MEMORY, "8Gi")]))
            .unwrap()
            .unwrap();
        assert_eq!((demand.sm_request, demand.sm_limit), (0.4, 0.7));
        assert_eq!(demand.class, WorkClass::Batch);
        let overridden = pod_demand(&pod(&[
            (PROFILE, profile),
            (MEMORY, "8Gi"),
            (SM_LIMIT, "0.9"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((overridden.sm_request, overridden.sm_limit), (0.4, 0.9));
        let error = pod_demand(&pod(&[(PROFILE, "{\"class\":1}"), (MEMORY, "8Gi")])).unwrap_err();
        assert!(error.contains(PROFILE), "{error}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let error = pod_demand(&pod(&[(SM_REQUEST, "1.5"), (MEMORY, "1Gi")])).unwrap_err();
        assert!(error.contains(SM_REQUEST), "{error}");
        let error = pod_demand(&pod(&[(SM_REQUEST, "0.5"), (MEMORY, "lots")])).unwrap_err();
        assert!(error.contains(MEMORY), "{error}");
        let error = pod_demand(&pod(&[
            (SM_REQUEST, "0.5"),
            (SM_LIMIT, "0.2"),
            (MEMORY, "1Gi"),
        ]))
        .unwrap_err();
        assert!(error.contains("below"), "{error}");
    }
}
