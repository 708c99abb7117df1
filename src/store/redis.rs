//! The Redis store (work in progress).
