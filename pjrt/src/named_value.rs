//! `PJRT_NamedValue`: the key/value options of client creation and plugin attributes.

use pjrt_sys as sys;
use std::ffi::c_char;

/// One option or attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum NamedValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f32),
    Bool(bool),
}

impl NamedValue {
    /// # Safety
    /// `raw` must be a valid named value whose pointers are readable.
    pub(crate) unsafe fn from_raw(raw: &sys::PJRT_NamedValue) -> (String, NamedValue) {
        let name = crate::api::lossy_string(raw.name, raw.name_size);
        let value = match raw.type_ {
            sys::PJRT_NamedValue_kString => NamedValue::String(crate::api::lossy_string(
                raw.__bindgen_anon_1.string_value,
                raw.value_size,
            )),
            sys::PJRT_NamedValue_kInt64 => NamedValue::Int64(raw.__bindgen_anon_1.int64_value),
            sys::PJRT_NamedValue_kInt64List => {
                let ptr = raw.__bindgen_anon_1.int64_array_value;
                let list = if ptr.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(ptr, raw.value_size).to_vec()
                };
                NamedValue::Int64List(list)
            }
            sys::PJRT_NamedValue_kFloat => NamedValue::Float(raw.__bindgen_anon_1.float_value),
            _ => NamedValue::Bool(raw.__bindgen_anon_1.bool_value),
        };
        (name, value)
    }
}

/// Owns the memory that a list of raw `PJRT_NamedValue`s points into while a call is made.
pub(crate) struct RawNamedValues {
    _names: Vec<Vec<u8>>,
    _strings: Vec<Vec<u8>>,
    _lists: Vec<Vec<i64>>,
    pub(crate) raw: Vec<sys::PJRT_NamedValue>,
}

impl RawNamedValues {
    pub(crate) fn new(values: &[(String, NamedValue)]) -> RawNamedValues {
        let mut names = Vec::new();
        let mut strings = Vec::new();
        let mut lists = Vec::new();
        let mut raw = Vec::new();
        for (name, value) in values {
            let name_bytes = name.as_bytes().to_vec();
            let mut nv = sys::PJRT_NamedValue {
                struct_size: sys::PJRT_NamedValue_STRUCT_SIZE as usize,
                name: name_bytes.as_ptr() as *const c_char,
                name_size: name_bytes.len(),
                ..Default::default()
            };
            names.push(name_bytes);
            match value {
                NamedValue::String(s) => {
                    let bytes = s.as_bytes().to_vec();
                    nv.type_ = sys::PJRT_NamedValue_kString;
                    nv.__bindgen_anon_1.string_value = bytes.as_ptr() as *const c_char;
                    nv.value_size = bytes.len();
                    strings.push(bytes);
                }
                NamedValue::Int64(v) => {
                    nv.type_ = sys::PJRT_NamedValue_kInt64;
                    nv.__bindgen_anon_1.int64_value = *v;
                    nv.value_size = 1;
                }
                NamedValue::Int64List(v) => {
                    let list = v.clone();
                    nv.type_ = sys::PJRT_NamedValue_kInt64List;
                    nv.__bindgen_anon_1.int64_array_value = list.as_ptr();
                    nv.value_size = list.len();
                    lists.push(list);
                }
                NamedValue::Float(v) => {
                    nv.type_ = sys::PJRT_NamedValue_kFloat;
                    nv.__bindgen_anon_1.float_value = *v;
                    nv.value_size = 1;
                }
                NamedValue::Bool(v) => {
                    nv.type_ = sys::PJRT_NamedValue_kBool;
                    nv.__bindgen_anon_1.bool_value = *v;
                    nv.value_size = 1;
                }
            }
            raw.push(nv);
        }
        RawNamedValues {
            _names: names,
            _strings: strings,
            _lists: lists,
            raw,
        }
    }
}
