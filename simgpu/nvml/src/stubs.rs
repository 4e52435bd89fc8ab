//! Entry points simgpu has nothing to report for (temperatures, power,
//! clocks, ECC, MIG, vGPU, ...): exported so that clients which resolve them
//! find them, and answering `NVML_ERROR_NOT_SUPPORTED`, as NVIDIA's NVML does
//! on a GPU that lacks the feature. None writes to its arguments, so one
//! argument-less body serves every signature (the C caller owns the stack).

use crate::{NVML_ERROR_NOT_SUPPORTED, NvmlReturn};

macro_rules! not_supported {
    ($($name:ident)*) => {
        $(
            #[unsafe(no_mangle)]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() -> NvmlReturn {
                NVML_ERROR_NOT_SUPPORTED
            }
        )*
    };
}

not_supported! {
    nvmlDeviceGetSerial nvmlDeviceGetHandleBySerial nvmlDeviceGetBoardId
    nvmlDeviceGetBoardPartNumber nvmlDeviceGetBrand nvmlDeviceGetVbiosVersion
    nvmlDeviceGetInforomVersion nvmlDeviceGetInforomImageVersion
    nvmlDeviceGetTemperature nvmlDeviceGetTemperatureV nvmlDeviceGetTemperatureThreshold
    nvmlDeviceGetFanSpeed nvmlDeviceGetFanSpeed_v2 nvmlDeviceGetNumFans
    nvmlDeviceGetPowerUsage nvmlDeviceGetPowerState nvmlDeviceGetPowerManagementMode
    nvmlDeviceGetPowerManagementLimit nvmlDeviceGetPowerManagementLimitConstraints
    nvmlDeviceGetPowerManagementDefaultLimit nvmlDeviceGetEnforcedPowerLimit
    nvmlDeviceGetTotalEnergyConsumption nvmlDeviceGetPerformanceState
    nvmlDeviceGetCurrentClocksThrottleReasons nvmlDeviceGetCurrentClocksEventReasons
    nvmlDeviceGetSupportedClocksThrottleReasons nvmlDeviceGetSupportedClocksEventReasons
    nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo nvmlDeviceGetClock
    nvmlDeviceGetApplicationsClock nvmlDeviceGetDefaultApplicationsClock
    nvmlDeviceGetSupportedMemoryClocks nvmlDeviceGetSupportedGraphicsClocks
    nvmlDeviceGetEccMode nvmlDeviceGetTotalEccErrors nvmlDeviceGetDetailedEccErrors
    nvmlDeviceGetMemoryErrorCounter nvmlDeviceGetRetiredPages nvmlDeviceGetRetiredPages_v2
    nvmlDeviceGetRetiredPagesPendingStatus nvmlDeviceGetRemappedRows
    nvmlDeviceGetPersistenceMode nvmlDeviceGetComputeMode nvmlDeviceGetDisplayMode
    nvmlDeviceGetDisplayActive nvmlDeviceGetDriverModel nvmlDeviceGetAccountingMode
    nvmlDeviceGetAccountingStats nvmlDeviceGetAccountingPids nvmlDeviceGetAccountingBufferSize
    nvmlDeviceGetEncoderUtilization nvmlDeviceGetDecoderUtilization
    nvmlDeviceGetEncoderCapacity nvmlDeviceGetEncoderStats nvmlDeviceGetEncoderSessions
    nvmlDeviceGetFBCStats nvmlDeviceGetFBCSessions nvmlDeviceGetJpgUtilization
    nvmlDeviceGetOfaUtilization nvmlDeviceGetSamples nvmlDeviceGetViolationStatus
    nvmlDeviceGetProcessesUtilizationInfo nvmlDeviceGetRunningProcessDetailList
    nvmlDeviceGetBAR1MemoryInfo nvmlDeviceGetPcieThroughput nvmlDeviceGetPcieReplayCounter
    nvmlDeviceGetCurrPcieLinkGeneration nvmlDeviceGetCurrPcieLinkWidth
    nvmlDeviceGetMaxPcieLinkGeneration nvmlDeviceGetMaxPcieLinkWidth nvmlDeviceGetPcieSpeed
    nvmlDeviceGetNvLinkState nvmlDeviceGetNvLinkVersion nvmlDeviceGetNvLinkCapability
    nvmlDeviceGetNvLinkRemotePciInfo nvmlDeviceGetNvLinkRemotePciInfo_v2
    nvmlDeviceGetNvLinkRemoteDeviceType nvmlDeviceGetGpuFabricInfo nvmlDeviceGetGpuFabricInfoV
    nvmlDeviceGetNvLinkErrorCounter nvmlDeviceGetTopologyCommonAncestor
    nvmlDeviceGetTopologyNearestGpus nvmlDeviceGetP2PStatus nvmlDeviceGetCpuAffinity
    nvmlDeviceGetCpuAffinityWithinScope nvmlDeviceGetMemoryAffinity
    nvmlDeviceGetMigMode nvmlDeviceGetMaxMigDeviceCount nvmlDeviceGetMigDeviceHandleByIndex
    nvmlDeviceGetDeviceHandleFromMigDeviceHandle nvmlDeviceIsMigDeviceHandle
    nvmlDeviceGetGpuInstanceId nvmlDeviceGetComputeInstanceId nvmlDeviceGetGpuInstances
    nvmlDeviceGetGpuInstanceProfileInfo nvmlDeviceGetAttributes nvmlDeviceGetAttributes_v2
    nvmlDeviceGetVirtualizationMode nvmlDeviceGetHostVgpuMode nvmlDeviceGetGridLicensableFeatures
    nvmlDeviceGetGridLicensableFeatures_v2 nvmlDeviceGetGridLicensableFeatures_v3
    nvmlDeviceGetGridLicensableFeatures_v4 nvmlDeviceGetActiveVgpus nvmlDeviceGetSupportedVgpus
    nvmlDeviceGetCreatableVgpus nvmlDeviceGetMultiGpuBoard nvmlDeviceGetAPIRestriction
    nvmlDeviceGetAutoBoostedClocksEnabled nvmlDeviceGetBridgeChipInfo
    nvmlDeviceGetSupportedEventTypes nvmlDeviceGetGspFirmwareMode nvmlDeviceGetGspFirmwareVersion
    nvmlDeviceGetConfComputeMemSizeInfo nvmlDeviceGetNumGpuCores nvmlDeviceGetMemoryBusWidth
    nvmlDeviceGetPcieLinkMaxSpeed nvmlDeviceGetAdaptiveClockInfoStatus nvmlDeviceGetBusType
    nvmlDeviceGetDynamicPstatesInfo nvmlDeviceGetGpcClkVfOffset nvmlDeviceGetMemClkVfOffset
    nvmlDeviceGetFieldValues nvmlDeviceClearFieldValues nvmlDeviceGetTopologyGpuSet
    nvmlDeviceSetPersistenceMode nvmlDeviceSetComputeMode nvmlDeviceSetEccMode
    nvmlDeviceClearEccErrorCounts nvmlDeviceSetApplicationsClocks
    nvmlDeviceResetApplicationsClocks nvmlDeviceSetPowerManagementLimit
    nvmlDeviceSetGpuLockedClocks nvmlDeviceResetGpuLockedClocks nvmlDeviceSetMemoryLockedClocks
    nvmlDeviceResetMemoryLockedClocks nvmlDeviceSetAutoBoostedClocksEnabled
    nvmlDeviceSetDefaultAutoBoostedClocksEnabled nvmlDeviceSetTemperatureThreshold
    nvmlDeviceSetAccountingMode nvmlDeviceClearAccountingPids nvmlDeviceSetMigMode
    nvmlDeviceSetAPIRestriction nvmlDeviceSetDriverModel nvmlDeviceModifyDrainState
    nvmlDeviceQueryDrainState nvmlDeviceRemoveGpu nvmlDeviceRemoveGpu_v2
    nvmlDeviceDiscoverGpus nvmlDeviceOnSameBoard nvmlDeviceValidateInforom
    nvmlDeviceGetInforomConfigurationChecksum nvmlDeviceGetBoardPartNumber_v2
    nvmlEventSetCreate nvmlEventSetFree nvmlDeviceRegisterEvents nvmlEventSetWait
    nvmlEventSetWait_v2 nvmlSystemGetProcessName nvmlSystemGetHicVersion
    nvmlSystemGetTopologyGpuSet nvmlSystemGetConfComputeState nvmlUnitGetCount
    nvmlUnitGetHandleByIndex nvmlUnitGetUnitInfo nvmlUnitGetLedState nvmlUnitGetPsuInfo
    nvmlUnitGetTemperature nvmlUnitGetFanSpeedInfo nvmlUnitGetDevices nvmlUnitSetLedState
    nvmlGetVgpuCompatibility nvmlGetVgpuVersion nvmlSetVgpuVersion nvmlGetExcludedDeviceCount
    nvmlGetExcludedDeviceInfoByIndex nvmlGetBlacklistDeviceCount nvmlGetBlacklistDeviceInfoByIndex
    nvmlInternalGetExportTable
}
