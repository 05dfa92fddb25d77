//! `make soak`: the controller SIGKILLed at random points of a legacy takeover (migration, then the
//! install to Ready), 20 runs, each on a fresh control plane: every run must converge to the same
//! final state with nothing lost. Set `CP_SOAK_RUNS` and `CP_SOAK_SEED` to change or replay a run.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use cp_tests::ControlPlane;
use cp_tests::cluster::Options;
use cp_tests::controller::ControllerProcess;
use cp_tests::{fixtures, legacy};

/// xorshift64*: enough randomness for kill points, replayable from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A delay in `0..max_ms` milliseconds.
    fn delay(&mut self, max_ms: u64) -> Duration {
        Duration::from_millis(self.next() % max_ms)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test]
#[ignore = "long: run by `make soak`"]
async fn controller_killed_at_random_points_converges_every_time() {
    let runs = env_u64("CP_SOAK_RUNS").unwrap_or(20);
    let seed = env_u64("CP_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1
    });
    println!("soak: {runs} runs, CP_SOAK_SEED={seed}");
    let mut rng = Rng(seed);
    let mut converged = 0;
    let mut total_kills = 0;
    for run in 0..runs {
        let started = Instant::now();
        let cp = tokio::task::spawn_blocking(|| ControlPlane::start(Options::default()))
            .await
            .expect("join")
            .expect("control plane");
        let admin = cp.admin().await.expect("admin");
        fixtures::apply_our_crds(&admin)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let before = legacy::legacy_cluster(&admin).await;
        legacy::create_default_cr(&admin).await;
        // 1 to 4 kills, each after a random time in the controller's life (0-3 s after it is ready,
        // which spans the migration steps, the applies and the status writes).
        let kills = 1 + rng.next() % 4;
        let mut points = Vec::new();
        for k in 0..kills {
            let name = format!("controller-{k}");
            ControllerProcess::start(&cp, &name, &["--leader-elect=false"])
                .await
                .expect("controller");
            let delay = rng.delay(3000);
            tokio::time::sleep(delay).await; // the random kill point, not a synchronisation
            cp.kill_process(&name).expect("SIGKILL");
            points.push(format!("{}ms", delay.as_millis()));
        }
        ControllerProcess::start(&cp, "controller-final", &["--leader-elect=false"])
            .await
            .expect("controller");
        legacy::finish(&admin).await;
        legacy::assert_taken_over(&admin, &before, 20003).await;
        converged += 1;
        total_kills += kills;
        println!(
            "run {}/{runs}: {kills} SIGKILLs after {} -> converged in {:?} ({} mappings kept)",
            run + 1,
            points.join(", "),
            started.elapsed(),
            before.len()
        );
        drop(cp);
    }
    println!("soak: {converged}/{runs} converged, {total_kills} SIGKILLs in all, seed {seed}");
}
