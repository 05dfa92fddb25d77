//! What one user action costs the cluster (issue #46, item 3): the webhook calls the API server made
//! for it, the calls its `matchConditions` spared, and every API write that followed, by writer and
//! resource, until the controller was quiet again. Counted from the API server's own metrics and its
//! audit log, not from the operator's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;
use cp_api::{ConnectivityProxy, ServiceMapping, names};
use cp_tests::ControlPlane;
use cp_tests::controller::{CONTROLLER_USER, ControllerProcess};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::measure::controller::common::{CR, NS, WEBHOOK_USER, reconciles, settle};

/// Waits until the controller has not reconciled for a second, or `limit` passed (a CR whose proxy
/// rolls is requeued while it does: what it writes meanwhile is counted, up to `limit`).
async fn quiet(ctrl: &ControllerProcess, limit: Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    let mut last = reconciles(ctrl).await?;
    let mut since = std::time::Instant::now();
    while since.elapsed() < Duration::from_secs(1) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reconciles(ctrl).await?;
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        }
    }
    Ok(())
}

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One action's cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ActionCost {
    /// What was done ("edit of the CR's HTTP port", ...).
    pub action: String,
    /// ServiceMappings in the cluster meanwhile.
    pub mappings: usize,
    /// Webhook calls by webhook (`apiserver_admission_webhook_request_total`).
    pub webhook_calls: BTreeMap<String, u64>,
    /// Calls a webhook's or policy's `matchConditions` left out
    /// (`apiserver_admission_match_condition_exclusions_total`), by name.
    pub spared: BTreeMap<String, u64>,
    /// Writes by writer (`user`, `controller`, `webhook`, `kube`) and `verb resource`.
    pub writes: BTreeMap<String, BTreeMap<String, usize>>,
    /// Reconciles the controller counted.
    pub reconciles: u64,
}

impl ActionCost {
    /// Writes of `writer`.
    pub fn writes_of(&self, writer: &str) -> usize {
        self.writes.get(writer).map_or(0, |w| w.values().sum())
    }
}

/// Sums of a counter by the value of its `name` label.
fn by_name(text: &str, series: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(series).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let name = labels
            .split(',')
            .find_map(|l| l.strip_prefix("name=\""))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or("?");
        let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(name.to_string()).or_default() += value;
    }
    out
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

async fn apiserver_metrics(admin: &Client) -> anyhow::Result<String> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    admin
        .request_text(req)
        .await
        .context("reading the API server's metrics")
}

fn writer_of(user: &str) -> &'static str {
    if user == CONTROLLER_USER {
        "controller"
    } else if user == WEBHOOK_USER {
        "webhook"
    } else if user.starts_with("system:kube-")
        || user.starts_with("system:serviceaccount:kube-system")
    {
        "kube"
    } else {
        "user"
    }
}

/// Runs `act`, waits until `done` holds and the controller has been quiet for a second (at most 10 s),
/// and counts.
async fn measure<F, D, Fut>(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    action: &str,
    mappings: usize,
    act: F,
    done: D,
) -> anyhow::Result<ActionCost>
where
    F: AsyncFnOnce() -> anyhow::Result<()>,
    D: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<()>, String>>,
{
    let admin = cp.admin().await?;
    settle(ctrl).await?;
    let text = apiserver_metrics(&admin).await?;
    let (calls0, spared0) = (
        by_name(&text, "apiserver_admission_webhook_request_total"),
        by_name(
            &text,
            "apiserver_admission_match_condition_exclusions_total",
        ),
    );
    let (offset, reconciles0) = (cp.audit_offset(), reconciles(ctrl).await?);
    act().await?;
    cp_tests::wait::until(action, Duration::from_secs(60), done)
        .await
        .map_err(|e| anyhow::anyhow!("{action}: {e}"))?;
    quiet(ctrl, Duration::from_secs(10)).await?;
    let text = apiserver_metrics(&admin).await?;
    let mut writes: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for w in cp.audit_requests_since(offset)? {
        if !WRITE_VERBS.contains(&w.verb.as_str()) || w.resource == "leases" {
            continue;
        }
        *writes
            .entry(writer_of(&w.user).to_string())
            .or_default()
            .entry(format!("{} {}", w.verb, w.resource))
            .or_default() += 1;
    }
    Ok(ActionCost {
        action: action.to_string(),
        mappings,
        webhook_calls: delta(
            &calls0,
            &by_name(&text, "apiserver_admission_webhook_request_total"),
        ),
        spared: delta(
            &spared0,
            &by_name(
                &text,
                "apiserver_admission_match_condition_exclusions_total",
            ),
        ),
        writes,
        reconciles: reconciles(ctrl).await?.saturating_sub(reconciles0),
    })
}

