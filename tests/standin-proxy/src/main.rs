//! `cp-proxy-standin`: a **stand-in** for the SAP Connectivity Proxy image
//! (`docker.io/sapse/connectivity-proxy`), for integration tests on a local Kubernetes node where the
//! real image cannot be pulled. It is not the proxy: it tunnels nothing and proxies nothing. It reads
//! what the controller mounts into the `connectivity-proxy` container the way the real proxy would,
//! and is ready (listens) only while all of it reads back, so a pod turns ready exactly when the
//! rendered configuration and the service key are usable, and a test can compare what the proxy
//! would read with the CR.
//!
//! # What it reads
//!
//! Every 2 seconds (and at start):
//!
//! * `/etc/connectivity/properties/user-provided/connectivity-proxy-config.yml` (env
//!   `CP_STANDIN_CONFIG`), the controller's `render_config`, parsed as YAML 1.1 as the proxy's
//!   SnakeYAML does (`off` is a boolean, `017` is octal; see [`yaml11`]).
//! * The service key in the secrets directory `/etc/connectivity/secrets` (env
//!   `CP_STANDIN_SECRETS`): the file named by `integration.connectivityService.serviceCredentialsKey`
//!   (default `service_key`), JSON.
//!
//! # What it checks
//!
//! Always rendered by `render_config`, so required:
//!
//! * `tenantMode`: the string `dedicated` or `shared`;
//! * `highAvailabilityMode`: the string `off`, `path` or `subdomain` (an unquoted `off` is the
//!   boolean `false` to the proxy and fails here);
//! * `servers.businessDataTunnel.externalHost`: a non-empty string;
//!   `servers.businessDataTunnel.externalPort`: an integer port 1-65535;
//! * `servers.proxy.http`, `servers.proxy.rfcAndLdap`, `servers.proxy.socks5`: mappings, each with
//!   the booleans `enabled` and `enableProxyAuthorization` (and `allowRemoteConnections` a boolean
//!   when present); an enabled proxy's `port` an integer 1-65535, not the tunnel port 8042, and not
//!   another enabled proxy's;
//! * `serviceChannels`, `multiRegionMode`, `integration`: mappings (their `enabled` booleans when
//!   present; `integration.auditlog.mode` `console` or `service` when present).
//!
//! Required when:
//!
//! * `subaccountId`, a non-empty string, when `tenantMode` is `dedicated` (render_config drops it
//!   when it resolves to nothing);
//! * `subaccountSubdomain`, a non-empty string, when an enabled proxy has
//!   `enableProxyAuthorization: false`;
//! * `servers.proxy.authorization.oauth.allowedClientId`, a non-empty string, when an enabled
//!   proxy has `enableProxyAuthorization: true`;
//! * `multiRegionMode.configMapName`, a non-empty string, when `multiRegionMode.enabled` is true;
//! * `integration.connectivityService.serviceCredentialsKey`, when present, a plain file name.
//!
//! The service key must be a JSON object with non-empty strings `clientid`, `clientsecret` and
//! `subaccount_id`; when the configuration has a `subaccountId`, it must equal the key's
//! `subaccount_id` (the real proxy refuses a key of another subaccount).
//!
//! Not checked: the service mappings' content beyond their addresses, the audit-log credentials
//! (their projected Secret is optional), the Connectivity service's answers.
//!
//! # What it dials
//!
//! While everything reads back, every 3 seconds (env `CP_STANDIN_DIAL_EVERY`, seconds), a TCP connect
//! to each published service channel's `internalAddress` (the mapping files in
//! `/etc/connectivity/properties/servicemappings`, env `CP_STANDIN_MAPPINGS`: `servicemappings` and
//! its shards `servicemappings-<n>`, each a JSON list, read together; see [`mapping_files`]) and to
//! the Connectivity service endpoint of the service key (`connectivity_service.url`, port 443); see
//! [`dial`]. Each outcome is logged when it changes:
//!
//! ```text
//! {"standin":"connectivity-proxy","event":"dial","target":"channel erp","address":"10.244.0.9:3300","reachable":true}
//! ```
//!
//! # What it does
//!
//! While everything reads back it listens on the tunnel port 8042 (the probes are `tcpSocket` on it)
//! and on each enabled proxy's port, accepting connections and closing them at once. When a check
//! fails it logs one line naming the file and the problem and closes every listener, so the pod
//! turns unready; it never pretends to be ready. It logs JSON lines on stdout, each with
//! `"standin":"connectivity-proxy"`; whenever the checked configuration or the key's subaccount
//! changes (so also at start):
//!
//! ```text
//! {"standin":"connectivity-proxy","config":{...the parsed file...},"serviceKeySubaccount":"..."}
//! ```
//!
//! SIGTERM or SIGINT ends it within about 50 ms with exit code 0.
#![forbid(unsafe_code)]

mod check;
mod dial;
mod yaml11;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use check::Problem;

