//! The error type of the safe PJRT layer: PJRT's own status codes plus loading and argument errors.

use std::fmt;

/// PJRT's status codes (the same numbering as absl::StatusCode).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl ErrorCode {
    pub(crate) fn from_raw(code: u32) -> ErrorCode {
        match code {
            1 => ErrorCode::Cancelled,
            3 => ErrorCode::InvalidArgument,
            4 => ErrorCode::DeadlineExceeded,
            5 => ErrorCode::NotFound,
            6 => ErrorCode::AlreadyExists,
            7 => ErrorCode::PermissionDenied,
            8 => ErrorCode::ResourceExhausted,
            9 => ErrorCode::FailedPrecondition,
            10 => ErrorCode::Aborted,
            11 => ErrorCode::OutOfRange,
            12 => ErrorCode::Unimplemented,
            13 => ErrorCode::Internal,
            14 => ErrorCode::Unavailable,
            15 => ErrorCode::DataLoss,
            16 => ErrorCode::Unauthenticated,
            _ => ErrorCode::Unknown,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Everything the safe layer can fail with. Each message says what was expected, what was got
/// and, where there is one, what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A PJRT function returned an error; the `PJRT_Error` has already been destroyed.
    #[error("{function} failed ({code}): {message}")]
    Pjrt {
        function: &'static str,
        code: ErrorCode,
        message: String,
    },
    /// The plugin's function table is too short for (or has a null entry for) this function.
    #[error(
        "{function} is unimplemented by this plugin ({plugin}, PJRT API {major}.{minor}); \
         upgrade the plugin or avoid the feature that needs it"
    )]
    Unimplemented {
        function: &'static str,
        plugin: String,
        major: i32,
        minor: i32,
    },
    /// No plugin file was found for a name or path.
    #[error("PJRT plugin '{requested}' not found; looked in: {looked}. {fix}")]
    PluginNotFound {
        requested: String,
        looked: String,
        fix: String,
    },
    /// The file exists but is not a loadable PJRT plugin.
    #[error(
        "'{path}' is not a PJRT plugin: {reason}. Point TORCH_PJRT_PLUGIN at a PJRT plugin \
             (a shared library exporting GetPjrtApi), or use 'cpu', 'cuda' or 'tpu'"
    )]
    NotAPlugin { path: String, reason: String },
    /// The plugin speaks another major version of the PJRT C API.
    #[error(
        "PJRT plugin '{path}' implements PJRT C API {plugin_major}.{plugin_minor}, but this build \
         expects major version {expected_major} (built against {expected_major}.{expected_minor}); \
         install a plugin of the matching major version"
    )]
    VersionSkew {
        path: String,
        plugin_major: i32,
        plugin_minor: i32,
        expected_major: i32,
        expected_minor: i32,
    },
    /// A caller-side argument was wrong; PJRT was not called.
    #[error("{0}")]
    InvalidArgument(String),
}

impl Error {
    /// The PJRT status code, where the error came from PJRT.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } => Some(*code),
            Error::Unimplemented { .. } => Some(ErrorCode::Unimplemented),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
