//! The StatefulSet, its Services and its PriorityClass.

use std::collections::BTreeMap;

use cp_api::cp::{Deployment, Image};
use cp_api::validation::is_operator_secret;
use cp_api::{ConnectivityProxy, defaults, names};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    EnvVar, EnvVarSource, KeyToPath, LocalObjectReference, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource,
    ResourceFieldSelector, ResourceRequirements, SeccompProfile, SecretProjection, SecurityContext,
    Service, ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount, VolumeProjection,
    WeightedPodAffinityTerm,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::{Desired, Kind, Resolved, body, object};

/// Pod label selecting the proxy (kept from the legacy chart so Services select old and new pods).
pub const APP: &str = "connectivity-proxy";

/// `spec.deployment` with this release's defaults filled in where missing.
pub fn effective_deployment(cr: &ConnectivityProxy) -> Deployment {
    let mut current = serde_json::to_value(&cr.spec.deployment).unwrap_or(Value::Null);
    if current.is_null() {
        current = Value::Object(Default::default());
    }
    defaults::fill_missing(&mut current, &defaults::deployment_defaults_json());
    serde_json::from_value(current).unwrap_or_else(|_| defaults::deployment_defaults())
}

pub(super) fn priority_class(cr: &ConnectivityProxy) -> Desired {
    let pc = PriorityClass {
        value: Some(names::PRIORITY_CLASS_VALUE),
        global_default: Some(false),
        preemption_policy: Some("PreemptLowerPriority".into()),
        description: Some(
            "Connectivity Proxy: keeps the tunnel to the Cloud Connector scheduled before ordinary workloads."
                .into(),
        ),
        ..PriorityClass::default()
    };
    object(
        cr,
        Kind::PriorityClass,
        None,
        names::PRIORITY_CLASS,
        body(&pc),
    )
}

fn tcp_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

fn service(cr: &ConnectivityProxy, ns: &str, name: &str, ports: Vec<ServicePort>) -> Desired {
    let svc = Service {
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".to_string(), APP.to_string())])),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    object(cr, Kind::Service, Some(ns), name, body(&svc))
}

pub(super) fn services(cr: &ConnectivityProxy, ns: &str) -> Vec<Desired> {
    let ports = proxy_ports(cr)
        .into_iter()
        .map(|(name, port)| tcp_port(&name, port))
        .collect();
    vec![
        service(cr, ns, names::SERVICE, ports),
        service(
            cr,
            ns,
            names::SERVICE_TUNNEL,
            vec![tcp_port("http2-tunnel", names::TUNNEL_PORT)],
        ),
        service(
            cr,
            ns,
            names::SERVICE_TUNNEL_HEALTHCHECK,
            vec![tcp_port("tcp-healthcheck", names::TUNNEL_PORT)],
        ),
    ]
}

/// The proxy container's ports: the tunnel and every enabled proxy.
pub(super) fn container_ports(cr: &ConnectivityProxy) -> Vec<i32> {
    std::iter::once(names::TUNNEL_PORT)
        .chain(proxy_ports(cr).into_iter().map(|(_, p)| p))
        .collect()
}

fn proxy_ports(cr: &ConnectivityProxy) -> Vec<(String, i32)> {
    cr.spec
        .proxies()
        .into_iter()
        .filter(|(_, p)| p.enabled.unwrap_or(true))
        .map(|(name, p)| {
            let port_name = match name {
                "http" => "http-proxy",
                "rfcAndLdap" => "tcp-rfc-ldap",
                _ => "tcp-socks5",
            };
            (port_name.to_string(), p.port.unwrap_or_default())
        })
        .collect()
}

fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        run_as_non_root: Some(true),
        seccomp_profile: Some(runtime_default()),
        ..SecurityContext::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..SeccompProfile::default()
    }
}

fn quantities(q: &Option<cp_api::cp::CpuMemory>) -> Option<BTreeMap<String, Quantity>> {
    Some(
        q.as_ref()
            .map(|q| {
                BTreeMap::from([
                    ("cpu".to_string(), Quantity(q.cpu.clone())),
                    ("memory".to_string(), Quantity(q.memory.clone())),
                ])
            })
            .unwrap_or_default(),
    )
}

