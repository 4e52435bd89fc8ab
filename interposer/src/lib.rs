//! dilu interposer.
