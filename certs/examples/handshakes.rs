//! Full TLS handshakes per second on this build's provider (`cp_certs::crypto`), client and server in one
//! thread over memory: what the FIPS build costs the webhook per new connection (docs/fips.md).
//!
//!     cargo run -q --profile test-image -p cp-certs --example handshakes -- [seconds] [ecdsa|rsa]
//!     cargo run -q --profile fips -p cp-certs --no-default-features --features fips --example handshakes
//!
//! Each handshake is TLS 1.3 with this build's preferred suite and group, a server certificate of the
//! given key type signed by a CA of the same type, and no session resumption. Not a benchmark of record
//! (`make bench` is): one core, no sockets, no kernel.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cp_certs::{Ca, KeyAlgorithm, LeafSpec};
use rustls::Connection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let algorithm: KeyAlgorithm = args.next().unwrap_or_else(|| "ecdsa".into()).parse()?;
    let fips = cp_certs::crypto::install()?;
    let now = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    let ca = Ca::generate("bench-ca", now, now + time::Duration::days(1), algorithm)?;
    let mut spec = LeafSpec::server(
        "localhost",
        &["localhost"],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        now,
        time::Duration::days(1),
    );
    spec.algorithm = algorithm;
    let leaf = ca.issue(&spec)?;

    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes())?];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
    let server = Arc::new(
        rustls::ServerConfig::builder_with_provider(cp_certs::crypto::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(chain, key)?,
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())?)?;
    let mut client_config =
        rustls::ClientConfig::builder_with_provider(cp_certs::crypto::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
    client_config.resumption = rustls::client::Resumption::disabled();
    let client = Arc::new(client_config);

    let name = ServerName::try_from("localhost")?;
    let (mut count, mut suite, mut group) = (0u64, String::new(), String::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        let mut c = Connection::from(rustls::ClientConnection::new(client.clone(), name.clone())?);
        let mut s = Connection::from(rustls::ServerConnection::new(server.clone())?);
        while c.is_handshaking() || s.is_handshaking() {
            transfer(&mut c, &mut s)?;
            transfer(&mut s, &mut c)?;
        }
        if count == 0 {
            suite = format!("{:?}", c.negotiated_cipher_suite().map(|s| s.suite()));
            group = format!("{:?}", c.negotiated_key_exchange_group().map(|g| g.name()));
        }
        count += 1;
    }
    let rate = count as f64 / start.elapsed().as_secs_f64();
    println!(
        "backend={} fips={fips} key={algorithm:?} suite={suite} group={group} handshakes={count} rate={rate:.0}/s",
        cp_certs::crypto::backend_name()
    );
    Ok(())
}

/// Moves what `from` has to send into `to` and lets `to` process it.
fn transfer(from: &mut Connection, to: &mut Connection) -> Result<(), Box<dyn std::error::Error>> {
    let mut buf = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut buf)?;
    }
    let mut rd = &buf[..];
    while !rd.is_empty() {
        to.read_tls(&mut rd)?;
        to.process_new_packets()?;
    }
    Ok(())
}
