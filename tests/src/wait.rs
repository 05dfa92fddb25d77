//! Waiting on conditions with a deadline: the only synchronisation tests use; and the waits every
//! suite needs (admission through the webhook).

use std::future::Future;
use std::time::Duration;

/// Polls `check` every 50 ms (backing off to 500 ms) until it returns `Some`, or fails after
/// `timeout` with `what` and the last observation.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(50);
    let mut last;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last = "condition not met".into(),
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// Polls object `name` of `api` until `check` on it returns `Some` (`Err(why)`: not yet, and why),
/// or fails after `timeout` with `what` and the last observation (or the last failed read).
pub async fn until_object<K, T, C>(
    api: &kube::api::Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    check: C,
) -> anyhow::Result<T>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    C: Fn(K) -> Result<Option<T>, String>,
{
    let check = &check;
    until(what, timeout, || {
        let api = api.clone();
        async move { check(api.get(name).await.map_err(|e| e.to_string())?) }
    })
    .await
}

/// Waits until `api`'s object `name` carries annotation `key`; fails after `timeout` with `what`.
pub async fn until_annotated<K>(
    api: &kube::api::Api<K>,
    name: &str,
    key: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until_object(
        api,
        name,
        what,
        timeout,
        |o| match kube::ResourceExt::annotations(&o).contains_key(key) {
            true => Ok(Some(())),
            false => Err(format!("no annotation {key} yet")),
        },
    )
    .await
}

/// Waits until an admission policy refuses (403 or 422) a label change of `api`'s object `name`, then
/// removes the probe label through `admin` (the same kind, with the right to); fails after `timeout`
/// with `what`. Each probe sets label `cp-test/probe` to a new value, so a probe admitted before the
/// policy is in force changes nothing that matters.
pub async fn label_change_refused<K>(
    api: &kube::api::Api<K>,
    admin: &kube::api::Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::api::{Patch, PatchParams};
    let label =
        |v: serde_json::Value| serde_json::json!({"metadata": {"labels": {"cp-test/probe": v}}});
    let n = std::sync::atomic::AtomicU32::new(0);
    until(what, timeout, || async {
        let p = label(
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                .to_string()
                .into(),
        );
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&p))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Ok(Some(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let unprobe = label(serde_json::Value::Null);
    admin
        .patch(name, &PatchParams::default(), &Patch::Merge(&unprobe))
        .await
        .map_err(|e| anyhow::anyhow!("removing the probe label: {e}"))?;
    Ok(())
}

/// `api.get(name)` for a wait's check: a failed read becomes the observation (`Err` with its text).
pub async fn get<K>(api: &kube::api::Api<K>, name: &str) -> Result<K, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get(name).await.map_err(|e| e.to_string())
}

/// `api.get_opt(name)` for a wait's check ([`get`]).
pub async fn get_opt<K>(api: &kube::api::Api<K>, name: &str) -> Result<Option<K>, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map_err(|e| e.to_string())
}

/// Every object of `api` for a wait's check ([`get`]).
pub async fn list<K>(api: &kube::api::Api<K>) -> Result<kube::core::ObjectList<K>, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&Default::default())
        .await
        .map_err(|e| e.to_string())
}

/// Waits until `api`'s object `name` exists; fails after `timeout`.
pub async fn present<K>(
    api: &kube::api::Api<K>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    presence(api, name, true, timeout).await
}

/// Waits until `api`'s object `name` does not exist; fails after `timeout`.
pub async fn gone<K>(api: &kube::api::Api<K>, name: &str, timeout: Duration) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    presence(api, name, false, timeout).await
}

async fn presence<K>(
    api: &kube::api::Api<K>,
    name: &str,
    wanted: bool,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!("{name} {}", if wanted { "there" } else { "gone" });
    until(&what, timeout, || async {
        match (api.get_opt(name).await.map_err(|e| e.to_string())?, wanted) {
            (Some(_), true) | (None, false) => Ok(Some(())),
            (Some(_), false) => Err(format!("{name} is still there")),
            (None, true) => Err(format!("no {name} yet")),
        }
    })
    .await
}

/// Waits until this host's clock (the API server's) is a whole second past `meta`'s
/// creationTimestamp, so that an object created next is strictly younger (timestamps have
/// one-second resolution). Panics without one: for tests.
pub async fn a_second_past(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    let created = meta
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .expect("creationTimestamp");
    until(
        &format!(
            "the clock a second past {:?}'s creation",
            meta.name.as_deref().unwrap_or_default()
        ),
        Duration::from_secs(3),
        || async move {
            let now = k8s_openapi::jiff::Timestamp::now();
            Ok((now.as_second() > created).then_some(()))
        },
    )
    .await
    .expect("clock");
}

/// Waits until a Warning Event in `namespace` matches `matches`; returns its note.
pub async fn warning_event(
    client: &kube::Client,
    namespace: &str,
    what: &str,
    timeout: Duration,
    matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) -> anyhow::Result<String> {
    let warning = |e: &k8s_openapi::api::events::v1::Event| e.type_.as_deref() == Some("Warning");
    let e = event(client, namespace, what, timeout, |e| {
        warning(e) && matches(e)
    })
    .await?;
    Ok(e.note.unwrap_or_default())
}

/// Waits until an Event in `namespace` matches `matches`; returns it.
pub async fn event(
    client: &kube::Client,
    namespace: &str,
    what: &str,
    timeout: Duration,
    matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) -> anyhow::Result<k8s_openapi::api::events::v1::Event> {
    let events: kube::api::Api<k8s_openapi::api::events::v1::Event> =
        kube::api::Api::namespaced(client.clone(), namespace);
    until(what, timeout, || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let n = list.items.len();
        match list.items.into_iter().find(|e| matches(e)) {
            Some(e) => Ok(Some(e)),
            None => Err(format!("{n} Events in {namespace}, none matching")),
        }
    })
    .await
}
