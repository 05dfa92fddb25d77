//! What `/proc` and the cgroup files say about a process or a container: CPU time, memory, the
//! machine's stolen time, CFS throttling.

use std::path::Path;

use anyhow::Context;

/// The text of `path`; the error names it.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// User + system CPU time of process `pid` (all its threads, living and exited), in µs.
pub fn process_cpu_us(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may contain spaces) start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: no ')'"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5), i.e. 12 and 13 after the state field.
    let ticks = |i: usize| -> anyhow::Result<u64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: short"))?
            .parse()?)
    };
    Ok((ticks(11)? + ticks(12)?) * 1_000_000 / clock_ticks())
}

fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// The machine's CPU time so far, from the first line of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug)]
pub struct CpuTicks {
    /// Every state's ticks added up.
    pub total: u64,
    /// Ticks stolen by the hypervisor.
    pub steal: u64,
}

impl CpuTicks {
    /// The share of `total` stolen since `earlier`, percent.
    pub fn since(&self, earlier: CpuTicks) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * self.steal.saturating_sub(earlier.steal) as f64 / total as f64
    }
}

/// Reads the machine's CPU ticks (all CPUs) from `/proc/stat`.
pub fn machine_ticks() -> anyhow::Result<CpuTicks> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    parse_cpu_ticks(&stat).ok_or_else(|| anyhow::anyhow!("/proc/stat: no cpu line"))
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal guest
/// guest_nice (guest time is already counted in user, so it is left out of the total).
fn parse_cpu_ticks(stat: &str) -> Option<CpuTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let steal = *v.get(7)?;
    Some(CpuTicks {
        total: v.iter().take(8).sum(),
        steal,
    })
}

/// A process's memory from `/proc/<pid>/status`, KiB.
#[derive(Clone, Copy, Debug)]
pub struct ProcMemory {
    /// `RssAnon`: anonymous resident memory (what the process allocated; its binary's file pages
    /// excluded).
    pub anon: u64,
    /// `VmRSS`: anonymous + file + shared resident pages.
    pub rss: u64,
    /// `VmHWM`: peak resident.
    pub hwm: u64,
}

/// Reads `RssAnon`, `VmRSS` and `VmHWM` of process `pid`.
pub fn process_memory(pid: u32) -> anyhow::Result<ProcMemory> {
    let path = format!("/proc/{pid}/status");
    let status = read_text(Path::new(&path))?;
    let field = |key: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {key} in {path}"))
    };
    Ok(ProcMemory {
        anon: field("RssAnon:")?,
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// CFS bandwidth figures of a cgroup over a window (`cpu.stat` of the v1 `cpu` controller).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Enforcement periods that elapsed with the group runnable.
    pub periods: u64,
    /// Of those, the periods in which it hit its quota and was throttled.
    pub throttled: u64,
    /// Time its threads spent throttled, µs.
    pub throttled_us: u64,
}

impl Throttling {
    /// Reads `cpu.stat` in the cgroup directory `dir`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("cpu.stat");
        Self::parse(&read_text(&path)?)
            .with_context(|| format!("{}: unexpected content", path.display()))
    }

    fn parse(text: &str) -> Option<Self> {
        let field = |k: &str| {
            text.lines().find_map(|l| {
                l.strip_prefix(k)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        };
        Some(Self {
            periods: field("nr_periods")?,
            throttled: field("nr_throttled")?,
            throttled_us: field("throttled_time")? / 1_000,
        })
    }

    /// What happened between `earlier` and this reading.
    pub fn since(&self, earlier: Self) -> Self {
        Self {
            periods: self.periods.saturating_sub(earlier.periods),
            throttled: self.throttled.saturating_sub(earlier.throttled),
            throttled_us: self.throttled_us.saturating_sub(earlier.throttled_us),
        }
    }

    /// The windows added up; `None` when there is none (no CPU limit).
    pub fn sum(windows: impl IntoIterator<Item = Self>) -> Option<Self> {
        windows.into_iter().reduce(|a, b| Self {
            periods: a.periods + b.periods,
            throttled: a.throttled + b.throttled,
            throttled_us: a.throttled_us + b.throttled_us,
        })
    }
}

/// The cgroup (v1 memory controller) figures of one directory.
#[derive(Clone, Copy, Debug, Default)]
pub struct CgroupMemory {
    pub usage: u64,
    pub inactive_file: u64,
    pub max_usage: u64,
}

impl CgroupMemory {
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let num = |f: &str| -> anyhow::Result<u64> {
            let p = dir.join(f);
            read_text(&p)?
                .trim()
                .parse::<u64>()
                .with_context(|| format!("{}: not a number", p.display()))
        };
        let stat_path = dir.join("memory.stat");
        let inactive_file = read_text(&stat_path)?
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file ")?.trim().parse().ok())
            .with_context(|| format!("{}: no total_inactive_file", stat_path.display()))?;
        Ok(Self {
            usage: num("memory.usage_in_bytes")?,
            inactive_file,
            max_usage: num("memory.max_usage_in_bytes")?,
        })
    }

    /// cAdvisor's working set: usage minus inactive file pages, never below zero.
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_is_read_from_cpu_stat() {
        let a =
            Throttling::parse("nr_periods 10\nnr_throttled 2\nthrottled_time 3000000\n").unwrap();
        assert_eq!(
            a,
            Throttling {
                periods: 10,
                throttled: 2,
                throttled_us: 3000
            }
        );
        let b = Throttling::parse(
            "nr_periods 40\nnr_throttled 2\nthrottled_time 3000000\nwait_sum 1\n",
        )
        .unwrap();
        assert_eq!(b.since(a).throttled, 0);
        assert_eq!(b.since(a).periods, 30);
        assert!(Throttling::parse("nr_periods x\n").is_none());
        assert_eq!(Throttling::sum([]), None);
        assert_eq!(Throttling::sum([a, b]).map(|t| t.periods), Some(50));
    }

    #[test]
    fn steal_is_the_share_of_every_state_but_guest() {
        let a = parse_cpu_ticks("cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!((a.total, a.steal), (1000, 35));
        let b = parse_cpu_ticks("cpu  150 0 60 870 10 0 5 105 9 0\n").unwrap();
        assert!((b.since(a) - 35.0).abs() < 1e-9, "{}", b.since(a));
        assert_eq!(a.since(a), 0.0);
        assert!(parse_cpu_ticks("intr 1 2\n").is_none());
        assert!(parse_cpu_ticks("cpu  1 2 x\n").is_none());
    }

    #[test]
    fn working_set_is_usage_minus_inactive_file() {
        const MIB: u64 = 1024 * 1024;
        let dir = std::env::temp_dir().join(format!("cp-bench-node-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), "10485760\n").unwrap();
        std::fs::write(dir.join("memory.max_usage_in_bytes"), "20971520\n").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "cache 4096\ninactive_file 1\ntotal_inactive_file 2097152\n",
        )
        .unwrap();
        let m = CgroupMemory::read(&dir).unwrap();
        assert_eq!(m.working_set(), 8 * MIB);
        assert_eq!(m.max_usage, 20 * MIB);
        std::fs::write(dir.join("memory.stat"), "cache 1\n").unwrap();
        assert!(CgroupMemory::read(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
