//! Handler CPU per admission request: decode, review and encode the answer, without TLS or HTTP.
//! Run by `make bench`; the figures land in BENCHMARKS.md.

use std::hint::black_box;

use cp_webhook::admission::{self, ClusterView, Endpoint, Policy};
use criterion::{Criterion, criterion_group, criterion_main};

/// cp-webhook's allocator (`cp_webhook::memory`), so the figures are the shipped binary's.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

fn handle(endpoint: Endpoint, body: &[u8], policy: &Policy) -> Vec<u8> {
    let Ok(req) = admission::decode(body) else {
        return Vec::new();
    };
    let (resp, _) = admission::review(endpoint, &req, policy, &ClusterView::default);
    admission::encode_response(resp).unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let policy = Policy {
        privileged: cp_api::policy::PrivilegedIdentities {
            users: vec!["system:serviceaccount:kyma-system:connectivity-proxy-controller".into()],
            groups: vec!["system:masters".into()],
        },
    };
    let mutate = cp_bench::reviews::mutate_create().expect("mutate review");
    let validate = cp_bench::reviews::validate_update().expect("validate review");
    assert!(
        String::from_utf8_lossy(&handle(Endpoint::Mutate, &mutate, &policy)).contains("\"patch\""),
        "the mutate review must produce a patch"
    );
    let mut group = c.benchmark_group("handler");
    group.bench_function("mutate", |b| {
        b.iter(|| handle(Endpoint::Mutate, black_box(&mutate), &policy))
    });
    group.bench_function("validate", |b| {
        b.iter(|| handle(Endpoint::Validate, black_box(&validate), &policy))
    });
    group.finish();
    // The controller's pure aggregation of 10,000 ServiceMappings into the ConfigMap JSON.
    let mappings: Vec<_> = (0..10_000)
        .map(|i| {
            std::sync::Arc::new(
                serde_json::from_value::<cp_api::ServiceMapping>(serde_json::json!({
                    "apiVersion": "connectivityproxy.sap.com/v1", "kind": "ServiceMapping",
                    "metadata": {"name": format!("m-{i:05}")},
                    "spec": {"type": "TCP", "serviceId": format!("m-{i:05}"), "internalAddress": "h:80"}
                }))
                .expect("mapping"),
            )
        })
        .collect();
    let mut group = c.benchmark_group("controller");
    group.sample_size(20);
    group.bench_function("aggregate_10000_mappings", |b| {
        b.iter(|| cp_controller::desired::service_mappings_json(black_box(&mappings)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
