//! Finding, loading and initialising PJRT plugins (`cpu`, `cuda`, `tpu` or a path), once per
//! process per file.

use crate::api::{api_call, args, Api};
use crate::error::{Error, Result};
use crate::named_value::NamedValue;
use pjrt_sys as sys;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Where each well-known plugin lives inside a Python `site-packages` directory.
fn known_locations(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "cpu" => Some(&["xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"]),
        "cuda" => Some(&[
            "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        ]),
        "tpu" => Some(&["libtpu/libtpu.so"]),
        _ => None,
    }
}

fn install_hint(name: &str) -> &'static str {
    match name {
        "cpu" => {
            "Install it with `pip install xla-cpu-pjrt` (or run `make venv`), or set \
                  TORCH_PJRT_PLUGIN to the plugin's path"
        }
        "cuda" => {
            "Install it with `pip install jax-cuda13-pjrt` (or jax-cuda12-pjrt), or set \
                   TORCH_PJRT_PLUGIN to the plugin's path"
        }
        "tpu" => {
            "Install it with `pip install libtpu`, or set TORCH_PJRT_PLUGIN to the plugin's path"
        }
        _ => "Set TORCH_PJRT_PLUGIN to 'cpu', 'cuda', 'tpu' or an existing plugin path",
    }
}

