//! Progress on the terminal for steps that may take long (a compile, a
//! host's answer): a spinner with the elapsed time on stderr while the step
//! runs. When stderr is not a terminal (a script, CI), one line says what is
//! happening instead, so a log still shows where the time went.

use std::io::IsTerminal as _;
use std::time::Duration;

/// Runs `step`, showing `message` while it runs (nothing when `quiet`: the
/// command prints JSON).
pub(super) fn during<T>(quiet: bool, message: String, step: impl FnOnce() -> T) -> T {
    if quiet {
        return step();
    }
    if !std::io::stderr().is_terminal() {
        eprintln!("{message} ...");
        return step();
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.set_message(message);
    spinner.enable_steady_tick(Duration::from_millis(120));
    let out = step();
    spinner.finish_and_clear();
    out
}
