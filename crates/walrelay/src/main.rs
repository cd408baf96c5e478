//! The `walrelay` binary: parse the command line, set up logging, run the
//! command. Errors reach the user through anyhow with their full chain.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;
use walrelay::cli::{self, Cli, Command, LogFormat};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_new(&cli.options.log).context("invalid --log filter")?;
    // Logs go to stderr: stdout carries command output (`setup`'s report,
    // `config`'s TOML).
    let ansi = std::io::stderr().is_terminal();
    match cli.options.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    let config = cli.options.effective_config()?;
    match cli.command {
        Command::Config => print!("{}", cli::render(&config)),
        Command::Setup => {
            for step in walrelay::setup::setup(&config).await? {
                println!("{step}");
            }
        }
        Command::Run => {
            let (stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(async move {
                wait_for_signal().await;
                tracing::info!("stop requested: draining");
                let _ = stop_tx.send(true);
            });
            walrelay::pipeline::run(config, stop_rx, None).await?;
        }
    }
    Ok(())
}

/// SIGTERM (service managers, `kill`) or SIGINT (Ctrl-C).
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