const DEFAULT_CONFIG: &str =
    "/etc/connectivity/properties/user-provided/connectivity-proxy-config.yml";
const DEFAULT_SECRETS: &str = "/etc/connectivity/secrets";
const DEFAULT_MAPPINGS: &str = "/etc/connectivity/properties/servicemappings";
const CHECK_EVERY: Duration = Duration::from_secs(2);
const DIAL_EVERY: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);

/// Writes one JSON log line with `standin` first and the fields in the order given.
fn log(fields: &[(&str, Value)]) {
    let mut line = String::from(r#"{"standin":"connectivity-proxy""#);
    for (key, value) in fields {
        line.push(',');
        line.push_str(&Value::String((*key).to_owned()).to_string());
        line.push(':');
        line.push_str(&value.to_string());
    }
    line.push('}');
    let mut out = std::io::stdout().lock();
    // Logging must not stop the stand-in: a closed stdout is ignored.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Prints a line on stdout, ignoring a closed stdout.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

fn text(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

/// The mapping files the proxy reads at `path`: the file itself, or in a directory `servicemappings`
/// and its shards `servicemappings-<n>` (the kubelet's `..data` links and anything else are skipped),
/// in the order of their number.
fn mapping_files(path: &Path) -> Vec<PathBuf> {
    if !path.is_dir() {
        return vec![path.to_owned()];
    }
    let shard = |name: &str| match name.strip_prefix("servicemappings") {
        Some("") => Some(0),
        Some(n) => n.strip_prefix('-')?.parse::<u32>().ok().filter(|n| *n > 0),
        None => None,
    };
    let mut files: Vec<(u32, PathBuf)> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((shard(e.file_name().to_str()?)?, e.path())))
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// The service channels of every mapping file at `path`, and how many files there were.
fn read_channels(path: &Path) -> (Vec<dial::Target>, usize) {
    let files = mapping_files(path);
    let mut channels: Vec<dial::Target> = files
        .iter()
        // A missing file is no channel (the real proxy starts without any).
        .flat_map(|f| dial::channels(&read(f).unwrap_or_default()))
        .collect();
    channels.sort();
    (channels, files.len())
}

/// What changes when the kubelet swaps a volume's files (its `..data` link, replaced atomically at
/// every refresh), or else the mappings path's modification time: cheap enough to look at every
/// [`POLL`], so that new mappings are read as soon as they are in the files (the bench times create →
/// in the proxy's files), not at the next round of checks.
fn mappings_stamp(path: &Path) -> Option<String> {
    if let Ok(target) = std::fs::read_link(path.join("..data")) {
        return Some(target.display().to_string());
    }
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| format!("{t:?}"))
}

/// Reads a file as UTF-8 text, the error naming what failed.
fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))
}

/// One round of checks: what to serve (and the service key's text), or the file at fault and the
/// problem.
fn evaluate(
    config_path: &Path,
    secrets: &Path,
) -> Result<(check::Ready, String), (PathBuf, String)> {
    let config_text = read(config_path).map_err(|p| (config_path.to_owned(), p))?;
    let config = check::check_config(&config_text).map_err(|p| (config_path.to_owned(), p))?;
    let key_path = secrets.join(&config.credentials_key);
    let key_text = read(&key_path).map_err(|p| (key_path.clone(), p))?;
    match check::check(&config_text, &key_text) {
        Ok(ready) => Ok((ready, key_text)),
        Err(Problem::Config(p)) => Err((config_path.to_owned(), p)),
        Err(Problem::ServiceKey(p)) => Err((key_path, p)),
    }
}

/// Listens on `port` on every address: IPv6 (dual-stack on Linux) or, where the pod has no IPv6,
/// IPv4.
fn listen(port: u16) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Makes `listeners` exactly `ports`; on a port that cannot be opened, closes all and says why.
fn sync_listeners(listeners: &mut BTreeMap<u16, TcpListener>, ports: &[u16]) -> Result<(), String> {
    listeners.retain(|port, _| ports.contains(port));
    for &port in ports {
        if listeners.contains_key(&port) {
            continue;
        }
        match listen(port) {
            Ok(l) => {
                listeners.insert(port, l);
            }
            Err(e) => {
                listeners.clear();
                return Err(format!("cannot listen on port {port}: {e}"));
            }
        }
    }
    Ok(())
}

