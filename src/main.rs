//! The binary: parse flags, set up logging, run the library.

use std::io::IsTerminal;

use clap::Parser;
use device_numa_extender::cli::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

/// mimalloc rather than glibc malloc: a 5,000-node filter allocates a few buffers of 100 KiB
/// and more per request, and glibc spent ~20 % of such a request consolidating free chunks and
/// re-faulting pages it had returned (BENCHMARKS.md, issue 8). The benches that measure the
/// service set the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    // Colour only on a terminal: a log file or `kubectl logs` must not get escape sequences.
    let ansi = device_numa_extender::ops::inspect::use_color(std::io::stderr().is_terminal());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_tracing(args.log_format, &args.log_level)?;
            device_numa_extender::app::serve(*args).await?;
        }
        // The tools print their result on stdout; only warnings go to stderr.
        // kube's client logs connection errors that the tools report themselves.
        Command::Inspect(args) => {
            init_tracing(LogFormat::Text, "warn,kube_client=off")?;
            device_numa_extender::ops::inspect::run(args).await?;
        }
        Command::Simulate(args) => {
            init_tracing(LogFormat::Text, "warn,kube_client=off")?;
            device_numa_extender::ops::simulate::run(args).await?;
        }
    }
    Ok(())
}
