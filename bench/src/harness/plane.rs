//! Starting and stopping what is measured: a local control plane or the node for the length of a
//! measurement (both start a runtime of their own and block while they stop, so on a thread of their
//! own), the pid of a process by name, and holding processes still (SIGSTOP) or on a CPU while
//! another one is measured.

use std::process::{Command, Stdio};

use anyhow::Context;
use cp_tests::ControlPlane;
use cp_tests::cluster::Options;
use cp_tests::node::Cluster;

/// Runs `f` on a thread of its own (not one of the runtime's) and awaits its result.
async fn on_own_thread<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.await.with_context(|| format!("the thread {what} died"))
}

/// Stops what [`with_control_plane`] or [`with_node`] started: dropping it waits for its processes
/// to exit.
async fn stop<T: Send + 'static>(what: &str, started: T) -> anyhow::Result<()> {
    on_own_thread(what, move || drop(started)).await
}

/// Runs `measure` against a local control plane of its own (`cp_tests::ControlPlane` with
/// `options`), stopped afterwards, also when `measure` fails.
pub async fn with_control_plane<T>(
    options: Options,
    measure: impl AsyncFnOnce(&ControlPlane) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let cp = on_own_thread("starting the control plane", move || {
        ControlPlane::start(options)
    })
    .await?
    .context("starting the local control plane")?;
    let result = measure(&cp).await;
    let _ = stop("stopping the control plane", cp).await;
    result
}

/// Runs `measure` on the project's real node (`cp_tests::node::Cluster`), stopped afterwards (its
/// processes end with it), also when `measure` fails.
pub async fn with_node<T>(
    measure: impl AsyncFnOnce(&Cluster) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let cluster = on_own_thread("starting the node", || Cluster::start_in(None, false))
        .await?
        .context("starting the node")?;
    let result = measure(&cluster).await;
    stop("stopping the node", cluster).await?;
    result
}

/// The pid of the control plane's process `name`.
pub fn pid(cp: &ControlPlane, name: &str) -> anyhow::Result<u32> {
    cp.pid(name)
        .with_context(|| format!("{name} is not running"))
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Stops processes for the time it lives; resumes them when dropped (also on an error).
pub struct Paused(Vec<u32>);

impl Paused {
    pub fn new(pids: Vec<u32>) -> Self {
        for &p in &pids {
            signal(p, "STOP");
        }
        Self(pids)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &p in &self.0 {
            signal(p, "CONT");
        }
    }
}

/// Pins every thread of this process to `cpus`.
pub fn pin_self(cpus: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .context("taskset")?;
    anyhow::ensure!(status.success(), "taskset -p failed: {status}");
    Ok(())
}
