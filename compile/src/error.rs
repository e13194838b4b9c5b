//! The errors of compiling (`CompileError`) and of running queued work (`ExecError`). Both are
//! cheap to clone: one failure is handed to every waiter and every dependent job.

use crate::key::CacheKey;
use std::sync::Arc;

/// Why an executable could not be obtained. A failure is never cached: a later request for the
/// same key tries again.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CompileError {
    /// The caller's closure could not produce the module text.
    #[error("building the StableHLO module for key {key} failed: {message}")]
    Build { key: CacheKey, message: String },
    /// The plugin rejected the module; `message` carries its diagnostic.
    #[error("compiling the module for key {key} failed: {message}")]
    Compile { key: CacheKey, message: String },
    /// The module builder or the compiler panicked; the pool thread survived.
    #[error("compiling the module for key {key} panicked: {message}")]
    Panicked { key: CacheKey, message: String },
    /// A configuration value is unusable (a bad variable, a cache directory that cannot be made).
    #[error("{0}")]
    Config(String),
    /// The engine declined to compile (a recompile past the user's limit); `message` says why.
    #[error("{message}")]
    Refused { key: CacheKey, message: String },
    /// The compiler was dropped before the request could be served.
    #[error("the compiler shut down before key {key} was compiled")]
    ShutDown { key: CacheKey },
}

impl CompileError {
    /// The key the failure belongs to, where there is one.
    pub fn key(&self) -> Option<CacheKey> {
        match self {
            CompileError::Build { key, .. }
            | CompileError::Compile { key, .. }
            | CompileError::Panicked { key, .. }
            | CompileError::Refused { key, .. }
            | CompileError::ShutDown { key } => Some(*key),
            CompileError::Config(_) => None,
        }
    }
}

/// Why a queued job produced no values. Every variant names the job by its label.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ExecError {
    /// The job's executable could not be compiled.
    #[error("{label}: {source}")]
    Compile {
        label: Arc<str>,
        source: CompileError,
    },
    /// An argument came from a job that failed; `cause` is that first failure (never itself an
    /// `Argument` error, so a long chain of dependents does not nest messages).
    #[error("{label}: argument {index} is unavailable because an earlier job failed: {cause}")]
    Argument {
        label: Arc<str>,
        index: usize,
        cause: Arc<ExecError>,
    },
    /// PJRT refused to run the executable.
    #[error("{label}: execution failed: {message}")]
    Execute { label: Arc<str>, message: String },
    /// The executable's result count differs from the job's output slots.
    #[error(
        "{label}: the executable returned {got} results but the job has {expected} output slots"
    )]
    OutputCount {
        label: Arc<str>,
        expected: usize,
        got: usize,
    },
    /// A queued closure failed or panicked.
    #[error("{label}: {message}")]
    Task { label: Arc<str>, message: String },
    /// The device reported an error while computing a value.
    #[error("{}computing a device value failed: {message}", label.as_deref().map(|l| format!("{l}: ")).unwrap_or_default())]
    Device {
        /// The job that produced the value, when known.
        label: Option<Arc<str>>,
        message: String,
    },
    /// The queue shut down before the job ran.
    #[error("{label}: the execution queue shut down before the job ran")]
    ShutDown { label: Arc<str> },
}

impl ExecError {
    /// The label of the job that reported this error (none for device errors).
    pub fn label(&self) -> Option<&str> {
        match self {
            ExecError::Compile { label, .. }
            | ExecError::Argument { label, .. }
            | ExecError::Execute { label, .. }
            | ExecError::OutputCount { label, .. }
            | ExecError::Task { label, .. }
            | ExecError::ShutDown { label } => Some(label),
            ExecError::Device { label, .. } => label.as_deref(),
        }
    }

    /// The first failure in a chain of dependent jobs.
    pub fn root_cause(&self) -> &ExecError {
        match self {
            ExecError::Argument { cause, .. } => cause,
            other => other,
        }
    }
}

/// The text of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}
