//! The measurements, one module per thing measured; each runs on the [`crate::harness`] and renders
//! its own section of BENCHMARKS.md.
//!
//! - [`machine`]: the machine, the tools' versions, the measured binaries and the images;
//! - [`webhook`]: admission throughput, latency and CPU of `cp-webhook` against the floor and the
//!   Go peer;
//! - [`criterion`]: handler CPU per request and the controller's aggregation (criterion's figures);
//! - [`controller`]: the controller's latency, requests, CPU, memory, aggregation and takeover;
//! - [`apiserver`]: admission through the API server, with and without the webhooks;
//! - [`node`]: memory and start-up of the two pods on the real node;
//! - [`fleet`]: the fleet dashboard's queries against a real Prometheus.

pub mod apiserver;
pub mod controller;
pub mod criterion;
pub mod fleet;
pub mod machine;
pub mod node;
pub mod webhook;