/// Python `site-packages`/`dist-packages` directories worth searching, most specific first.
pub fn site_package_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let push_prefix = |dirs: &mut Vec<PathBuf>, prefix: &Path| {
        for lib in ["lib", "lib64", "local/lib"] {
            if let Ok(entries) = std::fs::read_dir(prefix.join(lib)) {
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                    .flat_map(|e| {
                        [
                            e.path().join("site-packages"),
                            e.path().join("dist-packages"),
                        ]
                    })
                    .collect();
                found.sort();
                dirs.extend(found);
            }
        }
    };
    if let Ok(paths) = std::env::var("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&paths));
    }
    // The embedding interpreter's path (the Python package sets it before starting the engine).
    if let Ok(paths) = std::env::var("TORCH_PJRT_SITE_PACKAGES") {
        dirs.extend(std::env::split_paths(&paths));
    }
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        push_prefix(&mut dirs, Path::new(&venv));
    }
    // A `.venv` in the current directory or one of its parents (a checkout of this project).
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            push_prefix(&mut dirs, &dir.join(".venv"));
        }
    }
    // The site-packages that held the header these bindings were built from.
    let header = Path::new(pjrt_sys::BUILD_HEADER_PATH);
    if let Some(site) = header.ancestors().nth(4) {
        dirs.push(site.to_path_buf());
    }
    if let Ok(home) = std::env::var("HOME") {
        push_prefix(&mut dirs, &Path::new(&home).join(".local"));
    }
    for prefix in ["/usr/local", "/usr", "/opt/conda"] {
        push_prefix(&mut dirs, Path::new(prefix));
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The plugin this process is configured for: `TORCH_PJRT_PLUGIN` (a name or a path), `cpu`
/// when unset.
pub fn configured_plugin_name() -> String {
    std::env::var("TORCH_PJRT_PLUGIN").unwrap_or_else(|_| "cpu".to_string())
}

/// Resolves a plugin name (`cpu`, `cuda`, `tpu`) or a path to an existing file.
pub fn resolve_plugin_path(name_or_path: &str) -> Result<PathBuf> {
    if let Some(relative) = known_locations(name_or_path) {
        let mut looked = Vec::new();
        for site in site_package_dirs() {
            for rel in relative {
                let candidate = site.join(rel);
                if candidate.is_file() {
                    return Ok(candidate);
                }
                looked.push(candidate.display().to_string());
            }
        }
        return Err(Error::PluginNotFound {
            requested: name_or_path.to_string(),
            looked: looked.join(", "),
            fix: install_hint(name_or_path).to_string(),
        });
    }
    let path = PathBuf::from(name_or_path);
    if path.is_file() {
        return Ok(path);
    }
    Err(Error::PluginNotFound {
        requested: name_or_path.to_string(),
        looked: path.display().to_string(),
        fix: install_hint(name_or_path).to_string(),
    })
}

struct PluginInner {
    path: PathBuf,
    api: Api,
    attributes: Vec<(String, NamedValue)>,
    // Kept so the library is never unloaded: PJRT objects and the function table point into it.
    _library: libloading::Library,
}

/// A loaded, initialised PJRT plugin. Cloning is cheap; every clone shares one library.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Plugin>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Plugin>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Plugin {
    /// Loads a plugin by name (`cpu`, `cuda`, `tpu`) or path. A file is loaded and
    /// `PJRT_Plugin_Initialize`d at most once per process; later calls return the same plugin.
    pub fn load(name_or_path: &str) -> Result<Plugin> {
        let path = resolve_plugin_path(name_or_path)?;
        let canonical = path.canonicalize().unwrap_or(path);
        let mut guard = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plugin) = guard.get(&canonical) {
            return Ok(plugin.clone());
        }
        let plugin = Plugin::load_uncached(&canonical)?;
        guard.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    fn load_uncached(path: &Path) -> Result<Plugin> {
        let shown = path.display().to_string();
        // SAFETY: loading a shared library runs its initialisers; that is what loading a plugin
        // means, and the caller asked for this file.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| Error::NotAPlugin {
            path: shown.clone(),
            reason: format!("it could not be loaded as a shared library ({e})"),
        })?;
        type GetApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api: libloading::Symbol<GetApi> =
            unsafe { library.get(b"GetPjrtApi\0") }.map_err(|_| Error::NotAPlugin {
                path: shown.clone(),
                reason: "it exports no GetPjrtApi symbol".to_string(),
            })?;
        // SAFETY: calling the plugin's entry point; it returns a pointer to its static table.
        let raw = unsafe { get_api() };
        if raw.is_null() {
            return Err(Error::NotAPlugin {
                path: shown,
                reason: "GetPjrtApi returned null".to_string(),
            });
        }
        // SAFETY: `raw` points into the plugin's static data; `_library` keeps it loaded.
        let label: &'static str = Box::leak(shown.clone().into_boxed_str());
        let api = unsafe { Api::from_raw(raw, label) };
        let (major, minor) = api.version();
        if major != sys::PJRT_API_MAJOR as i32 {
            return Err(Error::VersionSkew {
                path: shown,
                plugin_major: major,
                plugin_minor: minor,
                expected_major: sys::PJRT_API_MAJOR as i32,
                expected_minor: sys::PJRT_API_MINOR as i32,
            });
        }
        // The error functions are used to report every other failure: refuse a table without them.
        let error_functions_end = std::mem::offset_of!(sys::PJRT_Api, PJRT_Error_GetCode);
        // SAFETY: only read after the length check.
        let has_error_functions = api.covers(error_functions_end)
            && unsafe {
                (*raw).PJRT_Error_Destroy.is_some()
                    && (*raw).PJRT_Error_Message.is_some()
                    && (*raw).PJRT_Error_GetCode.is_some()
            };
        if !has_error_functions {
            return Err(Error::NotAPlugin {
                path: shown,
                reason: "its PJRT_Api table lacks the error functions".to_string(),
            });
        }
        let mut init = args!(PJRT_Plugin_Initialize_Args {});
        api_call!(&api, PJRT_Plugin_Initialize, &mut init)?;
        let attributes = read_attributes(&api).unwrap_or_default();
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                path: path.to_path_buf(),
                api,
                attributes,
                _library: library,
            }),
        })
    }

    pub(crate) fn api(&self) -> &Api {
        &self.inner.api
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The PJRT C API version the plugin implements, as (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        self.inner.api.version()
    }

    /// The plugin's attributes (e.g. `xla_version`, `stablehlo_current_version`).
    pub fn attributes(&self) -> &[(String, NamedValue)] {
        &self.inner.attributes
    }

    /// A string that changes whenever the plugin build changes: the file's size and modification
    /// time, the API version and the plugin's attributes. Used in cache keys.
    pub fn version_fingerprint(&self) -> String {
        let meta = std::fs::metadata(&self.inner.path).ok();
        let size = meta.as_ref().map(|m| m.len()).unwrap_or(0);
        let mtime = meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let (major, minor) = self.api_version();
        let attributes: Vec<String> = self
            .inner
            .attributes
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        format!(
            "api={major}.{minor};size={size};mtime={mtime};{}",
            attributes.join(";")
        )
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.api_version();
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &format_args!("{major}.{minor}"))
            .finish()
    }
}

fn read_attributes(api: &Api) -> Result<Vec<(String, NamedValue)>> {
    let mut args = args!(PJRT_Plugin_Attributes_Args {});
    api_call!(api, PJRT_Plugin_Attributes, &mut args)?;
    let mut out = Vec::with_capacity(args.num_attributes);
    for i in 0..args.num_attributes {
        // SAFETY: the plugin returned `num_attributes` values that live as long as the plugin.
        let raw = unsafe { &*args.attributes.add(i) };
        // SAFETY: as above.
        out.push(unsafe { NamedValue::from_raw(raw) });
    }
    Ok(out)
}
