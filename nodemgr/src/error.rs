//! The errors the node manager's library hands its callers (the `dilu`
//! command line, its tests), by what the user does about them. Inside the
//! crate, helpers build a message; a function callers use says which kind
//! it is.

use std::fmt;

/// A failure, with the message the user sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A flag, configuration file, spec or request is not valid: the
    /// input needs fixing.
    Invalid(String),
    /// The node manager refused the request (admission, permission, a
    /// per-user limit): the request or the node needs changing.
    Refused(String),
    /// The node manager could not be reached, or its answer made no sense.
    NodeManager(String),
    /// Something on this machine is missing or failed: a file dilu needs,
    /// a library, a system call, a program that would not start.
    System(String),
}

impl Error {
    /// The message, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Error::Invalid(m) | Error::Refused(m) | Error::NodeManager(m) | Error::System(m) => m,
        }
    }

    /// The same kind of error with `context` before its message
    /// (`context: message`).
    pub fn context(self, context: impl fmt::Display) -> Error {
        let with = |m: String| format!("{context}: {m}");
        match self {
            Error::Invalid(m) => Error::Invalid(with(m)),
            Error::Refused(m) => Error::Refused(with(m)),
            Error::NodeManager(m) => Error::NodeManager(with(m)),
            Error::System(m) => Error::System(with(m)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

/// The crate's `Result`.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_kind_and_reads_as_one_message() {
        let e = Error::Refused("no room on gpu0".into()).context("tenant serve");
        assert_eq!(e, Error::Refused("tenant serve: no room on gpu0".into()));
        assert_eq!(e.to_string(), "tenant serve: no room on gpu0");
    }
}
