//! Tests on a real node (kubelet + containerd in a network namespace of its own) and with the images
//! `make images` builds (podman); they need root. Each module is a test group ([`cp_tests::group`]):
//! a cluster (or control plane) of its own, stopped before the next group starts.
#![forbid(unsafe_code)]

mod images;
mod lifecycle;
mod neighbours;
mod node;
mod node_legacy;
