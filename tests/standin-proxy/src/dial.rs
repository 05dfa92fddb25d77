//! What the proxy dials on its own, played: every published service channel's `internalAddress` (the
//! mappings file the controller mounts) on a health probe of the stand-in's own, and the Connectivity
//! service's endpoint (`connectivity_service.url` of the service key, port 443 unless it names one).
//! A TCP connect with a deadline, every few seconds, from a thread of its own; each target's outcome
//! is logged when it changes (and the first time), so a test reads from the pod's log which flows its
//! NetworkPolicies let through. The real proxy opens these connections when a request needs them
//! (and keeps its tunnel to the Connectivity service open); the stand-in opens and closes them.

use std::collections::BTreeMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// How long one connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection the proxy opens: what it is (`channel <mapping name>` or `connectivity-service`)
/// and the `host:port` it dials.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub what: String,
    pub address: String,
}

/// The service channels of the mappings file (a JSON list of entries with `internalAddress` and
/// `name`), sorted by name; entries without an address are skipped. An unreadable file is no channel.
pub fn channels(mappings_json: &str) -> Vec<Target> {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(mappings_json) else {
        return vec![];
    };
    let mut out: Vec<Target> = entries
        .iter()
        .filter_map(|e| {
            let address = e.get("internalAddress")?.as_str()?.trim();
            (!address.is_empty()).then(|| Target {
                what: format!(
                    "channel {}",
                    e.get("name").and_then(Value::as_str).unwrap_or("?")
                ),
                address: address.to_owned(),
            })
        })
        .collect();
    out.sort();
    out
}

/// The Connectivity service endpoint of a service key: the host (and port, 443 by default) of
/// `connectivity_service.url`.
pub fn service_endpoint(key_json: &str) -> Option<Target> {
    let key: Value = serde_json::from_str(key_json).ok()?;
    let url = key.get("connectivity_service")?.get("url")?.as_str()?;
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let address = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:443")
    };
    Some(Target {
        what: "connectivity-service".into(),
        address,
    })
}

/// Whether a TCP connection to `address` opens within [`CONNECT_TIMEOUT`], or why not.
pub fn connect(address: &str) -> Result<(), String> {
    let addrs: Vec<_> = address
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .collect();
    let mut last = String::from("no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// How many changed dial outcomes a round logs one by one.
const LOGGED_PER_ROUND: usize = 64;

/// Dials `targets` (shared with the checking loop, which replaces them) every `every`, logging each
/// target's outcome when it changes, until `stop` is set.
pub fn run(
    targets: Arc<Mutex<Vec<Target>>>,
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
    log: fn(&[(&str, Value)]),
) {
    let mut last: BTreeMap<Target, Result<(), String>> = BTreeMap::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let now: Vec<Target> = targets.lock().map(|t| t.clone()).unwrap_or_default();
        let current: std::collections::BTreeSet<&Target> = now.iter().collect();
        last.retain(|t, _| current.contains(t));
        // One connect per address and round, however many channels lead there; a round logs at most
        // LOGGED_PER_ROUND changes one by one and counts the rest.
        let mut dialed: BTreeMap<String, Result<(), String>> = BTreeMap::new();
        let (mut logged, mut more) = (0, 0);
        for target in now.iter().cloned() {
            let outcome = dialed
                .entry(target.address.clone())
                .or_insert_with(|| connect(&target.address))
                .clone();
            if last.get(&target) != Some(&outcome) {
                if logged == LOGGED_PER_ROUND {
                    more += 1;
                    last.insert(target, outcome);
                    continue;
                }
                logged += 1;
                let mut fields = vec![
                    ("event", Value::from("dial")),
                    ("target", Value::from(target.what.clone())),
                    ("address", Value::from(target.address.clone())),
                    ("reachable", Value::from(outcome.is_ok())),
                ];
                if let Err(problem) = &outcome {
                    fields.push(("problem", Value::from(problem.clone())));
                }
                log(&fields);
                last.insert(target, outcome);
            }
        }
        if more > 0 {
            log(&[
                ("event", Value::from("dial")),
                ("more", Value::from(more)),
                (
                    "reachable",
                    Value::from(last.values().filter(|o| o.is_ok()).count()),
                ),
            ]);
        }
        // Sleeps in small steps so a signal ends the stand-in promptly.
        let mut slept = Duration::ZERO;
        while slept < every && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            slept += Duration::from_millis(50);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_the_mappings_addresses_sorted_by_name() {
        let json = r#"[{"internalAddress":"erp.ns:3300","name":"b","serviceId":"x","type":"TCP"},
                       {"internalAddress":"10.0.0.1:8080","name":"a","serviceId":"y","type":"HTTP"},
                       {"internalAddress":" ","name":"c","serviceId":"z","type":"TCP"}]"#;
        assert_eq!(
            channels(json),
            vec![
                Target {
                    what: "channel a".into(),
                    address: "10.0.0.1:8080".into()
                },
                Target {
                    what: "channel b".into(),
                    address: "erp.ns:3300".into()
                },
            ]
        );
        assert!(channels("not json").is_empty());
        assert!(channels("{}").is_empty());
    }

    #[test]
    fn the_service_endpoint_is_the_urls_host_on_443_unless_it_names_a_port() {
        let key = |url: &str| format!(r#"{{"connectivity_service":{{"url":"{url}"}}}}"#);
        let endpoint = |url: &str| service_endpoint(&key(url)).map(|t| t.address);
        assert_eq!(
            endpoint("https://ca.node.test"),
            Some("ca.node.test:443".into())
        );
        assert_eq!(
            endpoint("https://ca.node.test:8443/api/v1"),
            Some("ca.node.test:8443".into())
        );
        assert_eq!(endpoint("https://[::1]:9443/x"), Some("[::1]:9443".into()));
        assert_eq!(endpoint("https:///path"), None);
        assert_eq!(endpoint("ftp://x"), None);
        assert_eq!(service_endpoint("{}"), None);
    }

    #[test]
    fn a_listening_port_connects_and_a_closed_one_does_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert_eq!(connect(&open), Ok(()));
        drop(listener);
        assert!(connect(&open).is_err(), "{open} still connects");
        assert!(connect("no-port").is_err());
    }
}
