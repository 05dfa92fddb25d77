//! The checks the stand-in makes before it listens: pure functions from the configuration file's
//! text and the service key's text to what the stand-in serves, or the problem.

use serde_json::{Map, Value};

use crate::yaml11::{self, describe};

/// The tunnel port the probes connect to (`cp_api::names::TUNNEL_PORT`).
pub const TUNNEL_PORT: u16 = 8042;

/// The service key's file name in the secrets directory when the configuration names none
/// (`integration.connectivityService.serviceCredentialsKey`'s default).
pub const DEFAULT_CREDENTIALS_KEY: &str = "service_key";

/// The proxies of `servers.proxy`, as render_config writes them.
pub const PROXIES: [&str; 3] = ["http", "rfcAndLdap", "socks5"];

/// A configuration that reads back.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The whole file as JSON (YAML 1.1 reading).
    pub parsed: Value,
    /// `subaccountId`, when set.
    pub subaccount_id: Option<String>,
    /// The service key's file name in the secrets directory.
    pub credentials_key: String,
    /// The enabled proxies and their ports, in [`PROXIES`] order.
    pub ports: Vec<(&'static str, u16)>,
}

impl Config {
    /// Every port to listen on: the tunnel port, then the enabled proxies'.
    pub fn listen_ports(&self) -> Vec<u16> {
        std::iter::once(TUNNEL_PORT)
            .chain(self.ports.iter().map(|&(_, p)| p))
            .collect()
    }
}

/// Both files read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Ready {
    pub config: Config,
    /// The service key's `subaccount_id`.
    pub key_subaccount: String,
}

/// Which file is wrong, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    Config(String),
    ServiceKey(String),
}

/// Checks the configuration text, then the service key text against it.
pub fn check(config_text: &str, key_text: &str) -> Result<Ready, Problem> {
    let config = check_config(config_text).map_err(Problem::Config)?;
    let key_subaccount = check_service_key(key_text, &config).map_err(Problem::ServiceKey)?;
    Ok(Ready {
        config,
        key_subaccount,
    })
}

