//! Neighbours that mutate the module's pods, played by the test process as **stand-ins** and
//! registered in the API server as the real ones are (a `MutatingWebhookConfiguration` the API server
//! calls for every pod created in kyma-system):
//!
//! * the **Istio sidecar injector** stand-in (`/inject`): Istio's injector adds the `istio-proxy`
//!   container to every pod of a namespace with injection on, unless the pod opts out with the
//!   annotation `sidecar.istio.io/inject: "false"` (the operator's own pods do), and labels it
//!   `security.istio.io/tlsMode: istio`. The stand-in's `istio-proxy` is busybox: every 2 s it opens a
//!   TCP connection to the istiod stand-in on 15012 (as the real sidecar keeps its xDS and certificate
//!   stream to istiod open) and prints `xds 15012 reachable` or `xds 15012 unreachable`. It does not
//!   proxy the pod's traffic and speaks no xDS; it dials istiod's pod address, since the test node's
//!   DNS answers no Service names.
//! * the **runtime bootstrapper** stand-in (`/bootstrap`): Kyma's runtime bootstrapper rewrites the
//!   registry of every image to the landscape's mirror, adds the mirror's pull secret and a label. The
//!   stand-in rewrites every container's registry to [`MIRROR`], adds the pull secret [`PULL_SECRET`]
//!   and the label [`MIRROR_LABEL`]; it is invoked again after the injector (`reinvocationPolicy:
//!   IfNeeded`), so the injected container is rewritten too. The node serves the rewritten names from
//!   its own image store (the test tags them), so nothing is pulled.
//!
//! Both answer over HTTPS on the node's address inside the run's network namespace, with a
//! certificate of their own CA (the `caBundle` of the registration); the server stops when the
//! [`Neighbours`] value is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use serde_json::{Value, json};

/// The registry the bootstrapper stand-in rewrites every image to.
pub const MIRROR: &str = "mirror.node.test";
/// The pull secret it adds.
pub const PULL_SECRET: &str = "registry-mirror";
/// The label it adds.
pub const MIRROR_LABEL: (&str, &str) = ("kyma-project.io/registry-mirror", MIRROR);
/// The sidecar container the injector stand-in adds.
pub const SIDECAR: &str = "istio-proxy";
/// The registration's name.
pub const CONFIGURATION: &str = "stand-in-neighbours";

/// `image` with its registry replaced by [`MIRROR`] (an image without a registry is Docker Hub's).
pub fn mirrored(image: &str) -> String {
    let rest = match image.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            if first == MIRROR {
                return image.to_string();
            }
            rest
        }
        _ => image,
    };
    format!("{MIRROR}/{rest}")
}

/// Escapes a map key for a JSON pointer.
fn pointer_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The label `key: value` added to `pod` (JSON patch operations; none when it is there already).
fn add_label(pod: &Value, key: &str, value: &str) -> Vec<Value> {
    match pod.pointer("/metadata/labels") {
        Some(Value::Object(labels)) if labels.get(key).and_then(Value::as_str) == Some(value) => {
            vec![]
        }
        Some(Value::Object(_)) => vec![json!({"op": "add",
            "path": format!("/metadata/labels/{}", pointer_key(key)), "value": value})],
        _ => vec![json!({"op": "add", "path": "/metadata/labels", "value": {key: value}})],
    }
}

/// What the runtime bootstrapper stand-in changes in `pod`: every image's registry, the pull secret,
/// the label. Empty once applied (the reinvocation after the injector changes only what is new).
pub fn bootstrap_patch(pod: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    for list in ["initContainers", "containers"] {
        let containers = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, c) in containers.iter().enumerate() {
            if let Some(image) = c.get("image").and_then(Value::as_str) {
                let m = mirrored(image);
                if m != image {
                    ops.push(json!({"op": "replace", "path": format!("/spec/{list}/{i}/image"), "value": m}));
                }
            }
        }
    }
    match pod.pointer("/spec/imagePullSecrets").and_then(Value::as_array) {
        Some(secrets) if secrets.iter().any(|s| s["name"] == PULL_SECRET) => {}
        Some(_) => ops.push(
            json!({"op": "add", "path": "/spec/imagePullSecrets/-", "value": {"name": PULL_SECRET}}),
        ),
        None => ops.push(
            json!({"op": "add", "path": "/spec/imagePullSecrets", "value": [{"name": PULL_SECRET}]}),
        ),
    }
    ops.extend(add_label(pod, MIRROR_LABEL.0, MIRROR_LABEL.1));
    ops
}

