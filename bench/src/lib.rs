//! `make bench`: measures the webhook and the controller and writes `BENCHMARKS.md`.
#![forbid(unsafe_code)]

pub mod ceiling;
pub mod controller;
pub mod load;
pub mod reviews;