fn tcp_probe(extra: impl FnOnce(&mut Probe)) -> Option<Probe> {
    let mut p = Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(names::TUNNEL_PORT),
            ..TCPSocketAction::default()
        }),
        ..Probe::default()
    };
    extra(&mut p);
    Some(p)
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn config_map_volume(name: &str, config_map: &str) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.into(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The mapping shards as one directory, file by file: the first ConfigMap (`servicemappings`, the file
/// the proxy has always read) is required, the others are optional, so that a shard that appears or
/// goes when the mappings grow or shrink changes files, not the pod template (no restart).
fn mapping_shards_volume() -> Volume {
    let sources = names::MAPPING_SHARD_CONFIGMAPS
        .iter()
        .zip(names::MAPPING_SHARD_KEYS)
        .enumerate()
        .map(|(i, (name, key))| VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: name.to_string(),
                items: Some(vec![KeyToPath {
                    key: key.into(),
                    path: key.into(),
                    ..KeyToPath::default()
                }]),
                optional: (i > 0).then_some(true),
            }),
            ..VolumeProjection::default()
        })
        .collect();
    Volume {
        name: "connectivity-proxy-service-mappings".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn secret_projection(name: String, optional: bool) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name,
            optional: optional.then_some(true),
            ..SecretProjection::default()
        }),
        ..VolumeProjection::default()
    }
}

