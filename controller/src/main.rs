//! `cp-controller`: the controller process. Parses its flags and hands over to
//! [`cp_controller::runtime`]; `migrate-plan` and `--check-dns` are one-shot diagnostics.
#![forbid(unsafe_code)]

use clap::Parser;
use cp_controller::cli::{Args, Command};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cp_api::cli::exit_code("cp-controller", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before any TLS: this build's provider becomes the process default; the FIPS build exits here
    // unless the AWS-LC module reports FIPS mode (docs/fips.md).
    let fips = cp_certs::crypto::install()?;
    cp_api::defaults::configure(args.proxy_image.as_deref(), args.utility_image.as_deref())?;
    if let Some(Command::MigratePlan {
        namespace,
        name,
        output,
    }) = &args.command
    {
        return cp_controller::runtime::migrate_plan(namespace, name, output).await;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .json()
        .init();
    if let Some(host) = &args.check_dns {
        let resolver = cp_controller::connectivity_ca::Resolver::from_system()?;
        for a in resolver.lookup(host).await? {
            println!("{a}");
        }
        return Ok(());
    }
    tracing::info!(
        fips,
        crypto = cp_certs::crypto::backend_name(),
        "cryptography provider installed"
    );
    cp_controller::runtime::run(args).await
}