/// Accepts every pending connection and closes it.
fn accept_all(listeners: &BTreeMap<u16, TcpListener>) {
    for listener in listeners.values() {
        loop {
            match listener.accept() {
                Ok((stream, _)) => drop(stream),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        None => {}
        Some("--version") => {
            say(&format!("cp-proxy-standin {}", env!("CARGO_PKG_VERSION")));
            return ExitCode::SUCCESS;
        }
        Some("--help" | "-h") => {
            say(&format!(
                "cp-proxy-standin {}: a stand-in for the SAP Connectivity Proxy in tests.\n\
                 Listens on {} and the enabled proxy ports while {DEFAULT_CONFIG} (env CP_STANDIN_CONFIG)\n\
                 and the service key in {DEFAULT_SECRETS} (env CP_STANDIN_SECRETS) read back.",
                env!("CARGO_PKG_VERSION"),
                check::TUNNEL_PORT
            ));
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("cp-proxy-standin: unknown argument {other:?} (try --help)");
            return ExitCode::from(2);
        }
    }
    let config_path = PathBuf::from(
        std::env::var_os("CP_STANDIN_CONFIG").unwrap_or_else(|| DEFAULT_CONFIG.into()),
    );
    let secrets = PathBuf::from(
        std::env::var_os("CP_STANDIN_SECRETS").unwrap_or_else(|| DEFAULT_SECRETS.into()),
    );

    let mappings_path = PathBuf::from(
        std::env::var_os("CP_STANDIN_MAPPINGS").unwrap_or_else(|| DEFAULT_MAPPINGS.into()),
    );
    let dial_every = std::env::var("CP_STANDIN_DIAL_EVERY")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(DIAL_EVERY, Duration::from_secs);

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&stop)) {
            log(&[
                ("event", text("error")),
                (
                    "problem",
                    text(format!("cannot handle signal {signal}: {e}")),
                ),
            ]);
            return ExitCode::FAILURE;
        }
    }
    log(&[
        ("event", text("starting")),
        ("version", text(env!("CARGO_PKG_VERSION"))),
        ("configFile", text(config_path.display().to_string())),
        ("secretsDir", text(secrets.display().to_string())),
        ("mappings", text(mappings_path.display().to_string())),
    ]);
    let targets: Arc<Mutex<Vec<dial::Target>>> = Arc::default();
    {
        let (targets, stop) = (Arc::clone(&targets), Arc::clone(&stop));
        if let Err(e) = std::thread::Builder::new()
            .name("dial".into())
            .spawn(move || dial::run(targets, dial_every, stop, log))
        {
            log(&[
                ("event", text("error")),
                ("problem", text(format!("cannot start dialing: {e}"))),
            ]);
            return ExitCode::FAILURE;
        }
    }

    let mut listeners: BTreeMap<u16, TcpListener> = BTreeMap::new();
    let mut logged: Option<(Value, String)> = None;
    let mut last_problem: Option<(PathBuf, String)> = None;
    let mut last_ports: Vec<u16> = Vec::new();
    let mut last_channels: Option<(usize, usize)> = None;
    let mut next_check = Instant::now();
    let mut last_stamp = mappings_stamp(&mappings_path);
    loop {
        if stop.load(Ordering::Relaxed) {
            listeners.clear();
            log(&[("event", text("stopping")), ("reason", text("signal"))]);
            return ExitCode::SUCCESS;
        }
        let stamp = mappings_stamp(&mappings_path);
        if stamp != last_stamp {
            last_stamp = stamp;
            next_check = Instant::now();
        }
        if Instant::now() >= next_check {
            next_check = Instant::now() + CHECK_EVERY;
            let outcome = evaluate(&config_path, &secrets).and_then(|(ready, key_text)| {
                let ports = ready.config.listen_ports();
                sync_listeners(&mut listeners, &ports)
                    .map(|()| (ready, key_text, ports))
                    .map_err(|p| (config_path.clone(), p))
            });
            match outcome {
                Ok((ready, key_text, ports)) => {
                    last_problem = None;
                    let (mut now, files) = read_channels(&mappings_path);
                    if last_channels != Some((now.len(), files)) {
                        log(&[
                            ("event", text("mappings")),
                            ("channels", Value::from(now.len())),
                            ("files", Value::from(files)),
                        ]);
                        last_channels = Some((now.len(), files));
                    }
                    now.extend(dial::service_endpoint(&key_text));
                    if let Ok(mut t) = targets.lock() {
                        *t = now;
                    }
                    let current = (ready.config.parsed, ready.key_subaccount);
                    if logged.as_ref() != Some(&current) {
                        log(&[
                            ("config", current.0.clone()),
                            ("serviceKeySubaccount", text(current.1.clone())),
                        ]);
                        logged = Some(current);
                    }
                    if ports != last_ports {
                        log(&[
                            ("event", text("listening")),
                            ("ports", Value::from(ports.clone())),
                        ]);
                        last_ports = ports;
                    }
                }
                Err(problem) => {
                    listeners.clear();
                    last_ports.clear();
                    if let Ok(mut t) = targets.lock() {
                        t.clear();
                    }
                    // Logged again after a change or a recovery, not every round.
                    if last_problem.as_ref() != Some(&problem) {
                        log(&[
                            ("event", text("not-ready")),
                            ("file", text(problem.0.display().to_string())),
                            ("problem", text(problem.1.clone())),
                        ]);
                        last_problem = Some(problem);
                    }
                }
            }
        }
        accept_all(&listeners);
        std::thread::sleep(POLL);
    }
}
