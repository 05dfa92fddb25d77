//! The Connectivity CA fetch sends nothing to a host that is not on the operator's list, nor to an
//! address inside the cluster's or a special-purpose range. Only loopback traffic: a test DNS server on
//! loopback answers the names, and what is refused is never connected to.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cp_controller::connectivity_ca::{CheckedResolver, Resolver, fetch};
use cp_controller::egress::Egress;

/// A loopback listener that counts the connections it accepts.
async fn listener() -> (u16, tokio::net::TcpListener) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("listener");
    (l.local_addr().expect("addr").port(), l)
}

/// Whether anything connected to `l` (the kernel completes a handshake without an accept, so a
/// connection made before this call is there at once).
async fn connected(l: &tokio::net::TcpListener) -> bool {
    tokio::time::timeout(Duration::from_millis(1), l.accept())
        .await
        .is_ok()
}

/// A DNS server on loopback answering every name under `zone` with `answer`; its address.
fn dns(zone: &str, answer: Ipv4Addr) -> SocketAddr {
    let socket = std::net::UdpSocket::bind(("127.0.0.1", 0)).expect("udp");
    let addr = socket.local_addr().expect("addr");
    cp_tests::netns::serve_dns(socket, zone, answer);
    addr
}

fn egress(hosts: &[&str], allowed: &[&str]) -> Arc<Egress> {
    let s = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Arc::new(Egress::new(&s(hosts), &s(allowed), &[]).expect("egress"))
}

#[tokio::test]
async fn the_ca_fetch_does_not_connect_to_a_host_off_the_operators_list() {
    let (port, l) = listener().await;
    let url = format!("https://localhost:{port}/api/v1/CAs");
    let resolver = CheckedResolver::new(
        Resolver::from_system().expect("resolver"),
        Arc::new(Egress::default()),
    );
    let e = fetch(&url, Duration::from_secs(2), 1, &[], resolver)
        .await
        .expect_err("refused")
        .to_string();
    assert!(e.contains("not on the operator's list"), "{e}");
    assert!(!connected(&l).await, "the fetch connected to {url}");
}

#[tokio::test]
async fn a_name_resolving_into_a_private_range_is_refused_without_connecting() {
    // The name is on the list; the DNS answer is what an attacker controls.
    let hosts = [".cp-test.hana.ondemand.com"];
    let private = dns(
        "private.cp-test.hana.ondemand.com",
        Ipv4Addr::new(10, 1, 2, 3),
    );
    let resolver = CheckedResolver::new(
        Resolver::with_server(private).expect("resolver"),
        egress(&hosts, &[]),
    );
    // Resolution alone refuses it: the connector is never handed 10.1.2.3.
    let e = resolver
        .resolve("ca.private.cp-test.hana.ondemand.com")
        .await
        .expect_err("10.1.2.3 refused")
        .to_string();
    assert!(e.contains("10.1.2.3") && e.contains("private"), "{e}");

    // A loopback answer (the cluster's own node, a sidecar) is refused by the fetch before it
    // connects: the listener on that address sees nothing.
    let (port, l) = listener().await;
    let looped = dns("loop.cp-test.hana.ondemand.com", Ipv4Addr::LOCALHOST);
    let url = format!("https://ca.loop.cp-test.hana.ondemand.com:{port}/api/v1/CAs");
    let refusing = CheckedResolver::new(
        Resolver::with_server(looped).expect("resolver"),
        egress(&hosts, &[]),
    );
    let e = fetch(&url, Duration::from_secs(2), 3, &[], refusing)
        .await
        .expect_err("loopback refused")
        .to_string();
    assert!(e.contains("127.0.0.1") && e.contains("loopback"), "{e}");
    assert!(
        !connected(&l).await,
        "the fetch connected to a refused address"
    );

    // The same name with loopback allowed by the operator: the fetch does connect (and fails TLS, as
    // nothing speaks it there), so the refusal above was the filter's.
    let allowing = CheckedResolver::new(
        Resolver::with_server(looped).expect("resolver"),
        egress(&hosts, &["127.0.0.1/32"]),
    );
    let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
    let _ = fetch(&url, Duration::from_secs(2), 1, &[], allowing).await;
    tokio::time::timeout(Duration::from_secs(5), accept)
        .await
        .expect("the allowed fetch connected")
        .expect("task")
        .expect("accept");
}
