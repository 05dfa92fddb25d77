//! Prometheus and promtool, built from their Go module by `hack/prom-bins.sh` (pinned in
//! `tests/k8s-bins/prometheus/go.mod`, cached by version): the programs that judge the module's alert
//! rules and dashboards, never a copy of their rules.
//!
//! A [`Prometheus`] runs in a process group led by the same watchdog as the control plane's
//! ([`crate::cluster::start_watchdog`]): it ends with the test process however that ends.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The directory holding `prometheus` and `promtool`: `CP_PROM_BIN_DIR`, or whatever
/// `hack/prom-bins.sh` prints (it builds them on first use).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| crate::script_bin_dir("CP_PROM_BIN_DIR", "hack/prom-bins.sh"))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Runs `promtool` with `args` in `dir`; the output whatever the exit code.
pub fn promtool(dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(bin_dir()?.join("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .context("running promtool")
}

/// The text of a command's stdout and stderr.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A running Prometheus server, stopped on drop.
pub struct Prometheus {
    /// `host:port` its HTTP API answers on (loopback of the root namespace).
    pub addr: String,
    dir: PathBuf,
    child: Child,
    group_leader: u32,
}

/// One instant-query result series: its labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The series' labels.
    pub labels: serde_json::Map<String, serde_json::Value>,
    /// Its value as Prometheus prints it.
    pub value: String,
}

impl Prometheus {
    /// Starts Prometheus with `config` (prometheus.yml) and its TSDB in `dir/data` (kept if it exists:
    /// blocks backfilled by `promtool tsdb create-blocks-from` are served). With `netns`, Prometheus runs
    /// inside that network namespace (to scrape pod addresses) and is reached through `forward`, which
    /// maps its in-namespace address to a loopback port of the root namespace.
    pub fn start(
        dir: &Path,
        config: &str,
        netns: Option<&crate::netns::Netns>,
    ) -> anyhow::Result<Prometheus> {
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = crate::cluster::free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let group_leader = crate::cluster::start_watchdog(dir, None, "")?;
        let bin = bin_dir()?.join("prometheus");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        // Backfilled blocks lie in the past: keep them.
        .arg("--storage.tsdb.retention.time=3650d")
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("prometheus.log"))?)
        .stderr(std::fs::File::create(dir.join("prometheus.err.log"))?)
        .process_group(group_leader as i32);
        let child = cmd.spawn().context("starting prometheus")?;
        let addr = match netns {
            Some(ns) => format!("127.0.0.1:{}", ns.forward(listen.parse()?)?),
            None => listen,
        };
        Ok(Prometheus {
            addr,
            dir: dir.to_path_buf(),
            child,
            group_leader,
        })
    }

    /// Waits until `/-/ready` answers 200.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("prometheus exited ({status}): {}", self.log_tail());
            }
            if let Ok((200, _)) = crate::webhook::http_get(&self.addr, "/-/ready").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "prometheus not ready after {timeout:?}: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The end of Prometheus' log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.err.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// An instant query at `time` (Unix seconds; now when `None`): the result's series, an error
    /// naming the query when Prometheus refuses it.
    pub async fn query(&self, expr: &str, time: Option<f64>) -> anyhow::Result<Vec<Sample>> {
        let mut path = format!("/api/v1/query?query={}", url_encode(expr));
        if let Some(t) = time {
            path.push_str(&format!("&time={t:.3}"));
        }
        let (code, body) = crate::webhook::http_get(&self.addr, &path).await?;
        let v: serde_json::Value = serde_json::from_str(&body)
            .with_context(|| format!("query {expr}: HTTP {code}, not JSON: {body:.300}"))?;
        if v["status"] != "success" {
            bail!("query {expr}: HTTP {code}: {}", v["error"]);
        }
        let result = &v["data"]["result"];
        let series = match v["data"]["resultType"].as_str() {
            Some("vector") => result.as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![serde_json::json!({"metric": {}, "value": result})],
            other => bail!("query {expr}: result type {other:?}"),
        };
        Ok(series
            .into_iter()
            .map(|s| Sample {
                labels: s["metric"].as_object().cloned().unwrap_or_default(),
                value: s["value"][1].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// The scrape targets' health: `(scrape URL, health, last error)`.
    pub async fn targets(&self) -> anyhow::Result<Vec<(String, String, String)>> {
        let (_, body) = crate::webhook::http_get(&self.addr, "/api/v1/targets").await?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        Ok(v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["scrapeUrl"].as_str().unwrap_or_default().to_string(),
                    t["health"].as_str().unwrap_or_default().to_string(),
                    t["lastError"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        crate::cluster::signal_group(self.group_leader, "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        crate::cluster::signal_group(self.group_leader, "KILL");
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every query of a Grafana dashboard shipped as a ConfigMap (`rel`: its path in the workspace):
/// `(panel title, expr)`, in panel order.
pub fn dashboard_queries(rel: &str) -> anyhow::Result<Vec<(String, String)>> {
    let path = crate::workspace_root().join(rel);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {rel}"))?;
    let cm: serde_json::Value =
        serde_norway::from_str(&text).with_context(|| format!("parsing {rel}"))?;
    let json = cm["data"]
        .as_object()
        .and_then(|d| d.values().find_map(|v| v.as_str()))
        .with_context(|| format!("{rel}: no dashboard JSON in data"))?;
    let dash: serde_json::Value =
        serde_json::from_str(json).with_context(|| format!("{rel}: dashboard JSON"))?;
    let mut out = Vec::new();
    collect_queries(&dash, &mut out);
    Ok(out)
}

fn collect_queries(v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    if let Some(panels) = v["panels"].as_array() {
        for p in panels {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((title.clone(), expr.to_string()));
                }
            }
            collect_queries(p, out);
        }
    }
}

/// The fleet view at fleet scale: synthetic series of many runtimes, as KCP's Prometheus holds them
/// (every series with the runtime label its scraper adds), backfilled into a TSDB with
/// `promtool tsdb create-blocks-from openmetrics` and served by a real Prometheus.
pub mod fleet {
    use std::io::Write as _;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail};

    use super::{Prometheus, dashboard_queries, output_text, promtool};

    /// The fleet dashboard (KCP's Grafana).
    pub const DASHBOARD: &str = "manifests/monitoring/fleet-dashboard.yaml";
    /// The label KCP's scraper adds (the dashboard variable `runtime_label`'s default).
    pub const RUNTIME_LABEL: &str = "runtime_id";

    /// The fleet dashboard's queries as Grafana sends them with every runtime selected:
    /// `(panel, expr)`.
    pub fn queries() -> anyhow::Result<Vec<(String, String)>> {
        Ok(dashboard_queries(DASHBOARD)?
            .into_iter()
            .map(|(t, e)| {
                (
                    t,
                    e.replace("${runtime_label}", RUNTIME_LABEL)
                        .replace("${runtime:regex}", ".*"),
                )
            })
            .collect())
    }

    /// What a backfill wrote.
    #[derive(Debug, Clone)]
    pub struct Backfill {
        /// Runtimes.
        pub runtimes: usize,
        /// Series.
        pub series: usize,
        /// Samples.
        pub samples: usize,
        /// Generating the OpenMetrics text and creating the blocks.
        pub took: Duration,
    }

    /// Sample times of every series: every 15 minutes over the day before the last hour, every minute
    /// in the last hour (what a 5-minute rate and a 24-hour increase need).
    fn times(now: i64) -> Vec<i64> {
        let mut t: Vec<i64> = (0..96).map(|i| now - 25 * 3600 + i * 900).collect();
        t.extend((0..60).map(|i| now - 3600 + (i + 1) * 60));
        t
    }

    /// Writes the fleet's series as OpenMetrics text (one family after the other, each series' samples
    /// in time order, `# EOF` last). A runtime's module is Ready (95 %), Warning, Error or Processing, one
    /// in a hundred with a blocked legacy migration, tunnel certificates expiring over the next 90 days,
    /// every webhook answering, one in twenty refusing writes.
    pub fn write_openmetrics(
        path: &Path,
        runtimes: usize,
        now: i64,
    ) -> anyhow::Result<(usize, usize)> {
        let f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = std::io::BufWriter::new(f);
        let times = times(now);
        let (mut series, mut samples) = (0, 0);
        let rt = |r: usize| format!("{RUNTIME_LABEL}=\"rt-{r:05}\"");
        writeln!(w, "# TYPE cp_module_info gauge")?;
        for r in 0..runtimes {
            let (state, reason) = match r % 100 {
                0 => ("Error", "ApplyFailed"),
                1 | 2 => ("Warning", "ProxyPodFailing"),
                3 => ("Processing", "StatefulSetNotReady"),
                _ => ("Ready", "StatefulSetReady"),
            };
            let migration = if r % 100 == 50 { "blocked" } else { "none" };
            let operator = if r % 10 == 0 { "0.0.9" } else { "0.1.0" };
            let labels = format!(
                "{},namespace=\"kyma-system\",name=\"connectivity-proxy\",state=\"{state}\",reason=\"{reason}\",migration=\"{migration}\",operator_version=\"{operator}\",proxy_version=\"2.11.0\"",
                rt(r)
            );
            for t in &times {
                writeln!(w, "cp_module_info{{{labels}}} 1 {t}")?;
            }
            series += 1;
            samples += times.len();
        }
        writeln!(w, "# TYPE cp_certificate_expiry_timestamp_seconds gauge")?;
        for r in 0..runtimes {
            let expiry = now + ((r % 90) as i64 + 1) * 86400;
            for t in &times {
                writeln!(
                    w,
                    "cp_certificate_expiry_timestamp_seconds{{{},certificate=\"tunnel\"}} {expiry} {t}",
                    rt(r)
                )?;
            }
            series += 1;
            samples += times.len();
        }
        writeln!(w, "# TYPE cp_webhook_admission_requests counter")?;
        for r in 0..runtimes {
            let mut decisions = vec![("allowed", 2)];
            if r % 20 == 0 {
                decisions.push(("denied", 1));
            }
            for (decision, per_minute) in decisions {
                for t in &times {
                    let minutes = (t - times[0]) / 60;
                    writeln!(
                        w,
                        "cp_webhook_admission_requests_total{{{},endpoint=\"validate\",operation=\"UPDATE\",decision=\"{decision}\"}} {} {t}",
                        rt(r),
                        minutes * per_minute
                    )?;
                }
                series += 1;
                samples += times.len();
            }
        }
        writeln!(w, "# EOF")?;
        w.flush()?;
        Ok((series, samples))
    }

    /// Backfills `runtimes` runtimes ending now into `dir/data` and starts Prometheus on it.
    pub async fn start(dir: &Path, runtimes: usize) -> anyhow::Result<(Prometheus, Backfill)> {
        let started = Instant::now();
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("data"))?;
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let text = dir.join("fleet.om");
        let (series, samples) = write_openmetrics(&text, runtimes, now)?;
        let out = promtool(
            dir,
            &[
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "fleet.om",
                "data",
            ],
        )?;
        let _ = std::fs::remove_file(&text);
        if !out.status.success() {
            bail!(
                "promtool tsdb create-blocks-from openmetrics: {}",
                output_text(&out)
            );
        }
        let took = started.elapsed();
        let mut prom = Prometheus::start(dir, "global:\n  scrape_interval: 1m\n", None)?;
        prom.wait_ready(Duration::from_secs(120)).await?;
        Ok((
            prom,
            Backfill {
                runtimes,
                series,
                samples,
                took,
            },
        ))
    }
}
