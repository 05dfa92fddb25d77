//! Controller integration tests on their own control plane: one ConnectivityProxy per cluster is the
//! rule, so these tests take turns ([`cp_tests::support::scenario`]) and clean up after themselves.
#![forbid(unsafe_code)]

mod bounded;
mod btp_mappings;
mod honest_state;
mod install;
mod side_doors;
mod stolen_token;
mod takeover_marks;
