//! cluster-lite.
