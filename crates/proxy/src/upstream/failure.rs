//! Why a backend gave no answer, in the kinds `switchyard_upstream_errors_total` counts
//! and the statuses the client gets (`upstream::forward` maps them: 504 when too late,
//! 502 otherwise).

use std::io::ErrorKind;

/// Why no connection to a backend could be had.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    TimedOut,
    Refused(std::io::Error),
    Other(String),
}

impl ConnectFailure {
    /// The kind, as in `switchyard_upstream_errors_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::TimedOut => "connect_timeout",
            Self::Refused(_) => "connect_refused",
            Self::Other(_) => "connect_error",
        }
    }

    pub(crate) fn detail(&self) -> String {
        match self {
            Self::TimedOut => "connect timed out".to_string(),
            Self::Refused(e) => e.to_string(),
            Self::Other(e) => e.clone(),
        }
    }
}

/// Why a backend gave no usable answer.
#[derive(Debug)]
pub(crate) enum BackendFailure {
    /// The backend closed the connection before the answer was whole: a kept connection
    /// it had closed meanwhile (then safe to retry where the request is), or a crash.
    Closed,
    Io(std::io::Error),
    /// The answer was not HTTP/1.1 as the router reads it.
    Protocol(&'static str),
    /// The client's body failed on its way (the request's failure cell says how).
    ClientBody(String),
}

impl BackendFailure {
    /// The kind, as in `switchyard_upstream_errors_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Io(_) | Self::ClientBody(_) => "io",
            Self::Protocol(_) => "protocol",
        }
    }

    pub(crate) fn from_io(error: std::io::Error) -> Self {
        match error.kind() {
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof => {
                Self::Closed
            }
            _ => Self::Io(error),
        }
    }
}

impl std::fmt::Display for BackendFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => write!(f, "the backend closed the connection"),
            Self::Io(e) => write!(f, "{e}"),
            Self::Protocol(why) => write!(f, "{why}"),
            Self::ClientBody(e) => write!(f, "the client's body: {e}"),
        }
    }
}

impl std::error::Error for BackendFailure {}
