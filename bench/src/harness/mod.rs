//! The one harness every measurement ([`crate::measure`]) uses:
//!
//! - [`plane`]: starting and stopping what is measured (a local control plane, the real node),
//!   processes by name, pausing and pinning them;
//! - [`procfs`]: CPU time, memory, stolen time and CFS throttling from `/proc` and the cgroups;
//! - [`load`]: the HTTPS load generator (closed loop, fresh connections, open loop);
//! - [`watch`]: moments taken from watch events;
//! - [`stats`]: percentiles (one nearest-rank rule), medians, ranges, milliseconds;
//! - [`mappings`]: the ServiceMappings every section creates;
//! - [`metrics`]: the measured processes' Prometheus metrics;
//! - [`report`]: the document's head, its verdict words and units, writing the file.

pub mod load;
pub mod mappings;
pub mod metrics;
pub mod plane;
pub mod procfs;
pub mod report;
pub mod stats;
pub mod watch;
