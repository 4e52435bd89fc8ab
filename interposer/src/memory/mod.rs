//! Memory budgets: every allocation path is charged to the tenant's ledger
//! before the driver runs, and every free gives back what its allocation
//! was charged.
//!
//! - [`budget`]: the tenant's budget and ledger, reserve and release.
//! - [`alloc_table`]: what each live allocation was charged.
//! - [`hooks`], [`v1`]: hook bodies of the allocation, free and query rows
//!   (`_v2` and the pre-3.2 ABIs).
//! - [`graph_memory`]: CUDA graph memory nodes.
//! - [`driver_reserved`]: the device `malloc` heap and memory pools.
//! - [`ipc_sharing`]: memory other processes map (CUDA IPC handles),
//!   charged once, to its exporter, while any process maps it;
//!   [`vmm_sharing`]: the same for shareable VMM handles.
//! - [`nvml`]: NVML's memory queries, answered with the budget.
//! - [`at_fork`]: this state's part in fork safety.

pub mod alloc_table;
pub mod at_fork;
pub mod budget;
pub mod driver_reserved;
pub mod graph_memory;
pub mod hooks;
pub mod ipc_sharing;
pub mod nvml;
pub mod v1;
pub mod vmm_sharing;
