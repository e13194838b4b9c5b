//! Checks `ops::meta` against PyTorch's own output types and errors (tests/data/meta_cases.tsv).

use ops::{meta, DType, OpId, ScalarArg, ScalarValue, TensorType};

fn parse_tensor(spec: &str) -> TensorType {
    let (name, dims) = spec.split_once('[').expect("dtype[dims]");
    let dtype = DType::from_name(name).unwrap_or_else(|| panic!("unknown dtype {name}"));
    let dims: Vec<i64> = dims
        .trim_end_matches(']')
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    TensorType::new(dtype, &dims)
}

fn parse_scalar(spec: &str) -> ScalarArg {
    let (value, dtype) = match spec.split_once('@') {
        Some((v, d)) => (v, Some(DType::from_name(d).unwrap())),
        None => (spec, None),
    };
    let (kind, v) = value.split_once(':').unwrap();
    let value = match kind {
        "bool" => ScalarValue::Bool(v == "True"),
        "int" => ScalarValue::Int(v.parse().unwrap()),
        _ => ScalarValue::Float(v.parse().unwrap()),
    };
    ScalarArg {
        value,
        tensor_dtype: dtype,
    }
}

fn describe(r: &Result<ops::Meta, ops::OpError>) -> String {
    match r {
        Ok(m) => m
            .outputs
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("!{}: {}", e.kind.python_name(), e.message),
    }
}

#[test]
fn meta_matches_pytorch() {
    let table = include_str!("data/meta_cases.tsv");
    let mut failures = Vec::new();
    let mut count = 0;
    for line in table.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split('\t').collect();
        let op = OpId::from_name(fields[0]).unwrap_or_else(|| panic!("unknown op {}", fields[0]));
        let inputs: Vec<TensorType> = fields[1].split_whitespace().map(parse_tensor).collect();
        let scalars: Vec<ScalarArg> = fields[2].split_whitespace().map(parse_scalar).collect();
        let params: Vec<i64> = fields[3]
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let expected = fields[4];
        count += 1;
        let got = meta(op, &inputs, &scalars, &params);
        let ok = match (&got, expected.strip_prefix('!')) {
            (Err(e), Some(err)) => {
                let (class, message) = err.split_once(": ").unwrap_or((err, ""));
                e.kind.python_name() == class && e.message.starts_with(message.trim())
            }
            (Ok(m), None) => {
                let want: Vec<TensorType> = expected.split_whitespace().map(parse_tensor).collect();
                m.outputs[..] == want[..]
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{line}\n    got: {}", describe(&got)));
        }
    }
    assert!(count > 0);
    if let Ok(path) = std::env::var("META_FAILURES_FILE") {
        std::fs::write(path, failures.join("\n")).unwrap();
    }
    if !failures.is_empty() {
        let shown: Vec<&String> = failures.iter().take(40).collect();
        panic!(
            "{} of {count} meta cases differ from PyTorch:\n{}",
            failures.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
