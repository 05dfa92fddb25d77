//! A network namespace of the run's own, for the cluster with a real node: every non-loopback address
//! (the node's address, the pod bridge, pod and Service IPs) lives inside it, and the host reaches it only
//! through loopback, by [`Netns::forward`]. Nothing in the machine's root namespace ever sends to a
//! private-range address.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};

/// The node's address inside the namespace (on a port-less bridge, `node0`; this kernel has no dummy links): the API server advertises it, pods reach
/// it through the bridge, the kubelet registers it as the node's InternalIP.
pub const NODE_IP: &str = "10.200.0.1";

/// Node-local DNS's address, where the node's stand-in DNS answers the pods (as on Gardener).
pub use cp_api::names::NODE_LOCAL_DNS_IP;

/// A named network namespace (`ip netns add`), deleted on drop. The control plane's watchdog deletes
/// it too when the test process dies without dropping it.
#[derive(Debug)]
pub struct Netns {
    /// Its name, as `ip netns` knows it.
    pub name: String,
    stop: Arc<AtomicBool>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    /// Creates the namespace with loopback up and the node's address on `node0`.
    pub fn create(name: &str) -> anyhow::Result<Netns> {
        let _ = ip(&["netns", "delete", name]);
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        ip(&["-n", name, "link", "add", "node0", "type", "bridge"])?;
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("{NODE_IP}/32"),
            "dev",
            "node0",
        ])?;
        // Node-local DNS's link-local address, as on Gardener (its node-local-dns runs in the host
        // network): the node's stand-in DNS answers there too, and the pods use it.
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("{NODE_LOCAL_DNS_IP}/32"),
            "dev",
            "node0",
        ])?;
        ip(&["-n", name, "link", "set", "node0", "up"])?;
        Ok(ns)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs `f` on a new thread that has entered the namespace: sockets it creates live there.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let path = self.path();
        std::thread::spawn(move || {
            enter(&path)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in the network namespace panicked"))?
    }

    /// A TCP listener bound to `addr` inside the namespace.
    pub fn bind_tcp(&self, addr: SocketAddr) -> anyhow::Result<TcpListener> {
        self.run(move || TcpListener::bind(addr).with_context(|| format!("binding {addr}")))
    }

    /// A UDP socket bound to `addr` inside the namespace.
    pub fn bind_udp(&self, addr: SocketAddr) -> anyhow::Result<UdpSocket> {
        self.run(move || UdpSocket::bind(addr).with_context(|| format!("binding {addr}")))
    }

    /// Forwards connections to `127.0.0.1:<port>` in the root namespace to `target` inside the namespace
    /// (the host's only way in). Returns the local port; the forwarder stops when the Netns is dropped.
    pub fn forward(&self, target: SocketAddr) -> anyhow::Result<u16> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let path = self.path();
        let stop = self.stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(outside) = conn else { continue };
                let path = path.clone();
                std::thread::spawn(move || {
                    let inside = std::thread::spawn(move || {
                        enter(&path)?;
                        Ok::<_, anyhow::Error>(TcpStream::connect(target)?)
                    })
                    .join();
                    match inside {
                        Ok(Ok(inside)) => splice(outside, inside),
                        _ => {
                            let _ = outside.shutdown(Shutdown::Both);
                        }
                    }
                });
            }
        });
        Ok(port)
    }
}

/// Copies both ways until each side closes.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one = std::thread::spawn(move || copy(a, b2));
    copy(b, a2);
    let _ = one.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 32 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn enter(path: &str) -> anyhow::Result<()> {
    let f = File::open(path).with_context(|| format!("opening {path}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering the network namespace {path}"))
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// A minimal DNS responder (the cluster has no DNS add-on): answers an A query for any name under
/// `zone` with `answer`, NXDOMAIN for anything else. Serves on its own thread until the process ends.
pub fn serve_dns(socket: UdpSocket, zone: &str, answer: std::net::Ipv4Addr) {
    let zone = zone.trim_end_matches('.').to_ascii_lowercase();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = socket.recv_from(&mut buf) {
            if let Some(reply) = dns_reply(&buf[..n], &zone, answer) {
                let _ = socket.send_to(&reply, peer);
            }
        }
    });
}

/// The reply to one DNS query (pure, for the unit test): one A record with a 5 s TTL for a name under
/// `zone` (or `zone` itself), an empty NOERROR answer for other types of such a name, NXDOMAIN
/// otherwise. `None` for what is not a query.
pub fn dns_reply(query: &[u8], zone: &str, answer: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The question: labels up to the root, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question_end = i + 4;
    let question = query.get(12..question_end)?;
    let name = labels.join(".");
    let ours = name == zone || name.ends_with(&format!(".{zone}"));
    let mut reply = Vec::with_capacity(question_end + 16);
    reply.extend_from_slice(&query[0..2]); // id
    let rcode = if ours { 0 } else { 3 };
    reply.extend_from_slice(&[0x84 | (query[2] & 0x01), 0x80 | rcode]); // response, authoritative, RD copied, RA
    reply.extend_from_slice(&1u16.to_be_bytes());
    let answers: u16 = if ours && qtype == 1 { 1 } else { 0 };
    reply.extend_from_slice(&answers.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if answers == 1 {
        reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        reply.extend_from_slice(&answer.octets());
    }
    Some(reply)
}

#[cfg(test)]
mod tests {
    use super::dns_reply;
    use std::net::Ipv4Addr;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn answers_names_in_the_zone_only() {
        let ip = Ipv4Addr::new(10, 200, 0, 1);
        let r = dns_reply(&query("ca.node.test", 1), "node.test", ip).unwrap();
        assert_eq!(&r[0..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[r.len() - 4..], &[10, 200, 0, 1]);
        let aaaa = dns_reply(&query("ca.node.test", 28), "node.test", ip).unwrap();
        assert_eq!(u16::from_be_bytes([aaaa[6], aaaa[7]]), 0, "no AAAA");
        let other = dns_reply(&query("example.com", 1), "node.test", ip).unwrap();
        assert_eq!(other[3] & 0x0f, 3, "NXDOMAIN");
        let sneaky = dns_reply(&query("evilnode.test", 1), "node.test", ip).unwrap();
        assert_eq!(sneaky[3] & 0x0f, 3, "a suffix match needs the dot");
        assert!(dns_reply(&[0u8; 5], "node.test", ip).is_none());
    }
}
