//! How the webhook's process holds memory. Measured after bursts of hundreds of TLS connections at
//! once (what the API server opens while it retries against a throttled Pod; the bench's open-loop
//! runs under the CPU limit do the same), then light traffic:
//!
//! - glibc's malloc, even with one arena and a fixed trim threshold, kept the freed memory of a burst
//!   and the process stayed near its peak (10 MiB and more). heaptrack showed 0.2 MiB live at that
//!   point: a few long-lived allocations pin the top of the heap, so nothing is trimmed.
//! - mimalloc reuses freed pages and purges them: about 2 MiB after the same bursts. The Deployment
//!   sets `MIMALLOC_PURGE_DELAY=0`, so pages go back when freed rather than at the next allocation a
//!   second later (the process may be idle by then).
//! - Transparent huge pages are off: mimalloc asks for them on its 2 MiB-aligned regions (the
//!   `no_thp` build feature stops that), and a node with THP `always` gives them anyway unless the
//!   process opts out ([`no_huge_pages`]). One huge page per region was 6 MiB more at idle than the
//!   whole process needs.
//!
//! Every binary that serves admission declares the allocator (`#[global_allocator]` belongs in the
//! binary): cp-webhook, and the bench's floor server so that the two compare on the same allocator.
//! BENCHMARKS.md has the figures ("Memory", and the memory goal after the admission runs).

/// The allocator of the binaries that serve admission.
pub type Allocator = mimalloc::MiMalloc;

/// Its value, for `#[global_allocator] static A: Allocator = ALLOCATOR;`.
pub const ALLOCATOR: Allocator = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`), early in `main`. The
/// kernel checks the flag at each page fault: pages touched before the call keep what they got (with
/// the `no_thp` build, nothing asked for huge pages by then; only a node with THP `always` gives a few).
/// Failing (a kernel without the call) costs memory, nothing else.
pub fn no_huge_pages() -> Result<(), HugePagesStayOn> {
    nix::sys::prctl::set_thp_disable(true).map_err(HugePagesStayOn)
}

/// The kernel refused `PR_SET_THP_DISABLE`.
#[derive(Debug, thiserror::Error)]
#[error("PR_SET_THP_DISABLE: {0}")]
pub struct HugePagesStayOn(#[source] pub nix::Error);

#[cfg(test)]
mod tests {
    #[test]
    fn huge_pages_go_off_for_the_process() {
        super::no_huge_pages().expect("prctl");
        assert!(nix::sys::prctl::get_thp_disable().expect("prctl"));
    }
}
