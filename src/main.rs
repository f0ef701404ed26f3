//! The binary: parse flags, set up logging, run the library.

use clap::Parser;
use device_numa_extender::cli::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

fn init_tracing(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    }
    Ok(())
}