/// The two actions users make most, each counted: a new ServiceMapping (published, taken over, given
/// its endpoint) and an edit of the CR (its HTTP port, which rolls the proxy; the CR is left rolling,
/// the caller plays the rollout). `tag` keeps this
/// run's names apart from another's; `mappings` are present meanwhile.
pub async fn costs(
    cp: &ControlPlane,
    ctrl: &ControllerProcess,
    mappings: usize,
    tag: &str,
    port: i64,
) -> anyhow::Result<Vec<ActionCost>> {
    let admin = cp.admin().await?;
    let crs: Api<ConnectivityProxy> = Api::namespaced(admin.clone(), NS);
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let name = format!("action-{tag}");
    let create = measure(
        cp,
        ctrl,
        "a new ServiceMapping",
        mappings,
        async || {
            let m = cp_api::testing::tcp_mapping(&name, "action-subaccount", &name);
            api.create(&PostParams::default(), &m)
                .await
                .with_context(|| format!("creating ServiceMapping {name}"))?;
            Ok(())
        },
        || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let m = api.get(&name).await.map_err(|e| e.to_string())?;
                let taken = m
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(names::LABEL_MODULE));
                let endpoint = m.status.as_ref().and_then(|s| s.endpoint.as_ref());
                Ok((taken && endpoint.is_some()).then_some(()))
            }
        },
    )
    .await?;
    // Gone again, so the other sections count the mappings they made.
    api.delete(&name, &Default::default())
        .await
        .with_context(|| format!("deleting ServiceMapping {name}"))?;
    let edit = measure(
        cp,
        ctrl,
        "an edit of the CR (`spec.config.servers.proxy.http.port`)",
        mappings,
        async || {
            let patch =
                json!({"spec": {"config": {"servers": {"proxy": {"http": {"port": port}}}}}});
            crs.patch(CR, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("editing the CR")?;
            Ok(())
        },
        || {
            let crs = crs.clone();
            async move {
                let cr = crs.get(CR).await.map_err(|e| e.to_string())?;
                let st = cr.status.clone().unwrap_or_default();
                // Applied: the controller has written what the edit changes (the proxy then rolls).
                Ok((st.observed_generation == cr.metadata.generation).then_some(()))
            }
        },
    )
    .await?;
    Ok(vec![create, edit])
}

fn map_text<V: std::fmt::Display>(m: &BTreeMap<String, V>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} × {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The section's table.
pub fn render(costs: &[ActionCost]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### What one user action costs\n\n\
         Each action by an admin client, then waited for until applied (the mapping labelled and given its \
         endpoint; the CR's new generation observed) and the controller quiet for a second (at most 10 s: the \
         edit rolls the proxy, which nobody completes here). Webhook calls and \
         the calls `matchConditions` spared are the API server's own counters \
         (`apiserver_admission_webhook_request_total`, `apiserver_admission_match_condition_exclusions_total`, \
         by webhook or policy name); writes are every create/update/patch/delete in the API server's audit log \
         in that time (Lease renewals aside), by who made them. The controller's own writes skip the webhooks \
         (`matchConditions` `not-the-operator-controller`) and their watch events wake no reconcile.\n"
    );
    let _ = writeln!(
        s,
        "| action | mappings present | webhook calls | spared by matchConditions | user writes | controller writes | other writes | reconciles |"
    );
    let _ = writeln!(s, "|---|---:|---|---|---|---|---|---:|");
    for c in costs {
        let others: BTreeMap<String, usize> = c
            .writes
            .iter()
            .filter(|(w, _)| *w != "user" && *w != "controller")
            .flat_map(|(w, m)| m.iter().map(move |(k, v)| (format!("{w}: {k}"), *v)))
            .collect();
        let empty = BTreeMap::new();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
            c.action,
            c.mappings,
            map_text(&c.webhook_calls),
            map_text(&c.spared),
            map_text(c.writes.get("user").unwrap_or(&empty)),
            c.writes_of("controller"),
            map_text(c.writes.get("controller").unwrap_or(&empty)),
            map_text(&others),
            c.reconciles
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_summed_by_its_name_label() {
        let text = "# HELP x\n\
            apiserver_admission_webhook_request_total{code=\"200\",name=\"a.example\",operation=\"CREATE\",rejected=\"false\",type=\"validating\"} 3\n\
            apiserver_admission_webhook_request_total{code=\"200\",name=\"a.example\",operation=\"UPDATE\",rejected=\"false\",type=\"validating\"} 2\n\
            apiserver_admission_webhook_request_total{code=\"200\",name=\"b.example\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"} 1\n\
            apiserver_admission_webhook_request_total_other{name=\"c\"} 9\n";
        let m = by_name(text, "apiserver_admission_webhook_request_total");
        assert_eq!(m.get("a.example"), Some(&5));
        assert_eq!(m.get("b.example"), Some(&1));
        assert_eq!(m.len(), 2);
        let before = BTreeMap::from([("a.example".to_string(), 4)]);
        assert_eq!(
            delta(&before, &m),
            BTreeMap::from([("a.example".into(), 1), ("b.example".into(), 1)])
        );
    }
}
