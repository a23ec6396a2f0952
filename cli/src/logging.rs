//! Logging: `tracing` events to stderr, quiet by default (warnings and
//! errors); `-v` for info, `-vv` for debug, `-vvv` for trace; `RUST_LOG`
//! (an `EnvFilter` directive) overrides both.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber once, at start-up.
pub(crate) fn init(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // A second subscriber (tests calling twice) is refused; the first stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
