//! Controller integration tests on their own control plane: one ConnectivityProxy per cluster is the
//! rule, so these tests take turns ([`support::scenario`]) and clean up after themselves.
#![forbid(unsafe_code)]

mod btp_mappings;
#[allow(dead_code)]
#[path = "../e2e/common.rs"]
mod common;
mod install;
mod support;
