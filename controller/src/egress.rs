//! What the Connectivity CA fetch may reach: a host on the operator's allowlist (never one the service
//! key names), at an address outside the cluster's and the special-purpose ranges, checked after
//! resolution on every address the name resolves to; the connection then goes to a checked address, so
//! a second resolution cannot swap in another one (no DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The hosts the CA is fetched from by default: the SAP BTP landscapes' domains.
pub const DEFAULT_HOSTS: &str = ".hana.ondemand.com,.cloud.sap";

/// Why an egress rule or a destination is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A network flag's value is not `address/prefix`.
    #[error("{0:?} is not an IP network (address/prefix)")]
    NotANetwork(String),
    /// A network's prefix is out of range.
    #[error("{net:?}: the prefix must be a number from 0 to {max}")]
    Prefix {
        /// The network as given.
        net: String,
        /// 32 or 128.
        max: u8,
    },
    /// A host suffix that would allow a whole top-level domain.
    #[error(
        "CA host suffix {0:?} has fewer than two labels (or an empty or invalid one): it would allow a whole top-level domain; name e.g. .hana.ondemand.com"
    )]
    TopLevelSuffix(String),
    /// A host that is no host name.
    #[error("CA host {0:?} is not a valid host name")]
    HostName(String),
    /// A host not on the operator's list.
    #[error(
        "host {host} is not on the operator's list of Connectivity CA hosts ({allowed}); the CA is not fetched (the list is --connectivity-ca-hosts)"
    )]
    HostNotListed {
        /// The host.
        host: String,
        /// The list.
        allowed: String,
    },
    /// An address in one of the cluster's networks.
    #[error("{ip} is in the cluster's network {net}")]
    ClusterNetwork {
        /// The address.
        ip: IpAddr,
        /// The network.
        net: Net,
    },
    /// An address of a special-purpose range.
    #[error("{ip} is a {range} address")]
    SpecialPurpose {
        /// The address.
        ip: IpAddr,
        /// The range's name.
        range: &'static str,
    },
}

/// An IP network, `address/prefix` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    /// Parses `10.0.0.0/8`, `fd00::/8` or a bare address.
    pub fn parse(s: &str) -> Result<Self, Refused> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| Refused::NotANetwork(s.into()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| Refused::Prefix { net: s.into(), max })?,
        };
        Ok(Net { addr, prefix })
    }

    /// Whether `ip` is inside (an IPv4 network never contains an IPv6 address, nor the reverse).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        (0, _, _) => Some("unspecified (0.0.0.0/8)"),
        (10, _, _) => Some("private (10.0.0.0/8)"),
        (100, 64..=127, _) => Some("carrier-grade NAT (100.64.0.0/10)"),
        (127, _, _) => Some("loopback (127.0.0.0/8)"),
        (169, 254, _) => Some("link-local (169.254.0.0/16, cloud metadata)"),
        (172, 16..=31, _) => Some("private (172.16.0.0/12)"),
        (192, 0, 0) => Some("IETF protocol assignments (192.0.0.0/24)"),
        (192, 168, _) => Some("private (192.168.0.0/16)"),
        (198, 18..=19, _) => Some("benchmarking (198.18.0.0/15)"),
        (224..=239, _, _) => Some("multicast (224.0.0.0/4)"),
        (240..=255, _, _) => Some("reserved or broadcast (240.0.0.0/4)"),
        _ => None,
    }
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_range(v4);
    }
    let seg = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address it embeds; the local-use 64:ff9b:1::/48 is the
    // cluster's own translator.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let o = ip.octets();
        return v4_range(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if seg[..3] == [0x64, 0xff9b, 1] {
        return Some("local-use NAT64 (64:ff9b:1::/48)");
    }
    match seg[0] {
        0 if seg[1..6] == [0; 5] => Some("IPv4-compatible (::/96, deprecated)"),
        s if s & 0xfe00 == 0xfc00 => Some("unique local (fc00::/7)"),
        s if s & 0xffc0 == 0xfe80 => Some("link-local (fe80::/10)"),
        s if s & 0xffc0 == 0xfec0 => Some("site-local (fec0::/10, deprecated)"),
        s if s & 0xff00 == 0xff00 => Some("multicast (ff00::/8)"),
        _ => None,
    }
}

/// The special-purpose range `ip` is in (private, loopback, link-local, unspecified, carrier-grade
/// NAT, unique local, multicast, ...), if any: addresses a CA endpoint on the internet never has, and
/// where the cluster's own services (and a cloud's metadata endpoint) live. IPv4-mapped and NAT64
/// IPv6 addresses are judged by the IPv4 address they carry.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

/// One allowlist entry: `.example.com` (that domain's subdomains) or `host.example.com` (that host).
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostRule {
    Suffix(String),
    Exact(String),
}

