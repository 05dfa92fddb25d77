//! Integration tests on a real local control plane (etcd, kube-apiserver, kube-controller-manager).
//!
//! Each module is a test group ([`cp_tests::group`]): its tests share one control plane of their own,
//! started on first use and stopped when the next group starts, and never run beside another group's.
//! Groups that kill or restart the API server (`restart_*`) or run their own controllers
//! (`certs`, `drift`, `migration*`, `reliability`) keep the fresh control plane they had as binaries
//! of their own.
#![forbid(unsafe_code)]

mod budget;
mod certs;
mod controller;
mod drift;
mod e2e;
mod fips;
mod fips_controller;
mod migration;
mod migration_again;
mod migration_crash;
mod migration_preview;
mod ownership;
mod ownership_backup;
mod reliability;
mod restart_migration;
mod restart_reconcile;
