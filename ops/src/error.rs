//! Errors raised by meta and lowering, shaped like PyTorch's exceptions.

use std::fmt;

/// Which Python exception class an error maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    Runtime,
    Value,
    Type,
    NotImplemented,
    Index,
}

impl ErrorKind {
    pub fn python_name(self) -> &'static str {
        match self {
            ErrorKind::Runtime => "RuntimeError",
            ErrorKind::Value => "ValueError",
            ErrorKind::Type => "TypeError",
            ErrorKind::NotImplemented => "NotImplementedError",
            ErrorKind::Index => "IndexError",
        }
    }
}

/// An op rejected its arguments; `message` reads like PyTorch's own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct OpError {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl OpError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        OpError {
            kind,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        OpError::new(ErrorKind::Runtime, message)
    }
    pub fn value(message: impl Into<String>) -> Self {
        OpError::new(ErrorKind::Value, message)
    }
    pub fn type_error(message: impl Into<String>) -> Self {
        OpError::new(ErrorKind::Type, message)
    }
    pub fn not_implemented(message: impl Into<String>) -> Self {
        OpError::new(ErrorKind::NotImplemented, message)
    }
    pub fn index(message: impl Into<String>) -> Self {
        OpError::new(ErrorKind::Index, message)
    }
}

/// Return early with a RuntimeError unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::OpError::runtime(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;
