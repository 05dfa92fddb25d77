//! Integration tests against the real local control plane (one per test binary, shared).
#![forbid(unsafe_code)]

mod dashboard;
mod foundation;
mod security;
mod webhook;
