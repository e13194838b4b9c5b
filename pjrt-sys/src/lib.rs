//! Raw bindings to the PJRT C API, generated at build time by bindgen from `pjrt_c_api.h`.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The `pjrt_c_api.h` these bindings were generated from (a hint for finding the plugin that
/// shipped beside it).
pub const BUILD_HEADER_PATH: &str = env!("PJRT_SYS_HEADER_PATH");