/// The init container: fails early when the node cannot give the proxy the file descriptors it needs.
fn fd_limit_container(utility: &Image, fd: i64) -> Container {
    Container {
        name: "init-fd-limit".into(),
        image: Some(utility.reference()),
        image_pull_policy: Some(pull_policy(utility)),
        command: Some(vec!["sh".into(), "-c".into(), format!("ulimit -n {fd}")]),
        security_context: Some(restricted()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("100m".into())),
                ("memory".to_string(), Quantity("32Mi".into())),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

fn pull_policy(image: &Image) -> String {
    image
        .pull_policy
        .clone()
        .unwrap_or_else(|| "IfNotPresent".into())
}

fn proxy_container(
    cr: &ConnectivityProxy,
    image: &Image,
    resources: &cp_api::cp::Resources,
) -> Container {
    let mut ports = vec![ContainerPort {
        name: Some("tunnel".into()),
        container_port: names::TUNNEL_PORT,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }];
    ports.extend(
        proxy_ports(cr)
            .into_iter()
            .map(|(name, port)| ContainerPort {
                name: Some(name.chars().take(15).collect()),
                container_port: port,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }),
    );
    Container {
        name: "connectivity-proxy".into(),
        image: Some(image.reference()),
        image_pull_policy: Some(pull_policy(image)),
        ports: Some(ports),
        env: Some(vec![
            EnvVar {
                name: "START_APPLICATION".into(),
                value: Some("connectivity-proxy".into()),
                ..EnvVar::default()
            },
            EnvVar {
                name: "CPU_LIMIT".into(),
                value_from: Some(EnvVarSource {
                    resource_field_ref: Some(ResourceFieldSelector {
                        container_name: Some("connectivity-proxy".into()),
                        resource: "limits.cpu".into(),
                        divisor: Some(Quantity("1m".into())),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        ]),
        readiness_probe: tcp_probe(|_| {}),
        liveness_probe: tcp_probe(|_| {}),
        startup_probe: tcp_probe(|p| {
            p.failure_threshold = Some(30);
            p.period_seconds = Some(10);
        }),
        resources: Some(ResourceRequirements {
            requests: quantities(&resources.requests),
            limits: quantities(&resources.limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted()),
        volume_mounts: Some(vec![
            mount(
                "connectivity-proxy-config",
                "/etc/connectivity/properties/user-provided",
            ),
            mount(
                "connectivity-proxy-service-mappings",
                "/etc/connectivity/properties/servicemappings",
            ),
            mount("connectivity-proxy-secrets", "/etc/connectivity/secrets"),
        ]),
        ..Container::default()
    }
}

fn anti_affinity() -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_expressions: Some(vec![LabelSelectorRequirement {
                                key: "app".into(),
                                operator: "In".into(),
                                values: Some(vec![APP.into()]),
                            }]),
                            ..LabelSelector::default()
                        }),
                        topology_key: "topology.kubernetes.io/zone".into(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

fn pod_spec(cr: &ConnectivityProxy, d: &Deployment, resolved: &Resolved) -> PodSpec {
    let image = d.image.clone().unwrap_or_default();
    let utility = d.utility_image.clone().unwrap_or_default();
    let resources = d.resources.clone().unwrap_or_default();
    let fd = resources
        .max_file_descriptor_count
        .unwrap_or(cp_api::defaults::MAX_FILE_DESCRIPTORS);
    // A user-named Secret is projected whole: one of the operator's own (the webhook CA's `ca.key`)
    // never is, even for a CR admitted before admission checked the name (resolve refuses it too).
    let auditlog = resolved
        .auditlog_secret
        .clone()
        .filter(|a| !is_operator_secret(a));
    let mut sources: Vec<VolumeProjection> = Some(resolved.service_key_secret.clone())
        .filter(|s| !is_operator_secret(s))
        .map(|s| secret_projection(s, false))
        .into_iter()
        .collect();
    sources.extend(auditlog.map(|a| secret_projection(a, true)));
    let pull_secrets: Vec<LocalObjectReference> = [&image, &utility]
        .iter()
        .filter_map(|i| i.pull_secret.clone().filter(|s| !s.is_empty()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|name| LocalObjectReference { name })
        .collect();
    PodSpec {
        priority_class_name: Some(names::PRIORITY_CLASS.into()),
        termination_grace_period_seconds: Some(30),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            fs_group: Some(3000),
            seccomp_profile: Some(runtime_default()),
            ..PodSecurityContext::default()
        }),
        affinity: Some(anti_affinity()),
        init_containers: Some(vec![fd_limit_container(&utility, fd)]),
        containers: vec![proxy_container(cr, &image, &resources)],
        volumes: Some(vec![
            config_map_volume("connectivity-proxy-config", names::CONFIGMAP_CONFIG),
            mapping_shards_volume(),
            Volume {
                name: "connectivity-proxy-secrets".into(),
                projected: Some(ProjectedVolumeSource {
                    sources: Some(sources),
                    ..ProjectedVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        node_selector: d.node_selector.clone().filter(|s| !s.is_empty()),
        image_pull_secrets: (!pull_secrets.is_empty()).then_some(pull_secrets),
        ..PodSpec::default()
    }
}

pub(super) fn stateful_set(cr: &ConnectivityProxy, ns: &str, resolved: &Resolved) -> Desired {
    let d = effective_deployment(cr);
    // Rolling the pods on configuration changes is the restart watcher's job; the hash of the rendered
    // configuration in the pod template does it without a separate process.
    let mut template_annotations = BTreeMap::new();
    if d.restart_watcher.as_ref().is_none_or(|r| r.enabled) {
        template_annotations.insert(
            cp_api::keys::CONFIG_HASH_ANNOTATION.to_string(),
            super::hash_str(&super::render_config(cr, resolved)),
        );
        if let Some(h) = &resolved.secrets_hash {
            template_annotations
                .insert(cp_api::keys::SECRETS_HASH_ANNOTATION.to_string(), h.clone());
        }
    }
    let mut pod_labels = names::managed_labels();
    pod_labels.insert("app".into(), APP.into());
    let (k, v) = super::network::FROM_INGRESS_GATEWAY_LABEL;
    pod_labels.insert(k.into(), v.into());
    let sts = StatefulSet {
        spec: StatefulSetSpec {
            replicas: Some(d.replica_count.unwrap_or(1)),
            pod_management_policy: Some("Parallel".into()),
            service_name: Some(names::SERVICE_TUNNEL.into()),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), APP.to_string())])),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(template_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(cr, &d, resolved)),
            },
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    };
    object(
        cr,
        Kind::StatefulSet,
        Some(ns),
        names::STATEFULSET,
        body(&sts),
    )
}
