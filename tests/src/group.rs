//! Test groups: several former test binaries merged into one, each keeping a control plane (or node) of
//! its own and never overlapping another.
//!
//! A test's group is the first segment of its name (`certs::…` → `certs`): libtest names each test's
//! thread after the test. The first harness call of a test that needs its group's resources
//! ([`join`], through [`ControlPlane::shared`](crate::ControlPlane::shared), [`Slot`] and the other
//! shared helpers) waits until no test of another group runs; when the group changes, the previous
//! group's control planes and nodes are stopped and its slots forgotten, so the next group starts on
//! fresh ones, exactly as a test binary of its own did. libtest runs tests in name order, so a group's
//! tests run together and each group starts once.
//!
//! A call from a thread that is no test's (a tokio worker of a `multi_thread` test) belongs to the group
//! that runs: groups never overlap.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// What a group holds until the next group takes over: stopped then, in reverse order of creation.
type Stop = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Turn {
    /// The group whose tests run (or ran last).
    current: Option<String>,
    /// Bumped at every change of group: slots of an older generation are stale.
    generation: u64,
    /// Tests of `current` that have joined and not yet ended.
    active: usize,
    /// How to stop what `current` started.
    stops: Vec<Stop>,
}

fn turn() -> &'static (Mutex<Turn>, Condvar) {
    static TURN: OnceLock<(Mutex<Turn>, Condvar)> = OnceLock::new();
    TURN.get_or_init(|| (Mutex::new(Turn::default()), Condvar::new()))
}

fn lock() -> MutexGuard<'static, Turn> {
    match turn().0.lock() {
        Ok(g) => g,
        // A test that panicked while holding it left the bookkeeping consistent (no step panics).
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Ends a test's membership when its thread ends (libtest runs each test on a thread of its own).
struct Membership;

impl Drop for Membership {
    fn drop(&mut self) {
        let mut t = lock();
        t.active = t.active.saturating_sub(1);
        debug(|| {
            format!(
                "{:?} leaves (active {})",
                std::thread::current().name(),
                t.active
            )
        });
        turn().1.notify_all();
    }
}

thread_local! {
    static MEMBER: RefCell<Option<(String, Membership)>> = const { RefCell::new(None) };
}

/// The group of a test named `name` (`module::…::test`): its first path segment.
pub fn group_of(name: &str) -> Option<&str> {
    name.split_once("::").map(|(g, _)| g)
}

/// Joins the calling test's group (once per test), waiting until tests of another group have ended;
/// returns the group's generation. From a thread that is no test's, the running group's.
pub fn join() -> u64 {
    let thread = std::thread::current();
    let Some(group) = thread.name().and_then(group_of).map(str::to_string) else {
        let t = lock();
        debug(|| {
            format!(
                "{:?} (no test) in {:?} gen {}",
                thread.name(),
                t.current,
                t.generation
            )
        });
        return t.generation;
    };
    let joined = MEMBER.with(|m| m.borrow().as_ref().map(|(g, _)| g == &group));
    if joined == Some(true) {
        return lock().generation;
    }
    let mut t = lock();
    loop {
        if t.current.as_deref() == Some(group.as_str()) {
            t.active += 1;
            break;
        }
        if t.active == 0 {
            let stops = std::mem::take(&mut t.stops);
            t.current = Some(group.clone());
            t.generation += 1;
            // This test is the group's first member before the lock is let go: a test of a third group
            // arriving while the previous group's resources stop waits, rather than taking over.
            t.active = 1;
            debug(|| format!("{group} takes over (gen {})", t.generation));
            // Stopping takes seconds; the group's other tests may join meanwhile but find nothing
            // started (their slots are of the new generation).
            drop(t);
            for stop in stops.into_iter().rev() {
                stop();
            }
            t = lock();
            break;
        }
        t = match turn().1.wait(t) {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
    }
    debug(|| format!("{:?} joins {group} (active {})", thread.name(), t.active));
    let generation = t.generation;
    drop(t);
    MEMBER.with(|m| *m.borrow_mut() = Some((group, Membership)));
    generation
}

/// With `CP_TEST_GROUP_DEBUG` set, traces each turn on stderr with the seconds since the first trace.
fn debug(msg: impl FnOnce() -> String) {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    if std::env::var_os("CP_TEST_GROUP_DEBUG").is_some() {
        let t = START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f32();
        eprintln!("[group {t:7.1}s] {}", msg());
    }
}

/// Registers how to stop something the running group started (a control plane, a node): run when the
/// next group takes over (at the process's end the watchdog stops what is left).
pub fn on_switch(stop: impl FnOnce() + Send + 'static) {
    lock().stops.push(Box::new(stop));
}

/// A value per group, created on first use by the group's first test that asks: what a test binary of
/// its own kept in a `static`. The value lives as long as the process (it is a handle: what it names
/// is stopped with its group).
pub struct Slot<T: 'static> {
    cells: Cells<tokio::sync::OnceCell<&'static T>>,
}

/// One cell per generation (only the current one is kept).
type Cells<C> = Mutex<Vec<(u64, Arc<C>)>>;

impl<T: Send + Sync + 'static> Slot<T> {
    /// An empty slot, for a `static`.
    pub const fn new() -> Self {
        Self {
            cells: Mutex::new(Vec::new()),
        }
    }

    fn cell(&self) -> Arc<tokio::sync::OnceCell<&'static T>> {
        let generation = join();
        let mut cells = match self.cells.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        cell_of(&mut cells, generation)
    }

    /// The group's value, created by `init` if this is the first ask.
    pub async fn get_or_init<F, Fut>(&self, init: F) -> &'static T
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let cell = self.cell();
        cell.get_or_init(|| async { &*Box::leak(Box::new(init().await)) })
            .await
    }
}

