//! The eager mode: Strict, Debug or DeferAndFuse, as a process-wide stack (autograd runs backward
//! on its own threads, so a thread-local mode would leave backward ops in the default mode).

use std::sync::Mutex;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One op at a time, executed asynchronously with the host.
    Strict,
    /// One op at a time, waiting for each: errors surface at the op that caused them.
    Debug,
    /// Ops are deferred and fused into one module per region at materialization points.
    DeferAndFuse,
}

impl Mode {
    pub const NAMES: [&'static str; 3] = ["strict", "debug", "defer_and_fuse"];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::Debug => "debug",
            Mode::DeferAndFuse => "defer_and_fuse",
        }
    }

    pub fn from_name(name: &str) -> Result<Mode, String> {
        match name {
            "strict" => Ok(Mode::Strict),
            "debug" => Ok(Mode::Debug),
            "defer_and_fuse" => Ok(Mode::DeferAndFuse),
            other => Err(format!(
                "unknown eager mode '{other}': expected one of 'strict', 'debug', 'defer_and_fuse'"
            )),
        }
    }

    pub fn code(self) -> i32 {
        match self {
            Mode::Strict => 0,
            Mode::Debug => 1,
            Mode::DeferAndFuse => 2,
        }
    }

    pub fn from_code(code: i32) -> Option<Mode> {
        [Mode::Strict, Mode::Debug, Mode::DeferAndFuse]
            .into_iter()
            .find(|m| m.code() == code)
    }

    /// Whether ops run one at a time (a flush after every op).
    pub fn is_op_by_op(self) -> bool {
        !matches!(self, Mode::DeferAndFuse)
    }

    /// The default mode from `TORCH_PJRT_DEFER_AND_FUSE` / `TORCH_PJRT_LAUNCH_BLOCKING`; both set
    /// is an error naming both.
    pub fn from_env_values(defer: Option<&str>, blocking: Option<&str>) -> Result<Mode, String> {
        let on = |v: Option<&str>| matches!(v, Some(s) if !s.is_empty() && s != "0");
        match (on(defer), on(blocking)) {
            (true, true) => Err(format!(
                "TORCH_PJRT_DEFER_AND_FUSE={} and TORCH_PJRT_LAUNCH_BLOCKING={} are both set, but \
                 they select different eager modes (defer_and_fuse and debug); unset one of them",
                defer.unwrap_or_default(),
                blocking.unwrap_or_default()
            )),
            (true, false) => Ok(Mode::DeferAndFuse),
            (false, true) => Ok(Mode::Debug),
            (false, false) => Ok(Mode::Strict),
        }
    }
}

/// The process-wide stack of modes; the bottom is the default from the environment.
#[derive(Debug)]
pub struct ModeStack {
    stack: Mutex<Vec<Mode>>,
}

impl ModeStack {
    pub fn new(default: Mode) -> Self {
        ModeStack {
            stack: Mutex::new(vec![default]),
        }
    }

    pub fn current(&self) -> Mode {
        *self
            .lock()
            .last()
            .expect("the mode stack always has its default")
    }

    pub fn push(&self, mode: Mode) {
        self.lock().push(mode);
    }

    /// Pops the innermost mode; the default at the bottom is never popped.
    pub fn pop(&self) -> Result<Mode, String> {
        let mut stack = self.lock();
        if stack.len() <= 1 {
            return Err("eager mode stack underflow: pop without a matching push".to_string());
        }
        Ok(stack.pop().unwrap())
    }

    /// Replaces the innermost mode (`set_eager_mode`).
    pub fn set(&self, mode: Mode) {
        *self.lock().last_mut().unwrap() = mode;
    }

    pub fn depth(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Mode>> {
        self.stack.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_nests_and_never_loses_its_default() {
        let s = ModeStack::new(Mode::Strict);
        s.push(Mode::DeferAndFuse);
        s.push(Mode::Debug);
        assert_eq!(s.current(), Mode::Debug);
        assert_eq!(s.pop().unwrap(), Mode::Debug);
        assert_eq!(s.current(), Mode::DeferAndFuse);
        s.pop().unwrap();
        assert!(s.pop().is_err());
        assert_eq!(s.current(), Mode::Strict);
    }

    #[test]
    fn env_values_choose_the_default() {
        assert_eq!(Mode::from_env_values(None, None).unwrap(), Mode::Strict);
        assert_eq!(
            Mode::from_env_values(Some("1"), None).unwrap(),
            Mode::DeferAndFuse
        );
        assert_eq!(
            Mode::from_env_values(Some("0"), Some("1")).unwrap(),
            Mode::Debug
        );
        let err = Mode::from_env_values(Some("1"), Some("1")).unwrap_err();
        assert!(
            err.contains("TORCH_PJRT_DEFER_AND_FUSE") && err.contains("TORCH_PJRT_LAUNCH_BLOCKING")
        );
        assert!(Mode::from_name("lazy")
            .unwrap_err()
            .contains("defer_and_fuse"));
    }
}
