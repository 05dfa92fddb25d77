//! The module's alert rules and dashboards judged by Prometheus itself (built from its Go module by
//! `hack/prom-bins.sh`): promtool's rule unit tests for every alert, and the fleet dashboard's queries
//! against a Prometheus holding a fleet's worth of backfilled series. The in-cluster dashboard's queries
//! are asked of a Prometheus that scrapes the operator's pods on the real node (`node` tests).
#![forbid(unsafe_code)]

mod alerts;
mod fleet;
