//! simgpu: see README.md.
