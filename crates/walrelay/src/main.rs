//! The `walrelay` binary: parse the command line, set up logging, run the
//! command. Errors reach the user through anyhow with their full chain.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tracing::Instrument;
use tracing_subscriber::EnvFilter;
use walrelay::commands::cli::{self, Cli, Command, LogFormat};
use walrelay::http::HttpServer;
use walrelay::metrics::Metrics;

mod allocator;
mod trace_file;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that exit 0.
            let code = if e.use_stderr() {
                cli::usage_exit_code(std::env::args_os())
            } else {
                0
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
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
    if let Command::Verify(args) = &cli.command {
        // Reads Kafka only: needs neither PostgreSQL nor a complete relay
        // configuration, and has its own exit codes (docs/verify.md).
        let code = match cli.options.kafka_config() {
            Ok(kafka) => walrelay::commands::verify::main(kafka, args).await,
            Err(e) => {
                eprintln!("walrelay verify: {e:#}");
                walrelay::commands::verify::exit::ERROR
            }
        };
        std::process::exit(code);
    }
    let config = cli.options.effective_config()?;
    match cli.command {
        Command::Config => print!("{}", walrelay::config::render(&config)),
        Command::Setup(args) => {
            let options = walrelay::commands::setup::SetupOptions {
                accept_slot_loss: args.accept_slot_loss,
            };
            for step in walrelay::commands::setup::setup_with(&config, options).await? {
                println!("{step}");
            }
        }
        Command::Run => {
            let stop_rx = walrelay::shutdown::stop_on_signal();
            // Metrics and health checks run beside the relay, on their own
            // tasks, and stop after it (so /metrics serves the drain too).
            let metrics = cli.options.metrics_addr.map(|_| Metrics::new());
            let server = match (cli.options.metrics_addr, &metrics) {
                (Some(addr), Some(m)) => Some(
                    HttpServer::start(addr, m.clone(), Some(&config.kafka))
                        .await
                        .with_context(|| format!("cannot serve metrics on {addr}"))?,
                ),
                _ => None,
            };
            // Every log line of the relay names its slot, also those
            // outside a session (restarts, the final error).
            let span = tracing::info_span!("relay", slot = %config.postgres.slot);
            let (trace, trace_writer) = match &cli.options.trace_file {
                Some(path) => {
                    let (tx, writer) = trace_file::spawn(path)?;
                    (Some(tx), Some(writer))
                }
                None => (None, None),
            };
            let result = walrelay::engine::pipeline::run_with(config, stop_rx, trace, metrics)
                .instrument(span)
                .await;
            if let Some(w) = trace_writer {
                // The relay dropped its sender: the writer drains and ends.
                let _ = w.join();
            }
            if let Some(s) = server {
                s.shutdown().await;
            }
            result?;
        }
        Command::Verify(_) => unreachable!("handled before the configuration is loaded"),
        Command::Status(args) => {
            let mut status = match walrelay::commands::status::status(&config, args.limits()).await
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("walrelay status: {e}");
                    std::process::exit(1);
                }
            };
            if args.kafka || !args.topics.is_empty() {
                status.kafka = Some(
                    walrelay::commands::status::kafka::report(
                        &config,
                        &args.topics,
                        &status.source_id,
                        status
                            .confirmed_flush_lsn
                            .as_deref()
                            .and_then(|lsn| lsn.parse().ok()),
                    )
                    .await,
                );
                status.source_record = Some(
                    walrelay::source::source_record::status::read_status(
                        &config,
                        &status.source_id,
                    )
                    .await,
                );
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", walrelay::commands::status::render(&status));
            }
            std::process::exit(status.health.exit_code());
        }
    }
    Ok(())
}