/// The sidecar stand-in: dials `istiod` on 15012 every 2 s and says whether it connected; restricted
/// Pod Security (kyma-system enforces it), as Istio's own sidecar template satisfies it.
pub fn sidecar(istiod: &str) -> Value {
    json!({
        "name": SIDECAR,
        "image": "localhost/cp-node-busybox:0.1.0",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", format!(
            "while true; do if nc -w 2 {istiod} 15012 -e true; then echo 'xds 15012 reachable'; \
             else echo 'xds 15012 unreachable'; fi; sleep 2; done")],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": true, "runAsUser": 1337, "runAsGroup": 1337,
            "readOnlyRootFilesystem": true, "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}

/// What the Istio sidecar injector stand-in changes in `pod`: the sidecar and Istio's label, unless
/// the pod opts out or has its sidecar already.
pub fn inject_patch(pod: &Value, istiod: &str) -> Vec<Value> {
    let opted_out = pod
        .pointer("/metadata/annotations/sidecar.istio.io~1inject")
        .and_then(Value::as_str)
        == Some("false");
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if opted_out || containers.iter().any(|c| c["name"] == SIDECAR) {
        return vec![];
    }
    let mut ops =
        vec![json!({"op": "add", "path": "/spec/containers/-", "value": sidecar(istiod)})];
    ops.extend(add_label(pod, "security.istio.io/tlsMode", "istio"));
    ops
}

/// The AdmissionReview answering `review` for the webhook at `path`: allowed, with its patch.
pub fn answer(path: &str, review: &Value, istiod: &str) -> Value {
    let request = &review["request"];
    let pod = &request["object"];
    let ops = match path {
        "/inject" => inject_patch(pod, istiod),
        "/bootstrap" => bootstrap_patch(pod),
        _ => vec![],
    };
    let mut response = json!({"uid": request["uid"], "allowed": true});
    if !ops.is_empty() {
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(Value::Array(ops).to_string()));
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// The running stand-ins; the server stops when this is dropped.
pub struct Neighbours {
    /// `https://<node address>:<port>`.
    pub base_url: String,
    /// The CA of the serving certificate, PEM.
    pub ca_pem: String,
    /// Requests answered, all paths.
    pub calls: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Neighbours {
    /// Serves the stand-ins on the node's address in `netns`; the injector's sidecars dial `istiod`.
    pub fn start(netns: &crate::netns::Netns, istiod: &str) -> anyhow::Result<Neighbours> {
        let node_ip: std::net::IpAddr = crate::netns::NODE_IP.parse()?;
        let listener = netns.bind_tcp(SocketAddr::new(node_ip, 0))?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let (ca, leaf) = crate::stand_in_tls(
            "stand-in neighbour webhooks CA",
            "stand-in neighbour webhooks",
            &[],
            &[node_ip],
            1,
        )?;
        let acceptor = crate::tls_acceptor(&leaf)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let calls = Arc::new(AtomicUsize::new(0));
        let (counted, istiod) = (calls.clone(), istiod.to_string());
        crate::serve_on_thread(
            "stand-in-neighbours",
            listener,
            move |listener| async move {
                let serve = async {
                    while let Ok((s, _)) = listener.accept().await {
                        let (acceptor, istiod, calls) =
                            (acceptor.clone(), istiod.clone(), counted.clone());
                        tokio::spawn(async move {
                            if serve_one(s, acceptor, &istiod).await.is_ok() {
                                calls.fetch_add(1, Ordering::Relaxed);
                            }
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            },
        )?;
        Ok(Neighbours {
            base_url: format!("https://{node_ip}:{port}"),
            ca_pem: ca.cert_pem,
            calls,
            _stop: stop,
        })
    }

    /// The registration: both webhooks for pods created in kyma-system, the injector first, the
    /// bootstrapper invoked again after it; failing closed, as the real ones are registered.
    pub fn configuration(&self) -> Value {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let hook = |name: &str, path: &str| {
            json!({
                "name": name,
                "clientConfig": {"url": format!("{}{path}", self.base_url), "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels":
                    {"kubernetes.io/metadata.name": cp_api::names::KYMA_SYSTEM}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "timeoutSeconds": 5
            })
        };
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                hook("sidecar-injector.istio.stand-in.test", "/inject"),
                hook("runtime-bootstrapper.kyma.stand-in.test", "/bootstrap"),
            ]
        })
    }
}

/// One HTTP/1.1 request (the API server offers h2 and falls back, since no ALPN is agreed): the
/// AdmissionReview in, its answer out, the connection closed.
async fn serve_one(
    s: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    istiod: &str,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = std::time::Duration::from_secs(5);
    let mut s = tokio::time::timeout(deadline, acceptor.accept(s)).await??;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let (head_end, length) = loop {
        let n = tokio::time::timeout(deadline, s.read(&mut chunk)).await??;
        anyhow::ensure!(n > 0, "closed before the request ended");
        buf.extend_from_slice(&chunk[..n]);
        anyhow::ensure!(buf.len() < 8 * 1024 * 1024, "request too large");
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (end + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = tokio::time::timeout(deadline, s.read(&mut chunk)).await??;
        anyhow::ensure!(n > 0, "closed before the body ended");
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let review: Value = serde_json::from_slice(&buf[head_end..head_end + length])?;
    let body = answer(&path, &review, istiod).to_string();
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patched(pod: &Value, ops: Vec<Value>) -> Value {
        let mut pod = pod.clone();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
        pod
    }

    #[test]
    fn registries_are_rewritten_to_the_mirror_once() {
        for (image, want) in [
            (
                "docker.io/sapse/connectivity-proxy:2.17.0",
                "mirror.node.test/sapse/connectivity-proxy:2.17.0",
            ),
            (
                "localhost/cp-node-busybox:0.1.0",
                "mirror.node.test/cp-node-busybox:0.1.0",
            ),
            ("busybox:1.36", "mirror.node.test/busybox:1.36"),
            ("library/busybox", "mirror.node.test/library/busybox"),
            ("registry:5000/a/b", "mirror.node.test/a/b"),
            ("mirror.node.test/a:1", "mirror.node.test/a:1"),
        ] {
            assert_eq!(mirrored(image), want, "{image}");
        }
    }

    #[test]
    fn the_bootstrapper_rewrites_every_image_adds_its_secret_and_label_and_then_nothing() {
        let pod = json!({"metadata": {"labels": {"app": "x"}}, "spec": {
            "initContainers": [{"name": "i", "image": "docker.io/a/b:1"}],
            "containers": [{"name": "c", "image": "localhost/c:2"}],
            "imagePullSecrets": [{"name": "own"}]}});
        let once = patched(&pod, bootstrap_patch(&pod));
        assert_eq!(
            once["spec"]["initContainers"][0]["image"],
            "mirror.node.test/a/b:1"
        );
        assert_eq!(
            once["spec"]["containers"][0]["image"],
            "mirror.node.test/c:2"
        );
        assert_eq!(
            once["spec"]["imagePullSecrets"],
            json!([{"name": "own"}, {"name": PULL_SECRET}])
        );
        assert_eq!(once["metadata"]["labels"][MIRROR_LABEL.0], MIRROR);
        assert_eq!(once["metadata"]["labels"]["app"], "x");
        assert!(
            bootstrap_patch(&once).is_empty(),
            "a reinvocation changes nothing"
        );
        let bare = json!({"metadata": {}, "spec": {"containers": [{"name": "c", "image": "c"}]}});
        let once = patched(&bare, bootstrap_patch(&bare));
        assert_eq!(
            once["spec"]["imagePullSecrets"],
            json!([{"name": PULL_SECRET}])
        );
        assert_eq!(once["metadata"]["labels"][MIRROR_LABEL.0], MIRROR);
    }

    #[test]
    fn the_injector_adds_one_sidecar_unless_the_pod_opts_out() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "c"}]}});
        let once = patched(&pod, inject_patch(&pod, "10.0.0.9"));
        let containers = once["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 2);
        assert_eq!(containers[1]["name"], SIDECAR);
        assert!(
            containers[1]["command"][2]
                .as_str()
                .unwrap()
                .contains("nc -w 2 10.0.0.9 15012")
        );
        assert_eq!(
            once["metadata"]["labels"]["security.istio.io/tlsMode"],
            "istio"
        );
        assert!(inject_patch(&once, "10.0.0.9").is_empty());
        let out = json!({"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
                         "spec": {"containers": [{"name": "c"}]}});
        assert!(inject_patch(&out, "10.0.0.9").is_empty());
    }

    #[test]
    fn the_answer_echoes_the_uid_and_carries_the_patch_in_base64() {
        let review = json!({"request": {"uid": "u-1", "object":
            {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "c"}]}}}});
        let a = answer("/bootstrap", &review, "x");
        assert_eq!(a["response"]["uid"], "u-1");
        assert_eq!(a["response"]["allowed"], true);
        let patch = base64::engine::general_purpose::STANDARD
            .decode(a["response"]["patch"].as_str().unwrap())
            .unwrap();
        let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
        assert!(!ops.is_empty());
        let none = answer("/elsewhere", &review, "x");
        assert!(none["response"].get("patch").is_none());
    }
}
