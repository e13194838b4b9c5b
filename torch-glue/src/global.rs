//! The one engine of the process, started lazily at first device use.

use crate::engine::{Engine, EngineConfig};
use defer::EngineError;
use std::sync::{Mutex, OnceLock};

static ENGINE: OnceLock<Engine> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Starts the engine with `plugin` (or the environment's) if it is not running. A failed start
/// leaves nothing behind, so a corrected configuration can be retried.
pub fn init(plugin: Option<&str>) -> Result<&'static Engine, EngineError> {
    if let Some(engine) = ENGINE.get() {
        return Ok(engine);
    }
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(engine) = ENGINE.get() {
        return Ok(engine);
    }
    let mut config = EngineConfig::from_env()?;
    if let Some(plugin) = plugin {
        config.plugin = plugin.to_string();
    }
    let warm_up = config.warm_up;
    let engine = Engine::new(config)?;
    let engine = ENGINE.get_or_init(|| engine);
    if warm_up {
        engine.start_warm_up();
    }
    Ok(engine)
}

/// The engine if it has started (never starts one).
pub fn running() -> Option<&'static Engine> {
    ENGINE.get()
}

/// The running engine, starting it from the environment on first use.
pub fn engine() -> Result<&'static Engine, EngineError> {
    match ENGINE.get() {
        Some(engine) => Ok(engine),
        None => init(None),
    }
}