/// Reads `connectivity-proxy-config.yml` as YAML 1.1 and checks the fields listed in the crate
/// documentation.
pub fn check_config(text: &str) -> Result<Config, String> {
    let parsed = yaml11::parse(text).map_err(|e| format!("not readable as YAML 1.1: {e}"))?;
    let f = Fields(&parsed);
    if !parsed.is_object() {
        return Err(format!(
            "the file must be a mapping, but YAML 1.1 reads {}",
            describe(&parsed)
        ));
    }
    let tenant_mode = f.one_of(&["tenantMode"], &["dedicated", "shared"])?;
    f.one_of(&["highAvailabilityMode"], &["off", "path", "subdomain"])?;
    f.non_empty_string(&["servers", "businessDataTunnel", "externalHost"])?;
    f.port(&["servers", "businessDataTunnel", "externalPort"])?;

    let mut ports: Vec<(&'static str, u16)> = Vec::new();
    let (mut with_auth, mut without_auth) = (None, None);
    for name in PROXIES {
        let path = ["servers", "proxy", name];
        f.mapping(&path)?;
        let enabled = f.boolean(&["servers", "proxy", name, "enabled"])?;
        let auth = f.boolean(&["servers", "proxy", name, "enableProxyAuthorization"])?;
        f.optional_boolean(&["servers", "proxy", name, "allowRemoteConnections"])?;
        if !enabled {
            continue;
        }
        let port = f.port(&["servers", "proxy", name, "port"])?;
        if port == TUNNEL_PORT {
            return Err(format!(
                "servers.proxy.{name}.port is {port}, the tunnel port"
            ));
        }
        if let Some((other, _)) = ports.iter().find(|&&(_, p)| p == port) {
            return Err(format!(
                "servers.proxy.{name}.port {port} is also servers.proxy.{other}.port"
            ));
        }
        ports.push((name, port));
        if auth {
            with_auth.get_or_insert(name);
        } else {
            without_auth.get_or_insert(name);
        }
    }
    if let Some(name) = with_auth {
        f.non_empty_string(&[
            "servers",
            "proxy",
            "authorization",
            "oauth",
            "allowedClientId",
        ])
        .map_err(|e| format!("{e} (servers.proxy.{name}.enableProxyAuthorization is true)"))?;
    }

    let subaccount_id = match f.get(&["subaccountId"]) {
        None if tenant_mode == "dedicated" => {
            return Err("subaccountId is missing (tenantMode is dedicated)".into());
        }
        None => None,
        Some(_) => Some(f.non_empty_string(&["subaccountId"])?.to_owned()),
    };
    match f.get(&["subaccountSubdomain"]) {
        None => {
            if let Some(name) = without_auth {
                return Err(format!(
                    "subaccountSubdomain is missing (servers.proxy.{name}.enableProxyAuthorization is false)"
                ));
            }
        }
        Some(_) => {
            f.non_empty_string(&["subaccountSubdomain"])?;
        }
    }

    f.mapping(&["serviceChannels"])?;
    f.optional_boolean(&["serviceChannels", "enabled"])?;
    f.mapping(&["multiRegionMode"])?;
    if f.optional_boolean(&["multiRegionMode", "enabled"])? == Some(true) {
        f.non_empty_string(&["multiRegionMode", "configMapName"])
            .map_err(|e| format!("{e} (multiRegionMode.enabled is true)"))?;
    }
    f.mapping(&["integration"])?;
    if f.get(&["integration", "auditlog"]).is_some() {
        f.mapping(&["integration", "auditlog"])?;
        if f.get(&["integration", "auditlog", "mode"]).is_some() {
            f.one_of(
                &["integration", "auditlog", "mode"],
                &["console", "service"],
            )?;
        }
    }
    let key_path = [
        "integration",
        "connectivityService",
        "serviceCredentialsKey",
    ];
    let credentials_key = match f.get(&key_path) {
        None => DEFAULT_CREDENTIALS_KEY.to_owned(),
        Some(_) => {
            let key = f.non_empty_string(&key_path)?;
            if key.contains(['/', '\0']) || key == "." || key == ".." {
                return Err(format!(
                    "{} {key:?} is not a file name in the secrets directory",
                    key_path.join(".")
                ));
            }
            key.to_owned()
        }
    };
    Ok(Config {
        parsed: parsed.clone(),
        subaccount_id,
        credentials_key,
        ports,
    })
}

/// Checks the service key (JSON with non-empty `clientid`, `clientsecret` and `subaccount_id`)
/// and that its subaccount is the configuration's; returns its `subaccount_id`.
pub fn check_service_key(text: &str, config: &Config) -> Result<String, String> {
    let key: Value =
        serde_json::from_str(text).map_err(|e| format!("the service key is not JSON: {e}"))?;
    let Value::Object(key) = key else {
        return Err("the service key must be a JSON object".into());
    };
    let field = |name: &str| -> Result<&str, String> {
        match key.get(name) {
            None => Err(format!("the service key has no {name}")),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.as_str()),
            Some(other) => Err(format!(
                "the service key's {name} must be a non-empty string, not {}",
                describe(other)
            )),
        }
    };
    field("clientid")?;
    field("clientsecret")?;
    let subaccount = field("subaccount_id")?;
    if let Some(configured) = &config.subaccount_id
        && configured != subaccount
    {
        return Err(format!(
            "subaccountId {configured:?} in the configuration is not the service key's subaccount_id {subaccount:?}"
        ));
    }
    Ok(subaccount.to_owned())
}

/// Typed access to the parsed configuration by path, with messages that name the path and what
/// YAML 1.1 read there.
struct Fields<'a>(&'a Value);

