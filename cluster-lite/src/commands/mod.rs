//! One module per subcommand group: argument definitions and the glue that
//! runs them.

pub mod autoscaler;
pub mod extender;
pub mod simulate;
