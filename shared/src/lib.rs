//! API of the Connectivity Proxy module operator: the CRD types, the names of everything it manages,
//! this release's protected defaults, the protected-field policy and the validation rules.
//!
//! The webhook and the controller both depend on this crate, so anything the webhook admits the
//! controller can reconcile.
#![forbid(unsafe_code)]

pub mod admission_config;
pub mod bundle;
pub mod cp;
pub mod crds;
pub mod defaults;
pub mod mapping;
pub mod names;
pub mod policy;
pub mod status;
pub mod validation;

pub use cp::{ConnectivityProxy, ConnectivityProxySpec};
pub use mapping::{ServiceMapping, ServiceMappingSpec};
pub use status::{ModuleStatus, State};

#[cfg(test)]
mod validation_tests;