impl<'a> Fields<'a> {
    fn get(&self, path: &[&str]) -> Option<&'a Value> {
        path.iter().try_fold(self.0, |v, key| v.get(key))
    }

    fn wrong(&self, path: &[&str], want: &str) -> String {
        let name = path.join(".");
        match self.get(path) {
            None => format!("{name} is missing ({want})"),
            Some(found) => {
                let misread_scalar =
                    matches!(found, Value::Bool(_) | Value::Number(_) | Value::Null)
                        || matches!(found, Value::Object(m) if yaml11::marker(m).is_some());
                let hint = if misread_scalar && want.contains("string") {
                    "; quote the value to make it a string"
                } else {
                    ""
                };
                format!(
                    "{name} must be {want}, but YAML 1.1 reads {}{hint}",
                    describe(found)
                )
            }
        }
    }

    fn non_empty_string(&self, path: &[&str]) -> Result<&'a str, String> {
        match self.get(path) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
            _ => Err(self.wrong(path, "a non-empty string")),
        }
    }

    fn one_of(&self, path: &[&str], allowed: &[&str]) -> Result<&'a str, String> {
        match self.get(path) {
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(s),
            _ => Err(self.wrong(path, &format!("one of the strings {}", allowed.join(", ")))),
        }
    }

    fn boolean(&self, path: &[&str]) -> Result<bool, String> {
        match self.get(path) {
            Some(Value::Bool(b)) => Ok(*b),
            _ => Err(self.wrong(path, "a boolean")),
        }
    }

    fn optional_boolean(&self, path: &[&str]) -> Result<Option<bool>, String> {
        match self.get(path) {
            None => Ok(None),
            Some(_) => self.boolean(path).map(Some),
        }
    }

    fn port(&self, path: &[&str]) -> Result<u16, String> {
        match self.get(path).and_then(Value::as_u64) {
            Some(p) if (1..=65535).contains(&p) => u16::try_from(p).map_err(|e| e.to_string()),
            _ => Err(self.wrong(path, "an integer port 1-65535")),
        }
    }

    fn mapping(&self, path: &[&str]) -> Result<&'a Map<String, Value>, String> {
        match self.get(path) {
            Some(Value::Object(m)) if yaml11::marker(m).is_none() || m.is_empty() => Ok(m),
            _ => Err(self.wrong(path, "a mapping")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Problem, TUNNEL_PORT, check, check_config};
    use serde_json::{Value, json};

    /// The configuration render_config writes for the default CR (dedicated tenant, all three
    /// proxies without authorization), through the controller's YAML writer.
    fn rendered() -> Value {
        json!({
            "highAvailabilityMode": "off",
            "integration": {"auditlog": {"mode": "console"}, "connectivityService": {"serviceCredentialsKey": "service_key"}},
            "multiRegionMode": {"enabled": false},
            "serviceChannels": {"enabled": true},
            "servers": {
                "businessDataTunnel": {"externalHost": "cp.example.kyma.com", "externalPort": 443},
                "proxy": {
                    "http": {"enableProxyAuthorization": false, "enabled": true, "port": 20003},
                    "rfcAndLdap": {"enableProxyAuthorization": false, "enabled": true, "port": 20001},
                    "socks5": {"enableProxyAuthorization": false, "enabled": true, "port": 20004}
                }
            },
            "subaccountId": "0123-4567",
            "subaccountSubdomain": "my-subdomain",
            "tenantMode": "dedicated"
        })
    }

    const KEY: &str =
        r#"{"clientid":"cid","clientsecret":"secret","subaccount_id":"0123-4567","url":"x"}"#;

    fn yaml(v: &Value) -> String {
        cp_api::yaml11::to_string(v)
    }

    fn config_problem(v: &Value) -> String {
        match check(&yaml(v), KEY) {
            Err(Problem::Config(p)) => p,
            other => panic!("expected a configuration problem, got {other:?}"),
        }
    }

    #[test]
    fn the_tunnel_port_is_the_operators() {
        assert_eq!(i32::from(TUNNEL_PORT), cp_api::names::TUNNEL_PORT);
    }

    #[test]
    fn the_rendered_configuration_reads_back() {
        let ready = check(&yaml(&rendered()), KEY).expect("ready");
        assert_eq!(ready.config.parsed, rendered());
        assert_eq!(ready.key_subaccount, "0123-4567");
        assert_eq!(ready.config.subaccount_id.as_deref(), Some("0123-4567"));
        assert_eq!(ready.config.credentials_key, "service_key");
        assert_eq!(ready.config.listen_ports(), vec![8042, 20003, 20001, 20004]);
    }

    #[test]
    fn disabled_proxies_do_not_listen() {
        let mut cfg = rendered();
        cfg["servers"]["proxy"]["socks5"] =
            json!({"enableProxyAuthorization": false, "enabled": false, "port": 8042});
        cfg["servers"]["proxy"]["http"]["enableProxyAuthorization"] = json!(true);
        cfg["servers"]["proxy"]["authorization"] = json!({"oauth": {"allowedClientId": "client"}});
        let ready = check(&yaml(&cfg), KEY).expect("ready");
        assert_eq!(ready.config.listen_ports(), vec![8042, 20003, 20001]);
        cfg["servers"]["proxy"]["authorization"] = json!({"oauth": {}});
        let p = config_problem(&cfg);
        assert!(
            p.contains("servers.proxy.authorization.oauth.allowedClientId is missing"),
            "{p}"
        );
    }

    /// YAML 1.2 (serde_norway) writes `off` and an all-digit subaccount id plain; the proxy reads
    /// them as the boolean false and an (octal) integer, and so does the stand-in.
    #[test]
    fn yaml12_output_is_misread_and_caught() {
        let text =
            yaml(&rendered()).replace("highAvailabilityMode: \"off\"", "highAvailabilityMode: off");
        assert!(text.contains("highAvailabilityMode: off\n"), "{text}");
        let p = match check(&text, KEY) {
            Err(Problem::Config(p)) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            p,
            "highAvailabilityMode must be one of the strings off, path, subdomain, but YAML 1.1 reads boolean false; quote the value to make it a string"
        );
        let yaml12 = serde_norway::to_string(&rendered()).expect("serde_norway");
        assert!(check_config(&yaml12).is_err(), "{yaml12}");

        let mut cfg = rendered();
        cfg["subaccountId"] = json!("0123");
        let text = yaml(&cfg).replace("\"0123\"", "0123");
        let p = check_config(&text).expect_err("octal");
        assert_eq!(
            p,
            "subaccountId must be a non-empty string, but YAML 1.1 reads the integer 83; quote the value to make it a string"
        );
        // A port written with a leading zero is octal to the proxy: it listens elsewhere.
        let text = yaml(&rendered()).replace("port: 20003", "port: 020003");
        let c = check_config(&text).expect("octal port");
        assert_eq!(c.ports.first(), Some(&("http", 0o20003)));
    }

    #[test]
    fn missing_and_wrong_fields_are_named() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |c| drop(c.as_object_mut().map(|o| o.remove("tenantMode"))),
                "tenantMode is missing",
            ),
            (
                |c| c["tenantMode"] = json!("solo"),
                "tenantMode must be one of the strings dedicated, shared",
            ),
            (
                |c| drop(c.as_object_mut().map(|o| o.remove("subaccountId"))),
                "subaccountId is missing (tenantMode is dedicated)",
            ),
            (
                |c| drop(c.as_object_mut().map(|o| o.remove("subaccountSubdomain"))),
                "subaccountSubdomain is missing",
            ),
            (
                |c| c["servers"]["businessDataTunnel"]["externalHost"] = json!(""),
                "servers.businessDataTunnel.externalHost must be a non-empty string",
            ),
            (
                |c| c["servers"]["businessDataTunnel"]["externalPort"] = json!("443"),
                "servers.businessDataTunnel.externalPort must be an integer port",
            ),
            (
                |c| c["servers"]["proxy"]["http"]["port"] = json!(70000),
                "servers.proxy.http.port must be an integer port",
            ),
            (
                |c| c["servers"]["proxy"]["http"]["enabled"] = json!("yes"),
                "servers.proxy.http.enabled must be a boolean, but YAML 1.1 reads the string \"yes\"",
            ),
            (
                |c| c["servers"]["proxy"]["socks5"]["port"] = json!(20003),
                "servers.proxy.socks5.port 20003 is also servers.proxy.http.port",
            ),
            (
                |c| c["servers"]["proxy"]["socks5"]["port"] = json!(8042),
                "the tunnel port",
            ),
            (
                |c| {
                    drop(
                        c["servers"]["proxy"]
                            .as_object_mut()
                            .map(|o| o.remove("rfcAndLdap")),
                    )
                },
                "servers.proxy.rfcAndLdap is missing",
            ),
            (
                |c| c["integration"]["auditlog"]["mode"] = json!("file"),
                "integration.auditlog.mode must be one of the strings console, service",
            ),
            (
                |c| {
                    c["integration"]["connectivityService"]["serviceCredentialsKey"] = json!("../x")
                },
                "is not a file name",
            ),
            (
                |c| c["multiRegionMode"] = json!({"enabled": true}),
                "multiRegionMode.configMapName is missing",
            ),
            (
                |c| c["serviceChannels"] = json!(true),
                "serviceChannels must be a mapping",
            ),
            (|c| *c = json!([1]), "the file must be a mapping"),
        ];
        for (edit, needle) in cases {
            let mut cfg = rendered();
            edit(&mut cfg);
            let p = config_problem(&cfg);
            assert!(p.contains(needle), "{needle:?} not in {p:?}");
        }
        let p = check_config("a: [\n").expect_err("broken");
        assert!(p.starts_with("not readable as YAML 1.1: line 1:"), "{p}");
    }

    #[test]
    fn shared_tenant_needs_no_subaccount() {
        let mut cfg = rendered();
        cfg["tenantMode"] = json!("shared");
        cfg.as_object_mut().map(|o| o.remove("subaccountId"));
        let ready = check(&yaml(&cfg), KEY).expect("ready");
        assert_eq!(ready.config.subaccount_id, None);
        assert_eq!(ready.key_subaccount, "0123-4567");
    }

    #[test]
    fn the_service_key_is_checked() {
        let text = yaml(&rendered());
        for (key, needle) in [
            ("", "the service key is not JSON"),
            ("[1]", "must be a JSON object"),
            (
                r#"{"clientsecret":"s","subaccount_id":"0123-4567"}"#,
                "the service key has no clientid",
            ),
            (
                r#"{"clientid":"c","subaccount_id":"0123-4567"}"#,
                "the service key has no clientsecret",
            ),
            (
                r#"{"clientid":"c","clientsecret":"s"}"#,
                "the service key has no subaccount_id",
            ),
            (
                r#"{"clientid":"c","clientsecret":"","subaccount_id":"0123-4567"}"#,
                "clientsecret must be a non-empty string",
            ),
            (
                r#"{"clientid":"c","clientsecret":"s","subaccount_id":7}"#,
                "subaccount_id must be a non-empty string",
            ),
            (
                r#"{"clientid":"c","clientsecret":"s","subaccount_id":"other"}"#,
                "subaccountId \"0123-4567\" in the configuration is not the service key's subaccount_id \"other\"",
            ),
        ] {
            match check(&text, key) {
                Err(Problem::ServiceKey(p)) => {
                    assert!(p.contains(needle), "{needle:?} not in {p:?}")
                }
                other => panic!("{key}: {other:?}"),
            }
        }
    }
}
