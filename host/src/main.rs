//! The `onceflow` binary: parse, run, print the error and its causes.
//!
//! The command line lives here (`cli/`), not in the library, so nothing in
//! the library can depend on it.

use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::{Cli, Exit, run};

/// mimalloc instead of glibc's malloc: the worker allocates per record (a
/// batch's records, outputs, changelog entries) and glibc's malloc and free
/// were ~14% of its samples under load (docs/changelog.md, 2026-12-04).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            let code = err.downcast_ref::<Exit>().map_or(1, |e| e.code);
            ExitCode::from(code)
        }
    }
}
