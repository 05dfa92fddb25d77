//! `make bench`: measures the webhook and the controller and writes `BENCHMARKS.md`.
//!
//! [`harness`] is what every measurement shares (starting and stopping what is measured, the load
//! generator, `/proc` and cgroup readings, watches, statistics, the report's words); [`measure`]
//! holds one module per thing measured. [`floor`] is the floor server the webhook is compared with,
//! [`reviews`] the AdmissionReviews every webhook under test answers.
#![forbid(unsafe_code)]

pub mod floor;
pub mod harness;
pub mod measure;
pub mod reviews;
