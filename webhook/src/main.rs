//! `cp-webhook`: the admission webhook process. Parses its flags ([`cp_webhook::cli`]), installs the
//! cryptography provider and hands over to [`cp_webhook::runtime`].
#![forbid(unsafe_code)]

use clap::Parser;
use cp_webhook::cli::Args;

/// mimalloc, not glibc's malloc: `cp_webhook::memory` says why.
#[global_allocator]
static ALLOCATOR: cp_webhook::memory::Allocator = cp_webhook::memory::ALLOCATOR;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cp_api::cli::exit_code("cp-webhook", run().await)
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .json()
        .init();
    if let Err(e) = cp_webhook::memory::no_huge_pages() {
        tracing::warn!(error = %e, "transparent huge pages stay on (more memory, nothing else)");
    }
    let args = Args::parse();
    // After the flags (`--version` and `--help` print only what they print), before any TLS: this
    // build's provider becomes the process default; the FIPS build exits here unless the AWS-LC module
    // reports FIPS mode (docs/fips.md).
    let fips = cp_certs::crypto::install()?;
    tracing::info!(
        fips,
        crypto = cp_certs::crypto::backend_name(),
        "cryptography provider installed"
    );
    cp_webhook::runtime::run(args).await
}