impl<T: Send + Sync + 'static> Default for Slot<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A value per group created synchronously (a control plane, a node): like [`Slot`], and the value's
/// `stop` is registered with [`on_switch`].
pub struct SyncSlot<T: 'static> {
    cells: Cells<OnceLock<Result<Arc<T>, String>>>,
}

impl<T: Send + Sync + 'static> Default for SyncSlot<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> SyncSlot<T> {
    /// An empty slot, for a `static`.
    pub const fn new() -> Self {
        Self {
            cells: Mutex::new(Vec::new()),
        }
    }

    /// The group's value: `start` on first ask (its error is every later ask's too); `stop` runs when
    /// the next group takes over.
    pub fn get_or_start(
        &self,
        start: impl FnOnce() -> Result<T, String>,
        stop: fn(&T),
    ) -> Result<Arc<T>, String> {
        let generation = join();
        let cell = {
            let mut cells = match self.cells.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            cell_of(&mut cells, generation)
        };
        cell.get_or_init(|| {
            let value = start().map(Arc::new);
            if let Ok(v) = &value {
                let v = v.clone();
                on_switch(move || stop(&v));
            }
            value
        })
        .clone()
    }
}

/// The cell of `generation`, created if missing; cells of older generations are dropped.
fn cell_of<C: Default>(cells: &mut Vec<(u64, Arc<C>)>, generation: u64) -> Arc<C> {
    cells.retain(|(g, _)| *g >= generation);
    if let Some((_, c)) = cells.iter().find(|(g, _)| *g == generation) {
        return c.clone();
    }
    let c = Arc::new(C::default());
    cells.push((generation, c.clone()));
    c
}

#[cfg(test)]
mod tests {
    use super::{group_of, join, on_switch};
    use std::sync::Mutex;
    use std::time::Duration;

    /// Tests of three groups arriving in any order, one group's stop taking a while: at no time do
    /// tests of two groups run.
    #[test]
    fn groups_never_overlap_even_while_the_previous_one_stops() {
        static RUNNING: Mutex<Vec<String>> = Mutex::new(Vec::new());
        static OWNERS: Mutex<std::collections::BTreeMap<u64, String>> =
            Mutex::new(std::collections::BTreeMap::new());
        // (test, when it arrives in ms): g3's tests arrive while g2 stops what g1 started.
        const ARRIVALS: [(&str, u64); 8] = [
            ("g1::a", 0),
            ("g1::b", 0),
            ("g1::c", 2),
            ("g2::a", 5),
            ("g2::b", 10),
            ("g3::a", 60),
            ("g3::b", 90),
            ("g3::c", 120),
        ];
        let threads: Vec<_> = ARRIVALS
            .iter()
            .map(|(name, at)| {
                std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn(move || {
                        std::thread::sleep(Duration::from_millis(*at));
                        let generation = join();
                        let group = name.split("::").next().unwrap_or_default().to_string();
                        {
                            // A generation's slots are one group's: no other group may get it.
                            let mut owners = OWNERS.lock().unwrap_or_else(|p| p.into_inner());
                            let owner = owners.entry(generation).or_insert_with(|| group.clone());
                            assert_eq!(
                                *owner, group,
                                "{name} got generation {generation} of {owner}"
                            );
                        }
                        {
                            let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some(other) = running.iter().find(|g| **g != group) {
                                panic!("{name} runs while a test of {other} runs");
                            }
                            running.push(group.clone());
                        }
                        on_switch(|| std::thread::sleep(Duration::from_millis(50)));
                        std::thread::sleep(Duration::from_millis(20));
                        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(i) = running.iter().position(|g| *g == group) {
                            running.remove(i);
                        }
                    })
                    .expect("spawn")
            })
            .collect();
        for t in threads {
            t.join().expect("no two groups ran at once");
        }
    }

    #[test]
    fn a_tests_group_is_the_first_segment_of_its_name() {
        assert_eq!(group_of("certs::the_cert_rotates"), Some("certs"));
        assert_eq!(group_of("e2e::webhook::edits_are_refused"), Some("e2e"));
        assert_eq!(group_of("main"), None);
        assert_eq!(group_of("tokio-runtime-worker"), None);
    }
}
