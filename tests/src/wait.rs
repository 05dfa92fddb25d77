//! Waiting on conditions with a deadline: the only synchronisation tests use.

use std::future::Future;
use std::time::Duration;

/// Polls `check` every 50 ms (backing off to 500 ms) until it returns `Some`, or fails after
/// `timeout` with `what` and the last observation.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(50);
    let mut last;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last = "condition not met".into(),
            Err(e) => last = e,
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}
