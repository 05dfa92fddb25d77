//! `make bench`: measures the webhook and the controller and writes `BENCHMARKS.md`.
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod controller;
pub mod floor;
pub mod load;
pub mod node;
pub mod reviews;
pub mod webhook;