fn normalise(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Where the Connectivity CA may be fetched from, as the operator configures it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Egress {
    hosts: Vec<HostRule>,
    allowed_networks: Vec<Net>,
    refused_networks: Vec<Net>,
}

impl Default for Egress {
    fn default() -> Self {
        let hosts: Vec<String> = DEFAULT_HOSTS.split(',').map(String::from).collect();
        Self::new(&hosts, &[], &[]).unwrap_or(Egress {
            hosts: vec![],
            allowed_networks: vec![],
            refused_networks: vec![],
        })
    }
}

impl Egress {
    /// `hosts`: `.domain.tld` suffixes (at least two labels: `.com` would allow the whole TLD) or exact
    /// host names. `allowed_networks`: exceptions to the special-purpose ranges (a private landscape's
    /// endpoint; the tests' loopback one). `refused_networks`: the cluster's pod and Service ranges,
    /// refused even where they are public addresses.
    pub fn new(
        hosts: &[String],
        allowed_networks: &[String],
        refused_networks: &[String],
    ) -> Result<Self, Refused> {
        let mut rules = Vec::new();
        for raw in hosts.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
            // "." (the root) normalises to nothing: a suffix of no label at all.
            let h = match normalise(raw) {
                h if h.is_empty() => ".".to_string(),
                h => h,
            };
            let valid = |s: &str| {
                s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
            };
            match h.strip_prefix('.') {
                Some(domain) if valid(domain) && domain.contains('.') => {
                    rules.push(HostRule::Suffix(h.clone()))
                }
                Some(_) => return Err(Refused::TopLevelSuffix(h)),
                None if valid(&h) => rules.push(HostRule::Exact(h)),
                None => return Err(Refused::HostName(h)),
            }
        }
        let nets = |list: &[String]| -> Result<Vec<Net>, Refused> {
            list.iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .map(Net::parse)
                .collect()
        };
        Ok(Egress {
            hosts: rules,
            allowed_networks: nets(allowed_networks)?,
            refused_networks: nets(refused_networks)?,
        })
    }

    /// Whether the CA may be fetched from `host` (a DNS name): it is on the operator's allowlist.
    pub fn check_host(&self, host: &str) -> Result<(), Refused> {
        let host = normalise(host);
        let allowed = self.hosts.iter().any(|r| match r {
            HostRule::Suffix(s) => host.ends_with(s.as_str()),
            HostRule::Exact(e) => host == *e,
        });
        if allowed {
            Ok(())
        } else {
            Err(Refused::HostNotListed {
                host,
                allowed: self.describe_hosts(),
            })
        }
    }

    /// Whether the CA fetch may connect to `ip`: not in a refused network nor a special-purpose range,
    /// unless the operator allowed its network.
    pub fn check_address(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allowed_networks.iter().any(|n| n.contains(ip)) {
            return Ok(());
        }
        if let Some(n) = self.refused_networks.iter().find(|n| n.contains(ip)) {
            return Err(Refused::ClusterNetwork { ip, net: *n });
        }
        match special_range(ip) {
            Some(range) => Err(Refused::SpecialPurpose { ip, range }),
            None => Ok(()),
        }
    }

    fn describe_hosts(&self) -> String {
        if self.hosts.is_empty() {
            return "empty".into();
        }
        self.hosts
            .iter()
            .map(|r| match r {
                HostRule::Suffix(s) | HostRule::Exact(s) => s.as_str(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn special_purpose_addresses_are_refused_and_public_ones_pass() {
        let e = Egress::default();
        for refused in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "100.127.255.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::10.0.0.1",
            "ff02::1",
        ] {
            assert!(e.check_address(ip(refused)).is_err(), "{refused} passed");
        }
        for public in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
            "2a05:d014::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(e.check_address(ip(public)), Ok(()), "{public}");
        }
        let msg = e
            .check_address(ip("169.254.169.254"))
            .expect_err("metadata")
            .to_string();
        assert!(msg.contains("link-local"), "{msg}");
    }

    #[test]
    fn the_operator_may_allow_a_network_and_refuse_the_clusters_ranges() {
        let e = Egress::new(
            &[".hana.ondemand.com".into()],
            &["127.0.0.1/32".into(), "fd12::/16".into()],
            &["203.0.113.0/24".into()],
        )
        .expect("egress");
        assert_eq!(e.check_address(ip("127.0.0.1")), Ok(()));
        assert!(e.check_address(ip("127.0.0.2")).is_err());
        assert_eq!(e.check_address(ip("fd12::5")), Ok(()));
        let msg = e
            .check_address(ip("203.0.113.7"))
            .expect_err("cluster range")
            .to_string();
        assert!(msg.contains("203.0.113.0/24"), "{msg}");
        assert!(Egress::new(&[], &["10.0.0.0/33".into()], &[]).is_err());
        assert!(Egress::new(&[], &["not-a-net".into()], &[]).is_err());
    }

    #[test]
    fn hosts_must_be_on_the_operators_list_and_suffixes_have_two_labels() {
        let e = Egress::default();
        assert_eq!(
            e.check_host("connectivity.cf.eu10.hana.ondemand.com"),
            Ok(())
        );
        assert_eq!(e.check_host("Connectivity.CF.eu12.cloud.sap."), Ok(()));
        for bad in [
            "evil.example.com",
            "hana.ondemand.com.evil.com",
            "evilhana.ondemand.com",
            "localhost",
        ] {
            assert!(e.check_host(bad).is_err(), "{bad}");
        }
        for one_label in [".com", ".sap", ".", "..sap"] {
            let err = Egress::new(&[one_label.into()], &[], &[])
                .expect_err(one_label)
                .to_string();
            assert!(err.contains("two labels"), "{one_label}: {err}");
        }
        let exact = Egress::new(&["localhost".into()], &[], &[]).expect("exact host");
        assert_eq!(exact.check_host("localhost"), Ok(()));
        assert!(exact.check_host("a.localhost").is_err());
    }
}
