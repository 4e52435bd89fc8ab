//! THE table of hooked driver functions: one row per function, handed to a
//! generator. [`crate::table`] makes the ids, C names and real-driver slots
//! of it; [`crate::entry::exports`] the exported wrappers and the `dlsym` and
//! `cuGetProcAddress` answers; [`crate::telemetry::stats`] counts calls per
//! id. Handler paths (`h::...`) and C types are resolved where the rows are
//! expanded into wrappers (`entry/exports.rs`), so this list depends on
//! nothing.
//!
//! To hook a new function: add one row with its exact ABI name (the versioned
//! exported name, e.g. `cuMemAlloc_v2`), `/ name_ptsz` if `cuda.h` has a
//! per-thread-default-stream variant, its parameters, and a handler in
//! `entry/handlers.rs` (or a module it re-exports); then rerun
//! `scripts/gen-driver-types.py`, which gives the name its C type
//! (`PFN_<name>` in `driver_api.rs`, from cudaTypedefs.h) and its slot in
//! `REAL`. The parameters must have exactly that type's types, or the
//! wrapper does not compile.
//!
//! Row syntax: `handler_path => fn AbiName [/ AbiName_ptsz] (arg: CType, ...);`

/// Hands every row to `$generate!` (see the module documentation).
macro_rules! hooked_functions {
    ($generate:ident) => {
        $generate! {
            // ---- memory -----------------------------------------------------------
            h::mem_alloc => fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
            h::mem_free => fn cuMemFree_v2(dptr: CUdeviceptr);
            h::mem_get_info => fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
            h::mem_alloc_pitch => fn cuMemAllocPitch_v2(
                dptr: *mut CUdeviceptr, pitch: *mut usize, width_bytes: usize, height: usize,
                element_size_bytes: c_uint,
            );
            h::mem_alloc_managed => fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
            h::mem_alloc_async => fn cuMemAllocAsync / cuMemAllocAsync_ptsz(
                dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream,
            );
            h::mem_free_async => fn cuMemFreeAsync / cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream);
            h::mem_alloc_from_pool_async => fn cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz(
                dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream,
            );
            h::mem_create => fn cuMemCreate(
                handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp,
                flags: c_ulonglong,
            );
            h::mem_release => fn cuMemRelease(handle: CUmemGenericAllocationHandle);
            h::mem_export_to_shareable_handle => fn cuMemExportToShareableHandle(
                shareable_handle: *mut c_void, handle: CUmemGenericAllocationHandle,
                handle_type: c_uint, flags: c_ulonglong,
            );
            h::mem_import_from_shareable_handle => fn cuMemImportFromShareableHandle(
                handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void,
                handle_type: c_uint,
            );
            h::ipc_get_mem_handle => fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr);
            h::ipc_open_mem_handle => fn cuIpcOpenMemHandle(
                dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint,
            );
            h::ipc_open_mem_handle => fn cuIpcOpenMemHandle_v2(
                dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint,
            );
            h::ipc_close_mem_handle => fn cuIpcCloseMemHandle(dptr: CUdeviceptr);
            h::array_create => fn cuArrayCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR);
            h::array3d_create => fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR);
            h::array_destroy => fn cuArrayDestroy(array: CUarray);
            h::mipmapped_array_create => fn cuMipmappedArrayCreate(
                array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint,
            );
            h::mipmapped_array_destroy => fn cuMipmappedArrayDestroy(array: CUmipmappedArray);
            h::device_total_mem => fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);

            // ---- the pre-3.2 ABIs (32-bit pointers and sizes) and memory the driver
            // sets aside on request (see memory/v1.rs and memory/driver_reserved.rs)
            h::mem_alloc_v1 => fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint);
            h::mem_alloc_pitch_v1 => fn cuMemAllocPitch(
                dptr: *mut c_uint, pitch: *mut c_uint, width_bytes: c_uint, height: c_uint,
                element_size_bytes: c_uint,
            );
            h::mem_free_v1 => fn cuMemFree(dptr: c_uint);
            h::mem_get_info_v1 => fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint);
            h::ctx_set_limit => fn cuCtxSetLimit(limit: c_uint, value: usize);
            h::mem_pool_set_attribute => fn cuMemPoolSetAttribute(
                pool: CUmemoryPool, attr: c_uint, value: *mut c_void,
            );

            // ---- graph memory (see memory/graph_memory.rs for the rule) ------------------
            h::graph_add_node => fn cuGraphAddMemAllocNode(
                node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize,
                params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
            );
            h::graph_add_node => fn cuGraphAddNode(
                node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize,
                params: *mut CUgraphNodeParams,
            );
            h::graph_add_node_v2 => fn cuGraphAddNode_v2(
                node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode,
                edges: *const CUgraphEdgeData, count: usize, params: *mut CUgraphNodeParams,
            );
            h::graph_instantiate => fn cuGraphInstantiate(
                exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char,
                log_size: usize,
            );
            h::graph_instantiate => fn cuGraphInstantiate_v2(
                exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char,
                log_size: usize,
            );
            h::graph_instantiate_with_flags => fn cuGraphInstantiateWithFlags(
                exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong,
            );
            h::graph_instantiate_with_params => fn cuGraphInstantiateWithParams / cuGraphInstantiateWithParams_ptsz(
                exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
            );
            h::graph_exec_destroy => fn cuGraphExecDestroy(exec: CUgraphExec);
            h::graph_destroy => fn cuGraphDestroy(graph: CUgraph);
            h::device_graph_mem_trim => fn cuDeviceGraphMemTrim(device: CUdevice);

            // ---- launches ---------------------------------------------------------
            h::launch_kernel => fn cuLaunchKernel / cuLaunchKernel_ptsz(
                f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint,
                block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint,
                stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void,
            );
            h::launch_kernel_ex => fn cuLaunchKernelEx / cuLaunchKernelEx_ptsz(
                config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
                extra: *mut *mut c_void,
            );
            h::launch_cooperative_kernel => fn cuLaunchCooperativeKernel / cuLaunchCooperativeKernel_ptsz(
                f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint,
                block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_mem_bytes: c_uint,
                stream: CUstream, params: *mut *mut c_void,
            );
            h::launch_cooperative_kernel_multi_device => fn cuLaunchCooperativeKernelMultiDevice(
                list: *mut CUDA_LAUNCH_PARAMS, num_devices: c_uint, flags: c_uint,
            );
            h::graph_launch => fn cuGraphLaunch / cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);

            // ---- stream capture (launches into a capture are charged at graph launch)
            h::stream_begin_capture => fn cuStreamBeginCapture / cuStreamBeginCapture_ptsz(stream: CUstream);
            h::stream_begin_capture_v2 => fn cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz(
                stream: CUstream, mode: c_uint,
            );
            h::stream_begin_capture_to_graph => fn cuStreamBeginCaptureToGraph / cuStreamBeginCaptureToGraph_ptsz(
                stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode,
                dependency_data: *const CUgraphEdgeData, num_dependencies: usize, mode: c_uint,
            );
            h::stream_end_capture => fn cuStreamEndCapture / cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph);

            // ---- stream and context lifetimes (streams a sample may record on) --
            // (the unsuffixed cuStreamDestroy and cuCtxDestroy are the pre-4.0 ABI;
            // cudart asks for the primary-context functions at version 7000, the
            // unsuffixed ones)
            h::stream_destroy => fn cuStreamDestroy_v2(stream: CUstream);
            h::ctx_destroy => fn cuCtxDestroy_v2(ctx: CUcontext);
            h::primary_ctx_end => fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
            h::primary_ctx_end => fn cuDevicePrimaryCtxRelease(dev: CUdevice);
            h::primary_ctx_end => fn cuDevicePrimaryCtxReset_v2(dev: CUdevice);
            h::primary_ctx_end => fn cuDevicePrimaryCtxReset(dev: CUdevice);

            // ---- waits on memory or semaphores: the program may order its streams
            // by values its later work writes (see sampler::program_orders_streams_itself)
            h::stream_wait_value32 => fn cuStreamWaitValue32 / cuStreamWaitValue32_ptsz(
                stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint,
            );
            h::stream_wait_value32 => fn cuStreamWaitValue32_v2 / cuStreamWaitValue32_v2_ptsz(
                stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint,
            );
            h::stream_wait_value64 => fn cuStreamWaitValue64 / cuStreamWaitValue64_ptsz(
                stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint,
            );
            h::stream_wait_value64 => fn cuStreamWaitValue64_v2 / cuStreamWaitValue64_v2_ptsz(
                stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint,
            );
            h::stream_batch_mem_op => fn cuStreamBatchMemOp / cuStreamBatchMemOp_ptsz(
                stream: CUstream, count: c_uint, params: *mut CUstreamBatchMemOpParams, flags: c_uint,
            );
            h::stream_batch_mem_op => fn cuStreamBatchMemOp_v2 / cuStreamBatchMemOp_v2_ptsz(
                stream: CUstream, count: c_uint, params: *mut CUstreamBatchMemOpParams, flags: c_uint,
            );
            h::wait_external_semaphores => fn cuWaitExternalSemaphoresAsync / cuWaitExternalSemaphoresAsync_ptsz(
                semaphores: *const CUexternalSemaphore,
                params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, count: c_uint, stream: CUstream,
            );

            // ---- synchronisation --------------------------------------------------
            h::stream_synchronize => fn cuStreamSynchronize / cuStreamSynchronize_ptsz(stream: CUstream);
            h::ctx_synchronize => fn cuCtxSynchronize();
            h::event_synchronize => fn cuEventSynchronize(event: CUevent);
        }
    };
}

pub(crate) use hooked_functions;
