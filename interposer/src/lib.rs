//! dilu interposer (skeleton arrives from the interposer branch).
#[allow(dead_code)]
mod alloc_table;
#[allow(dead_code)]
mod memory_config;
