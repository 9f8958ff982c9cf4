//! The agent's log: `tracing` events, one line each on stderr where the container
//! runtime collects it (`kubectl logs`), as text (time, level, message) or JSON lines.
//! kube-rs logs through `tracing` too, so its watch and connection errors land in the
//! same stream. `RUST_LOG` filters; without it the agent logs at info (debug with
//! `--verbose`) and its libraries only warnings.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The filter when `RUST_LOG` is not set.
fn default_filter(verbose: bool) -> &'static str {
    if verbose {
        "warn,cni_node=debug"
    } else {
        "warn,cni_node=info"
    }
}

/// Installs the global subscriber; a second call (tests) leaves the first in place.
pub fn init(format: LogFormat, verbose: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default_filter(verbose)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// A JSON value for a log line or an error message, cut short at 80 bytes: API data can
/// be anything.
pub(crate) fn short(value: &serde_json::Value) -> String {
    let mut text = value.to_string();
    if text.len() > 80 {
        let cut = (0..=80)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_filters_parse() {
        for verbose in [false, true] {
            let filter = EnvFilter::try_new(default_filter(verbose));
            assert!(filter.is_ok(), "{:?}", filter.err());
        }
    }
}
