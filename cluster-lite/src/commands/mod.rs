//! One module per subcommand: argument definitions and the glue that runs it.

pub mod simulate;
