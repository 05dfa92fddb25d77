//! The StatefulSet, its Services and its PriorityClass.

use cp_api::cp::{Deployment, Image};
use cp_api::{ConnectivityProxy, defaults, names};
use serde_json::{Value, json};

use super::{Desired, Kind, Resolved, object};

/// Pod label selecting the proxy (kept from the legacy chart so Services select old and new pods).
pub const APP: &str = "connectivity-proxy";

fn image_ref(image: &Image) -> String {
    match image.digest.as_deref().filter(|d| !d.is_empty()) {
        Some(d) => format!("{}/{}@{d}", image.registry, image.repository),
        None => format!("{}/{}:{}", image.registry, image.repository, image.tag),
    }
}

/// `spec.deployment` with this release's defaults filled in where missing.
pub fn effective_deployment(cr: &ConnectivityProxy) -> Deployment {
    let mut current = serde_json::to_value(&cr.spec.deployment).unwrap_or(Value::Null);
    if current.is_null() {
        current = json!({});
    }
    defaults::fill_missing(&mut current, &defaults::deployment_defaults_json());
    serde_json::from_value(current).unwrap_or_else(|_| defaults::deployment_defaults())
}

pub(super) fn priority_class(cr: &ConnectivityProxy) -> Desired {
    object(
        cr,
        Kind::PriorityClass,
        None,
        names::PRIORITY_CLASS,
        json!({
            "value": 2000000,
            "globalDefault": false,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "Connectivity Proxy: keeps the tunnel to the Cloud Connector scheduled before ordinary workloads."
        }),
    )
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

pub(super) fn services(cr: &ConnectivityProxy, ns: &str) -> Vec<Desired> {
    let ports: Vec<Value> = proxy_ports(cr)
        .into_iter()
        .map(|(name, port)| json!({"name": name, "port": port, "targetPort": port, "protocol": "TCP"}))
        .collect();
    let tunnel = |name: &str| json!([{"name": name, "port": names::TUNNEL_PORT, "targetPort": names::TUNNEL_PORT, "protocol": "TCP"}]);
    vec![
        object(
            cr,
            Kind::Service,
            Some(ns),
            names::SERVICE,
            json!({"spec": {"selector": {"app": APP}, "ports": ports}}),
        ),
        object(
            cr,
            Kind::Service,
            Some(ns),
            names::SERVICE_TUNNEL,
            json!({"spec": {"selector": {"app": APP}, "ports": tunnel("http2-tunnel")}}),
        ),
        object(
            cr,
            Kind::Service,
            Some(ns),
            names::SERVICE_TUNNEL_HEALTHCHECK,
            json!({"spec": {"selector": {"app": APP}, "ports": tunnel("tcp-healthcheck")}}),
        ),
    ]
}

pub(super) fn stateful_set(cr: &ConnectivityProxy, ns: &str, resolved: &Resolved) -> Desired {
    let d = effective_deployment(cr);
    let image = d.image.clone().unwrap_or_default();
    let utility = d.utility_image.clone().unwrap_or_default();
    let resources = d.resources.clone().unwrap_or_default();
    let fd = resources.max_file_descriptor_count.unwrap_or(64000);
    let mut container_ports =
        vec![json!({"name": "tunnel", "containerPort": names::TUNNEL_PORT, "protocol": "TCP"})];
    container_ports.extend(
        proxy_ports(cr)
            .into_iter()
            .map(|(name, port)| json!({"name": name.chars().take(15).collect::<String>(), "containerPort": port, "protocol": "TCP"})),
    );
    let quantities = |q: &Option<cp_api::cp::CpuMemory>| {
        q.as_ref()
            .map(|q| json!({"cpu": q.cpu, "memory": q.memory}))
            .unwrap_or(json!({}))
    };
    let restricted = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": true,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    let auditlog = cr
        .spec
        .secret_config
        .as_ref()
        .and_then(|s| s.integration.as_ref())
        .and_then(|i| i.auditlog_service.as_ref())
        .map(|a| a.secret_name.clone());
    let mut secret_sources = vec![json!({"secret": {"name": resolved.service_key_secret}})];
    if let Some(a) = auditlog.filter(|a| !a.is_empty()) {
        secret_sources.push(json!({"secret": {"name": a, "optional": true}}));
    }
    // Rolling the pods on configuration changes is the restart watcher's job; the hash of the rendered
    // configuration in the pod template does it without a separate process.
    let mut template_annotations = json!({});
    if d.restart_watcher.as_ref().is_none_or(|r| r.enabled) {
        template_annotations["connectivityproxy.sap.com/config-hash"] =
            json!(super::hash_str(&super::render_config(cr, resolved)));
        if let Some(h) = &resolved.secrets_hash {
            template_annotations["connectivityproxy.sap.com/secrets-hash"] = json!(h);
        }
    }
    let mut pod_spec = json!({
        "priorityClassName": names::PRIORITY_CLASS,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "runAsGroup": 3000,
            "fsGroup": 3000,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [APP]}]},
                "topologyKey": "topology.kubernetes.io/zone"
            }
        }]}},
        "initContainers": [{
            "name": "init-fd-limit",
            "image": image_ref(&utility),
            "imagePullPolicy": utility.pull_policy.clone().unwrap_or_else(|| "IfNotPresent".into()),
            // Fails early when the node cannot give the proxy the file descriptors it needs.
            "command": ["sh", "-c", format!("ulimit -n {fd}")],
            "securityContext": restricted.clone(),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}}
        }],
        "containers": [{
            "name": "connectivity-proxy",
            "image": image_ref(&image),
            "imagePullPolicy": image.pull_policy.clone().unwrap_or_else(|| "IfNotPresent".into()),
            "ports": container_ports,
            "env": [
                {"name": "START_APPLICATION", "value": "connectivity-proxy"},
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"containerName": "connectivity-proxy", "resource": "limits.cpu", "divisor": "1m"}}}
            ],
            "readinessProbe": {"tcpSocket": {"port": names::TUNNEL_PORT}},
            "livenessProbe": {"tcpSocket": {"port": names::TUNNEL_PORT}},
            "startupProbe": {"tcpSocket": {"port": names::TUNNEL_PORT}, "failureThreshold": 30, "periodSeconds": 10},
            "resources": {"requests": quantities(&resources.requests), "limits": quantities(&resources.limits)},
            "securityContext": restricted,
            "volumeMounts": [
                {"name": "connectivity-proxy-config", "mountPath": "/etc/connectivity/properties/user-provided", "readOnly": true},
                {"name": "connectivity-proxy-service-mappings", "mountPath": "/etc/connectivity/properties/servicemappings", "readOnly": true},
                {"name": "connectivity-proxy-secrets", "mountPath": "/etc/connectivity/secrets", "readOnly": true}
            ]
        }],
        "volumes": [
            {"name": "connectivity-proxy-config", "configMap": {"name": names::CONFIGMAP_CONFIG}},
            {"name": "connectivity-proxy-service-mappings", "configMap": {"name": names::CONFIGMAP_SERVICE_MAPPINGS}},
            {"name": "connectivity-proxy-secrets", "projected": {"sources": secret_sources}}
        ]
    });
    if let Some(sel) = d.node_selector.as_ref().filter(|s| !s.is_empty()) {
        pod_spec["nodeSelector"] = json!(sel);
    }
    let pull_secrets: Vec<Value> = [&image, &utility]
        .iter()
        .filter_map(|i| i.pull_secret.clone().filter(|s| !s.is_empty()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|name| json!({"name": name}))
        .collect();
    if !pull_secrets.is_empty() {
        pod_spec["imagePullSecrets"] = json!(pull_secrets);
    }
    let mut pod_labels = names::managed_labels();
    pod_labels.insert("app".into(), APP.into());
    object(
        cr,
        Kind::StatefulSet,
        Some(ns),
        names::STATEFULSET,
        json!({"spec": {
            "replicas": d.replica_count.unwrap_or(1),
            "podManagementPolicy": "Parallel",
            "serviceName": names::SERVICE_TUNNEL,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": template_annotations},
                "spec": pod_spec
            }
        }}),
    )
}
