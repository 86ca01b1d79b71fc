//! The `onceflow` binary: parse, run, print the error chain once.

use std::process::ExitCode;

use clap::Parser;
use onceflow::cli::{Cli, Exit, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            // Print each cause once: many messages already quote their source.
            let mut shown = err.to_string();
            for cause in err.chain().skip(1) {
                let text = cause.to_string();
                if !shown.contains(&text) {
                    eprintln!("  caused by: {text}");
                    shown = text;
                }
            }
            let code = err.downcast_ref::<Exit>().map_or(1, |e| e.code);
            ExitCode::from(code)
        }
    }
}
