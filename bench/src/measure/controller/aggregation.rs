//! Many ServiceMappings: creating them, the controller aggregating and adopting them, and one more
//! at a time with them present.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cp_api::keys::ADOPTED_ANNOTATION;
use cp_api::{ServiceMapping, names};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::harness::mappings::{IN_FLIGHT, create_mappings, numbered_mappings, tcp_mapping};
use crate::harness::report::yes_no;
use crate::harness::stats::{Percentiles, ms, per_second};
use crate::harness::watch::{Watched, wait_until, watch_count};
use crate::measure::controller::common::NS;

/// One new mapping → in the aggregated ConfigMap with 10,000 present, p99 goal (issue #33).
const ONE_MAPPING_P99_GOAL_MS: f64 = 500.0;

/// Creating many ServiceMappings and the controller catching up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Aggregation {
    pub mappings: usize,
    /// Creating all of them through the API server (and the webhook), `IN_FLIGHT` at a time.
    pub create_secs: f64,
    pub create_per_sec: f64,
    /// Creations retried after a transient error.
    pub create_retries: usize,
    /// From the last creation to ConfigMap `connectivity-proxy-service-mappings` listing all of them.
    pub aggregated_ms: f64,
    /// From the last creation to every mapping labelled, annotated and with its `status.endpoint`;
    /// `None` when that took longer than `adopt_wait_secs`.
    pub adopted_ms: Option<f64>,
    /// How long the bench waits for that after the last creation.
    pub adopt_wait_secs: f64,
    /// Mappings adopted when the bench stopped waiting (all of them unless `adopted_ms` is `None`).
    pub adopted: usize,
    /// Size of the aggregated ConfigMap value.
    pub config_map_bytes: usize,
}

/// Entries and bytes of the aggregated ConfigMap as the bench's watch sees it.
fn watch_aggregated(admin: &Client) -> Watched<Option<(usize, usize)>> {
    crate::harness::mappings::watch_shards(Api::namespaced(admin.clone(), NS))
}

pub async fn aggregate(
    admin: &Client,
    n: usize,
    adopt_wait: Duration,
) -> anyhow::Result<Aggregation> {
    let mut aggregated = watch_aggregated(admin);
    let mut adopted = watch_count(Api::<ServiceMapping>::all(admin.clone()), |m| {
        m.labels().get(names::LABEL_MODULE).map(String::as_str) == Some(names::MODULE_VALUE)
            && m.annotations().contains_key(ADOPTED_ANNOTATION)
            && m.status
                .as_ref()
                .and_then(|s| s.endpoint.as_ref())
                .is_some()
    });
    wait_until(
        &mut aggregated,
        "the service-mappings ConfigMap",
        Duration::from_secs(15),
        |v| v.is_some(),
    )
    .await?;

    let mappings = numbered_mappings(n);
    let t0 = Instant::now();
    let (_, retries) = create_mappings(admin, mappings).await?;
    let created_at = Instant::now();
    let create_secs = created_at.duration_since(t0).as_secs_f64();

    let budget = Duration::from_secs(60) + Duration::from_millis(15 * n as u64);
    let (at, (_, bytes)) = match wait_until(
        &mut aggregated,
        &format!(
            "{n} mappings in ConfigMap {}",
            names::CONFIGMAP_SERVICE_MAPPINGS
        ),
        budget,
        |v| v.is_some_and(|(entries, _)| entries == n),
    )
    .await?
    {
        (at, Some(v)) => (at, v),
        (_, None) => bail!("the service-mappings ConfigMap disappeared"),
    };
    let aggregated_ms = ms(at.saturating_duration_since(created_at));
    let adopted_ms = match wait_until(
        &mut adopted,
        &format!("{n} mappings adopted"),
        adopt_wait.saturating_sub(created_at.elapsed()),
        |c| *c == n,
    )
    .await
    {
        Ok((at, _)) => Some(ms(at.saturating_duration_since(created_at))),
        // Reported as a count: the wait is capped to bound the run.
        Err(_) => None,
    };
    let adopted_count = adopted.rx.borrow().1;
    Ok(Aggregation {
        mappings: n,
        create_secs,
        create_per_sec: per_second(n as f64, create_secs),
        create_retries: retries,
        aggregated_ms,
        adopted_ms,
        adopt_wait_secs: adopt_wait.as_secs_f64(),
        adopted: adopted_count,
        config_map_bytes: bytes,
    })
}

