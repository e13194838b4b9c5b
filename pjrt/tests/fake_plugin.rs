//! Version skew and short function tables, checked against tiny fake plugins compiled from C at
//! test time against the same `pjrt_c_api.h`.

use pjrt::{Client, Error, Plugin};
use std::path::PathBuf;
use std::process::Command;

/// A plugin whose table ends right after `PJRT_Plugin_Attributes` (an "old" plugin), reporting
/// the given API version.
fn build_fake_plugin(name: &str, major: i32, minor: i32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pjrt-fake-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("fake.c");
    std::fs::write(
        &source,
        format!(
            r#"
#include <string.h>
#include "pjrt_c_api.h"
static void error_destroy(PJRT_Error_Destroy_Args* args) {{ (void)args; }}
static void error_message(PJRT_Error_Message_Args* args) {{ args->message = "fake"; args->message_size = 4; }}
static PJRT_Error* error_get_code(PJRT_Error_GetCode_Args* args) {{ args->code = PJRT_Error_Code_UNKNOWN; return 0; }}
static PJRT_Error* plugin_initialize(PJRT_Plugin_Initialize_Args* args) {{ (void)args; return 0; }}
static PJRT_Api api;
const PJRT_Api* GetPjrtApi(void) {{
  memset(&api, 0, sizeof(api));
  api.struct_size = offsetof(PJRT_Api, PJRT_Plugin_Attributes);
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = {major};
  api.pjrt_api_version.minor_version = {minor};
  api.PJRT_Error_Destroy = error_destroy;
  api.PJRT_Error_Message = error_message;
  api.PJRT_Error_GetCode = error_get_code;
  api.PJRT_Plugin_Initialize = plugin_initialize;
  return &api;
}}
"#
        ),
    )
    .unwrap();
    let include = PathBuf::from(pjrt_sys::BUILD_HEADER_PATH);
    let library = dir.join(format!("{name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-I")
        .arg(include.parent().unwrap())
        .status()
        .expect("a C compiler (cc) is needed for the fake-plugin tests");
    assert!(status.success());
    library
}

#[test]
fn another_major_version_is_refused() {
    let path = build_fake_plugin("major1", 1, 0);
    let err = Plugin::load(path.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::VersionSkew { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("1.0") && message.contains("major version 0"),
        "{message}"
    );
}

#[test]
fn functions_past_the_table_are_unimplemented_not_read() {
    let path = build_fake_plugin("short", 0, 1);
    let plugin = Plugin::load(path.to_str().unwrap()).unwrap();
    assert_eq!(plugin.api_version(), (0, 1));
    // Attributes lie past the end of the short table: read as "none", not out of bounds.
    assert!(plugin.attributes().is_empty());
    let err = Client::new(&plugin).unwrap_err();
    assert!(matches!(err, Error::Unimplemented { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("PJRT_Client_Create"), "{message}");
    assert!(
        message.contains("unimplemented by this plugin"),
        "{message}"
    );
}
