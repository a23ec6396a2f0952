//! The `cistern bench` subcommands: each prints one JSON object per result line.
