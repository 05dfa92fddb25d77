//! The controller library's tests that need no API server, no root and no release build
//! (`make check` runs them): the Connectivity CA fetch's egress checks on loopback, the legacy import's
//! fidelity read back by PyYAML, the dashboards and alerts against the exported metrics, and (ignored;
//! `make check-reference`) the upstream legacy configuration's import.
#![forbid(unsafe_code)]

mod ca_egress;
mod fidelity;
mod monitoring;
mod reference;