/// With `present` mappings aggregated: `samples` more created one at a time, each timed from its
/// create call until the bench's watch sees the aggregated ConfigMap list it.
pub async fn one_mapping_latency(
    admin: &Client,
    present: usize,
    samples: usize,
) -> anyhow::Result<Percentiles> {
    let mut aggregated = watch_aggregated(admin);
    let entries = |v: &Option<(usize, usize)>| v.map(|(entries, _)| entries);
    wait_until(
        &mut aggregated,
        &format!("{present} mappings in the ConfigMap"),
        Duration::from_secs(30),
        |v| entries(v) == Some(present),
    )
    .await?;
    let api: Api<ServiceMapping> = Api::all(admin.clone());
    let mut out = Vec::with_capacity(samples);
    for i in 1..=samples {
        let name = format!("one-{i:04}");
        let m = tcp_mapping(&name);
        let t0 = Instant::now();
        api.create(&PostParams::default(), &m)
            .await
            .with_context(|| format!("creating ServiceMapping {name}"))?;
        let (at, _) = wait_until(
            &mut aggregated,
            &format!("{name} in ConfigMap {}", names::CONFIGMAP_SERVICE_MAPPINGS),
            Duration::from_secs(60),
            |v| entries(v) == Some(present + i),
        )
        .await?;
        out.push(ms(at.saturating_duration_since(t0)));
    }
    Ok(Percentiles::of(&out))
}

/// The aggregation table, with one more mapping at a time (`one`).
pub fn render(a: &Aggregation, one: &Percentiles) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Aggregating {} ServiceMappings\n\n\
         Mappings `m-00001`… of type TCP created by an admin client, {IN_FLIGHT} in flight, each admitted by the \
         webhook; times from the last creation.\n",
        a.mappings
    );
    let _ = writeln!(s, "| Measure | value | Goal | Met |");
    let _ = writeln!(s, "|---|---:|---|---|");
    let _ = writeln!(
        s,
        "| creating them, s | {:.1} ({:.0}/s, {} retries) | — | — |",
        a.create_secs, a.create_per_sec, a.create_retries
    );
    let _ = writeln!(
        s,
        "| last creation → all in ConfigMap `{}`, ms | {:.0} | none set (reported) | — |",
        names::CONFIGMAP_SERVICE_MAPPINGS,
        a.aggregated_ms
    );
    let adopted = match a.adopted_ms {
        Some(v) => format!("{v:.0}"),
        None => format!(
            "not within {:.0} s: {} of {} by then",
            a.adopt_wait_secs, a.adopted, a.mappings
        ),
    };
    let _ = writeln!(
        s,
        "| last creation → all labelled and with `status.endpoint`, ms | {adopted} | none set (reported) | — |"
    );
    let _ = writeln!(
        s,
        "| then one more at a time ({} samples): create → in the ConfigMap, p50 / p99 / max ms | {:.0} / {:.0} / {:.0} | p99 ≤ {ONE_MAPPING_P99_GOAL_MS:.0} ms | {} |",
        one.samples,
        one.p50_ms,
        one.p99_ms,
        one.max_ms,
        yes_no(one.samples > 0 && one.p99_ms <= ONE_MAPPING_P99_GOAL_MS)
    );
    let _ = writeln!(
        s,
        "| aggregated ConfigMap value, KiB | {:.0} | < 960 (fits the object limit) | {} |",
        a.config_map_bytes as f64 / 1024.0,
        yes_no(a.config_map_bytes < 960 * 1024)
    );
    s.push('\n');
    s
}
