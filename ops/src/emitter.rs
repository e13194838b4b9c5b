//! A builder for StableHLO modules in MLIR's generic textual form, one SSA value at a time.

use crate::dtype::{DType, ScalarValue, Shape, TensorType};
use crate::Precision;
use std::fmt::Write;

/// Float sums over at least this many elements run in two stages ([`Emitter::two_stage_sum`]).
pub const TWO_STAGE_SUM_MIN: i64 = 4096;
/// The group length of a two-stage sum's first stage: XLA's CPU compiler keeps reductions of up
/// to 32 elements as plain loops.
pub const SUM_GROUP: i64 = 32;

/// A handle to an SSA value of the module being built; its type is kept by the [`Emitter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);

impl Value {
    pub fn index(self) -> u32 {
        self.0
    }
}

/// StableHLO comparison directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn mlir(self) -> &'static str {
        match self {
            Cmp::Eq => "EQ",
            Cmp::Ne => "NE",
            Cmp::Lt => "LT",
            Cmp::Le => "LE",
            Cmp::Gt => "GT",
            Cmp::Ge => "GE",
        }
    }
}

struct Slot {
    name: String,
    ty: TensorType,
}

/// Builds one `func.func public @main` inside a `module`. Values are named `%argN` (function
/// arguments) and `%N` (op results); every name is unique in the module, so region bodies can
/// refer to outer values freely.
pub struct Emitter {
    slots: Vec<Slot>,
    arguments: Vec<Value>,
    /// Attribute dictionaries of arguments (e.g. `jax.buffer_donor = true`), by argument index.
    argument_attrs: Vec<Option<String>>,
    body: String,
    depth: usize,
    next_name: u32,
    /// The longest single dimension any `stablehlo.reduce` reduces, or any product contracts
    /// (XLA may turn a product into a reduction); 0 when there is none. Written into the module
    /// as [`LONGEST_REDUCTION_ATTR`].
    longest_reduction: i64,
}

/// The module attribute that tells the compiler the longest dimension the module reduces over
/// (see [`Emitter::finish`]): XLA CPU splits every reduction of a dimension longer than 32 into
/// a `reduce-window` and a `reduce` for precision, two kernels each, which at short lengths only
/// adds launches; the compiler keeps the split off for modules whose reductions are all short.
pub const LONGEST_REDUCTION_ATTR: &str = "torch_pjrt.longest_reduction";

impl Default for Emitter {
    fn default() -> Self {
        Emitter::new()
    }
}

/// Dense attributes in MLIR syntax: `array<i64: 1, 2>`.
pub fn i64_array(values: &[i64]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    if items.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// A bracketed list `[1, 2]` as used inside `#stablehlo.*` attributes.
pub fn bracket_list(values: &[i64]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// Round an f64 to a binary float format (`exp_bits`, `man_bits`) to nearest-even; its bits.
fn f64_to_float_bits(x: f64, exp_bits: u32, man_bits: u32) -> u64 {
    let bits = x.to_bits();
    let total = 1 + exp_bits + man_bits;
    let sign = (bits >> 63) << (total - 1);
    let bias = (1i64 << (exp_bits - 1)) - 1;
    let max_exp = (1i64 << exp_bits) - 1;
    if x.is_nan() {
        return sign | ((max_exp as u64) << man_bits) | (1 << (man_bits - 1));
    }
    if x.is_infinite() {
        return sign | ((max_exp as u64) << man_bits);
    }
    let biased = ((bits >> 52) & 0x7ff) as i64;
    if biased == 0 {
        // Zero or an f64 subnormal: far below any smaller format's range.
        return sign;
    }
    let mantissa = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    let mut exponent = biased - 1023 + bias;
    let mut shift = 52 - man_bits as i64;
    let subnormal = exponent <= 0;
    if subnormal {
        shift += 1 - exponent;
        exponent = 0;
    }
    if shift >= 60 {
        return sign;
    }
    let kept = mantissa >> shift;
    let rest = mantissa & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    let mut rounded = kept;
    if rest > half || (rest == half && kept & 1 == 1) {
        rounded += 1;
    }
    if subnormal {
        // A carry into bit `man_bits` lands exactly in the exponent field: the smallest normal.
        return sign | rounded;
    }
    if rounded >> (man_bits + 1) != 0 {
        rounded >>= 1;
        exponent += 1;
    }
    if exponent >= max_exp {
        return sign | ((max_exp as u64) << man_bits);
    }
    sign | ((exponent as u64) << man_bits) | (rounded & ((1u64 << man_bits) - 1))
}

/// The bits of `x` rounded to the float dtype `dtype` (f16, bf16, f32 or f64), nearest-even.
pub fn float_bits(dtype: DType, x: f64) -> u64 {
    match dtype {
        DType::F64 => x.to_bits(),
        DType::F32 => f64_to_float_bits(x, 8, 23),
        DType::F16 => f64_to_float_bits(x, 5, 10),
        _ => f64_to_float_bits(x, 8, 7),
    }
}

/// The literal of `value` as an element of `dtype`, for a `dense<...>` attribute.
pub fn literal(dtype: DType, value: ScalarValue) -> String {
    match dtype {
        DType::Bool => {
            let b = match value {
                ScalarValue::Bool(b) => b,
                v => v.as_f64() != 0.0,
            };
            b.to_string()
        }
        d if d.is_integral(false) => {
            let i = match value {
                ScalarValue::Float(f) => f as i64,
                v => v.as_i64(),
            };
            // Wrap into the type's range, as C++ casts do.
            match d {
                DType::U8 => (i as u8).to_string(),
                DType::I8 => (i as i8).to_string(),
                DType::I16 => (i as i16).to_string(),
                DType::I32 => (i as i32).to_string(),
                DType::U16 => (i as u16).to_string(),
                DType::U32 => (i as u32).to_string(),
                // A uint64 past i64's range is carried as its two's complement bits.
                DType::U64 => (i as u64).to_string(),
                _ => i.to_string(),
            }
        }
        // A real value as a complex element: `(real, imaginary)`; complex32's parts are f32
        // on the device.
        DType::C32 | DType::C64 | DType::C128 => {
            let part = dtype.compute_dtype().real_part();
            format!(
                "({}, {})",
                literal(part, value),
                literal(part, ScalarValue::Int(0))
            )
        }
        d => {
            let x = value.as_f64();
            // Small integers are exact in every float type: print them readably.
            if x.is_finite() && x == x.trunc() && x.abs() <= 256.0 {
                return format!("{x:.1}");
            }
            match d {
                DType::F64 => format!("0x{:016X}", x.to_bits()),
                DType::F32 => format!("0x{:08X}", f64_to_float_bits(x, 8, 23)),
                DType::F16 => format!("0x{:04X}", f64_to_float_bits(x, 5, 10)),
                _ => format!("0x{:04X}", f64_to_float_bits(x, 8, 7)),
            }
        }
    }
}

fn comparison_type(dtype: DType) -> &'static str {
    match dtype {
        d if d.is_float() || d.is_complex() => "FLOAT",
        d if d.is_signed_int() => "SIGNED",
        _ => "UNSIGNED",
    }
}

impl Emitter {
    pub fn new() -> Self {
        Emitter {
            slots: Vec::new(),
            arguments: Vec::new(),
            argument_attrs: Vec::new(),
            body: String::new(),
            depth: 0,
            next_name: 0,
            longest_reduction: 0,
        }
    }

    /// Declare the next function argument.
    pub fn argument(&mut self, ty: TensorType) -> Value {
        let name = format!("%arg{}", self.arguments.len());
        let v = self.new_slot(name, ty);
        self.arguments.push(v);
        self.argument_attrs.push(None);
        v
    }

    /// Declare the next function argument with an attribute dictionary's contents (e.g.
    /// `tf.aliasing_output = 0 : i32` for an input whose buffer becomes output 0).
    pub fn argument_with_attrs(&mut self, ty: TensorType, attrs: &str) -> Value {
        let v = self.argument(ty);
        *self.argument_attrs.last_mut().unwrap() = Some(attrs.to_string());
        v
    }

    /// The complete module text, returning `results` in order.
    pub fn finish(self, results: &[Value]) -> String {
        let args: Vec<String> = self
            .arguments
            .iter()
            .zip(&self.argument_attrs)
            .map(|(&a, attrs)| match attrs {
                Some(attrs) => format!(
                    "{}: {} {{{attrs}}}",
                    self.slots[a.0 as usize].name,
                    self.ty(a).mlir()
                ),
                None => format!("{}: {}", self.slots[a.0 as usize].name, self.ty(a).mlir()),
            })
            .collect();
        let result_types: Vec<String> = results.iter().map(|&r| self.ty(r).mlir()).collect();
        let result_names: Vec<&str> = results.iter().map(|&r| self.name(r)).collect();
        let mut out = String::new();
        if self.longest_reduction > 0 {
            let _ = writeln!(
                out,
                "module attributes {{{LONGEST_REDUCTION_ATTR} = {} : i64}} {{",
                self.longest_reduction
            );
        } else {
            out.push_str("module {\n");
        }
        let _ = writeln!(
            out,
            "  func.func public @main({}) -> ({}) {{",
            args.join(", "),
            result_types.join(", ")
        );
        out.push_str(&self.body);
        let _ = writeln!(
            out,
            "    \"func.return\"({}) : ({}) -> ()",
            result_names.join(", "),
            result_types.join(", ")
        );
        out.push_str("  }\n}\n");
        out
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        &self.slots[v.0 as usize].ty
    }

    pub fn dtype(&self, v: Value) -> DType {
        self.ty(v).dtype
    }

    pub fn shape(&self, v: Value) -> &[i64] {
        &self.ty(v).shape
    }

    pub fn rank(&self, v: Value) -> usize {
        self.ty(v).rank()
    }

    /// The value's SSA name, e.g. `%3`.
    pub fn name(&self, v: Value) -> &str {
        &self.slots[v.0 as usize].name
    }

    fn new_slot(&mut self, name: String, ty: TensorType) -> Value {
        self.slots.push(Slot { name, ty });
        Value(self.slots.len() as u32 - 1)
    }

    fn fresh_name(&mut self) -> String {
        let n = self.next_name;
        self.next_name += 1;
        format!("%{n}")
    }

    fn indent(&self) -> String {
        "  ".repeat(2 + self.depth)
    }

    /// Emit any op in generic form with one result: `"name"(operands) {attrs} : (...) -> ty`.
    pub fn op(&mut self, name: &str, operands: &[Value], attrs: &str, result: TensorType) -> Value {
        self.op_with_regions(name, operands, &[], attrs, vec![result])[0]
    }

    /// Emit any op in generic form, with region bodies (already-built text) and several results.
    pub fn op_with_regions(
        &mut self,
        name: &str,
        operands: &[Value],
        regions: &[String],
        attrs: &str,
        results: Vec<TensorType>,
    ) -> Vec<Value> {
        let base = self.fresh_name();
        let operand_names: Vec<&str> = operands.iter().map(|&o| self.name(o)).collect();
        let operand_types: Vec<String> = operands.iter().map(|&o| self.ty(o).mlir()).collect();
        let result_types: Vec<String> = results.iter().map(|t| t.mlir()).collect();
        let mut line = self.indent();
        if results.len() == 1 {
            let _ = write!(line, "{base} = ");
        } else {
            let _ = write!(line, "{base}:{} = ", results.len());
        }
        let _ = write!(line, "\"{name}\"({})", operand_names.join(", "));
        if !regions.is_empty() {
            let _ = write!(line, " ({})", regions.join(", "));
        }
        if !attrs.is_empty() {
            let _ = write!(line, " {{{attrs}}}");
        }
        let result_sig = if results.len() == 1 {
            result_types[0].clone()
        } else {
            format!("({})", result_types.join(", "))
        };
        let _ = writeln!(line, " : ({}) -> {}", operand_types.join(", "), result_sig);
        self.body.push_str(&line);
        let n = results.len();
        results
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                let name = if n == 1 {
                    base.clone()
                } else {
                    format!("{base}#{i}")
                };
                self.new_slot(name, ty)
            })
            .collect()
    }

    /// Random words, as signed integers of `shape` (`i64` when `wide`, else `i32`), from the
    /// 0-d `i64` draw key: word `i` is SplitMix64's output for the state `key + (i + 1) * γ`, a
    /// counter hashed by three xor-shift-multiply steps (RFC 0010). Plain integer arithmetic,
    /// so every backend computes the same bits; a draw compiles in a few milliseconds, where
    /// `rng_bit_generator`'s Threefry expansion cost about 100 ms per draw on XLA CPU.
    pub fn random_words(&mut self, key: Value, shape: &[i64], wide: bool) -> Value {
        const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
        const MIX1: u64 = 0xbf58_476d_1ce4_e5b9;
        const MIX2: u64 = 0x94d0_49bb_1331_11eb;
        let numel: i64 = shape.iter().product();
        let flat = TensorType::new(DType::I64, &[numel]);
        let word =
            |e: &mut Emitter, value: u64| e.constant(flat.clone(), ScalarValue::Int(value as i64));
        let counter = self.iota(flat.clone(), 0);
        let one = word(self, 1);
        let counter = self.add(counter, one);
        let gamma = word(self, GAMMA);
        let stride = self.mul(counter, gamma);
        let key = self.reshape(key, &[]);
        let key = self.broadcast_in_dim(key, &[numel], &[]);
        let mut z = self.add(key, stride);
        for (shift, multiplier) in [(30, Some(MIX1)), (27, Some(MIX2)), (31, None)] {
            let amount = word(self, shift);
            let shifted = self.binary("stablehlo.shift_right_logical", z, amount);
            z = self.xor(z, shifted);
            if let Some(multiplier) = multiplier {
                let multiplier = word(self, multiplier);
                z = self.mul(z, multiplier);
            }
        }
        let words = if wide {
            z
        } else {
            // The high half, whose bits are the best mixed, as an i32 with the same bits.
            let amount = word(self, 32);
            let high = self.binary("stablehlo.shift_right_arithmetic", z, amount);
            self.convert(high, DType::I32)
        };
        self.reshape(words, shape)
    }

    /// Build a region with one block whose arguments have `arg_types`; `body` returns the values
    /// the block yields through `stablehlo.return`.
    pub fn region(
        &mut self,
        arg_types: &[TensorType],
        body: impl FnOnce(&mut Emitter, &[Value]) -> Vec<Value>,
    ) -> String {
        let outer = std::mem::take(&mut self.body);
        self.depth += 1;
        let args: Vec<Value> = arg_types
            .iter()
            .map(|t| {
                let name = self.fresh_name();
                self.new_slot(name, t.clone())
            })
            .collect();
        let results = body(self, &args);
        let names: Vec<&str> = results.iter().map(|&r| self.name(r)).collect();
        let types: Vec<String> = results.iter().map(|&r| self.ty(r).mlir()).collect();
        let ret = format!(
            "{}\"stablehlo.return\"({}) : ({}) -> ()\n",
            self.indent(),
            names.join(", "),
            types.join(", ")
        );
        self.body.push_str(&ret);
        let inner = std::mem::replace(&mut self.body, outer);
        self.depth -= 1;
        let block_args: Vec<String> = args
            .iter()
            .map(|&a| format!("{}: {}", self.name(a), self.ty(a).mlir()))
            .collect();
        format!(
            "{{\n{}^bb0({}):\n{}{}}}",
            self.indent(),
            block_args.join(", "),
            inner,
            self.indent()
        )
    }

    // ---- constants -----------------------------------------------------------------------

    /// A constant of type `ty` with every element `value` (converted to `ty.dtype`).
    /// A `stablehlo.while` whose carried values start as `init`; `cond` and `body` see the
    /// carried values (constants they need are made inside, so nothing is captured from outside).
    pub fn while_loop(
        &mut self,
        init: &[Value],
        cond: impl FnOnce(&mut Emitter, &[Value]) -> Value,
        body: impl FnOnce(&mut Emitter, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let types: Vec<TensorType> = init.iter().map(|&v| self.ty(v).clone()).collect();
        let cond_region = self.region(&types, |e, args| vec![cond(e, args)]);
        let body_region = self.region(&types, body);
        self.op_with_regions(
            "stablehlo.while",
            init,
            &[cond_region, body_region],
            "",
            types,
        )
    }

    pub fn constant(&mut self, ty: TensorType, value: ScalarValue) -> Value {
        let attr = format!(
            "value = dense<{}> : {}",
            literal(ty.dtype, value),
            ty.mlir()
        );
        self.op("stablehlo.constant", &[], &attr, ty)
    }

    /// A 0-d constant.
    pub fn scalar_constant(&mut self, dtype: DType, value: ScalarValue) -> Value {
        self.constant(TensorType::scalar(dtype), value)
    }

    pub fn f64_constant(&mut self, dtype: DType, value: f64) -> Value {
        self.scalar_constant(dtype, ScalarValue::Float(value))
    }

    /// `v`, hidden from XLA's algebraic simplifier: a division by a constant hidden this way
    /// stays a true division instead of becoming a multiplication by the rounded reciprocal.
    pub fn opaque(&mut self, v: Value) -> Value {
        let ty = self.ty(v).clone();
        self.op("stablehlo.optimization_barrier", &[v], "", ty)
    }

    /// A constant of `v`'s type filled with `value`.
    pub fn full_like(&mut self, v: Value, value: f64) -> Value {
        let ty = self.ty(v).clone();
        let value = if ty.dtype.is_float() || ty.dtype.is_complex() {
            ScalarValue::Float(value)
        } else {
            ScalarValue::Int(value as i64)
        };
        self.constant(ty, value)
    }

    /// A constant with explicit elements (row-major).
    pub fn dense_i64(&mut self, ty: TensorType, values: &[i64]) -> Value {
        let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let attr = format!("value = dense<[{}]> : {}", items.join(", "), ty.mlir());
        self.op("stablehlo.constant", &[], &attr, ty)
    }

    /// `stablehlo.iota` along `dim`.
    pub fn iota(&mut self, ty: TensorType, dim: usize) -> Value {
        self.op(
            "stablehlo.iota",
            &[],
            &format!("iota_dimension = {dim} : i64"),
            ty,
        )
    }

    // ---- shape ops -----------------------------------------------------------------------

    pub fn reshape(&mut self, v: Value, shape: &[i64]) -> Value {
        if self.shape(v) == shape {
            return v;
        }
        let ty = self.ty(v).with_shape(shape);
        self.op("stablehlo.reshape", &[v], "", ty)
    }

    pub fn transpose(&mut self, v: Value, perm: &[usize]) -> Value {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return v;
        }
        let shape: Shape = perm.iter().map(|&p| self.shape(v)[p]).collect();
        let ty = self.ty(v).with_shape(&shape);
        let perm: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        self.op(
            "stablehlo.transpose",
            &[v],
            &format!("permutation = {}", i64_array(&perm)),
            ty,
        )
    }

    /// `stablehlo.broadcast_in_dim`: operand dim i becomes result dim `dims[i]`.
    pub fn broadcast_in_dim(&mut self, v: Value, shape: &[i64], dims: &[usize]) -> Value {
        let ty = self.ty(v).with_shape(shape);
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        self.op(
            "stablehlo.broadcast_in_dim",
            &[v],
            &format!("broadcast_dimensions = {}", i64_array(&dims)),
            ty,
        )
    }

    /// Numpy-style broadcast of `v` to `shape` (trailing dims aligned).
    pub fn broadcast_to(&mut self, v: Value, shape: &[i64]) -> Value {
        if self.shape(v) == shape {
            return v;
        }
        let offset = shape.len() - self.rank(v);
        let dims: Vec<usize> = (0..self.rank(v)).map(|i| i + offset).collect();
        self.broadcast_in_dim(v, shape, &dims)
    }

    /// Broadcast all values to their common shape (shapes must be broadcast-compatible).
    pub fn broadcast_all(&mut self, values: &[Value]) -> Vec<Value> {
        let mut shape = Shape::new();
        for &v in values {
            shape = crate::promote::broadcast_shapes(&shape, self.shape(v))
                .expect("meta checked broadcasting");
        }
        values
            .iter()
            .map(|&v| self.broadcast_to(v, &shape))
            .collect()
    }

    pub fn slice(&mut self, v: Value, start: &[i64], limit: &[i64], strides: &[i64]) -> Value {
        let shape: Shape = (0..start.len())
            .map(|i| {
                // The ceiling of the extent over the stride, without overflow for a stride near
                // i64::MAX.
                let extent = (limit[i] - start[i]).max(0);
                if extent == 0 {
                    0
                } else {
                    (extent - 1) / strides[i] + 1
                }
            })
            .collect();
        let ty = self.ty(v).with_shape(&shape);
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(start),
            i64_array(limit),
            i64_array(strides)
        );
        self.op("stablehlo.slice", &[v], &attrs, ty)
    }

    /// Slice `[start, limit)` along one dim.
    pub fn slice_dim(&mut self, v: Value, dim: usize, start: i64, limit: i64, step: i64) -> Value {
        let shape = self.shape(v).to_vec();
        let mut starts = vec![0; shape.len()];
        let mut limits = shape.clone();
        let mut strides = vec![1; shape.len()];
        starts[dim] = start;
        limits[dim] = limit;
        strides[dim] = step;
        if start == 0 && limit == shape[dim] && step == 1 {
            return v;
        }
        self.slice(v, &starts, &limits, &strides)
    }

    pub fn concatenate(&mut self, values: &[Value], dim: usize) -> Value {
        if values.len() == 1 {
            return values[0];
        }
        let mut shape = self.shape(values[0]).to_vec();
        shape[dim] = values.iter().map(|&v| self.shape(v)[dim]).sum();
        let ty = self.ty(values[0]).with_shape(&shape);
        self.op(
            "stablehlo.concatenate",
            values,
            &format!("dimension = {dim} : i64"),
            ty,
        )
    }

    /// `stablehlo.pad` with edge padding (negative crops) and interior padding.
    pub fn pad(
        &mut self,
        v: Value,
        pad_value: Value,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> Value {
        let shape: Shape = self
            .shape(v)
            .iter()
            .enumerate()
            .map(|(i, &d)| low[i] + high[i] + d + (d - 1).max(0) * interior[i])
            .collect();
        let ty = self.ty(v).with_shape(&shape);
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            i64_array(low),
            i64_array(high),
            i64_array(interior)
        );
        self.op("stablehlo.pad", &[v, pad_value], &attrs, ty)
    }

    pub fn reverse(&mut self, v: Value, dims: &[usize]) -> Value {
        if dims.is_empty() {
            return v;
        }
        let ty = self.ty(v).clone();
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        self.op(
            "stablehlo.reverse",
            &[v],
            &format!("dimensions = {}", i64_array(&dims)),
            ty,
        )
    }

    // ---- elementwise ---------------------------------------------------------------------

    /// An elementwise op whose result has the type of its first operand.
    pub fn unary(&mut self, name: &str, v: Value) -> Value {
        let ty = self.ty(v).clone();
        self.op(name, &[v], "", ty)
    }

    /// An elementwise op over same-typed operands; the result has their type.
    pub fn binary(&mut self, name: &str, a: Value, b: Value) -> Value {
        debug_assert_eq!(self.ty(a), self.ty(b), "{name} operands must have one type");
        let ty = self.ty(a).clone();
        self.op(name, &[a, b], "", ty)
    }

    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.add", a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.subtract", a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.multiply", a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.divide", a, b)
    }
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.remainder", a, b)
    }
    pub fn max(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.maximum", a, b)
    }
    pub fn min(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.minimum", a, b)
    }
    pub fn pow(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.power", a, b)
    }
    pub fn and(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.and", a, b)
    }
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.or", a, b)
    }
    pub fn xor(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.xor", a, b)
    }
    pub fn neg(&mut self, v: Value) -> Value {
        self.unary("stablehlo.negate", v)
    }
    pub fn not(&mut self, v: Value) -> Value {
        self.unary("stablehlo.not", v)
    }
    pub fn abs(&mut self, v: Value) -> Value {
        self.unary("stablehlo.abs", v)
    }
    pub fn exp(&mut self, v: Value) -> Value {
        self.unary("stablehlo.exponential", v)
    }
    pub fn log(&mut self, v: Value) -> Value {
        self.unary("stablehlo.log", v)
    }
    pub fn sqrt(&mut self, v: Value) -> Value {
        self.unary("stablehlo.sqrt", v)
    }
    pub fn floor(&mut self, v: Value) -> Value {
        self.unary("stablehlo.floor", v)
    }

    /// Elementwise binary op with a value of the other operand's dtype broadcast in: `a op c`.
    pub fn binary_const(&mut self, name: &str, a: Value, c: f64) -> Value {
        let k = self.full_like(a, c);
        self.binary(name, a, k)
    }

    /// `stablehlo.compare`; the comparison type follows the operands' dtype.
    pub fn compare(&mut self, dir: Cmp, a: Value, b: Value) -> Value {
        let ty = self.ty(a).with_dtype(DType::Bool);
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {}>",
            dir.mlir(),
            comparison_type(self.dtype(a))
        );
        self.op("stablehlo.compare", &[a, b], &attrs, ty)
    }

    /// Compare against a constant of `a`'s dtype.
    pub fn compare_const(&mut self, dir: Cmp, a: Value, c: f64) -> Value {
        let k = self.full_like(a, c);
        self.compare(dir, a, k)
    }

    /// `stablehlo.select(pred, on_true, on_false)`; all of one shape.
    pub fn select(&mut self, pred: Value, on_true: Value, on_false: Value) -> Value {
        let ty = self.ty(on_true).clone();
        self.op("stablehlo.select", &[pred, on_true, on_false], "", ty)
    }

    /// Raw `stablehlo.convert` (float to int truncates toward zero). A complex value converted
    /// to a real dtype gives its real part, as PyTorch's casts do (StableHLO leaves that
    /// conversion undefined, so the real part is taken first).
    pub fn convert(&mut self, v: Value, dtype: DType) -> Value {
        if self.dtype(v) == dtype {
            return v;
        }
        // complex32 is complex64 on the device: read as complex64 it needs no op but a type
        // change; made from anything else, its parts are rounded to f16.
        if self.dtype(v) == DType::C32 {
            let ty = self.ty(v).with_dtype(DType::C64);
            let wide = self.op("stablehlo.convert", &[v], "", ty);
            return self.convert(wide, dtype);
        }
        if dtype == DType::C32 {
            let wide = self.convert(v, DType::C64);
            let re = self.real(wide);
            let im = self.imag(wide);
            let re = self.convert(re, DType::F16);
            let im = self.convert(im, DType::F16);
            return self.complex(re, im);
        }
        let v = if self.dtype(v).is_complex() && !dtype.is_complex() {
            self.real(v)
        } else {
            v
        };
        if self.dtype(v) == dtype {
            return v;
        }
        let ty = self.ty(v).with_dtype(dtype);
        self.op("stablehlo.convert", &[v], "", ty)
    }

    /// A cast with PyTorch semantics: to bool is `x != 0`, everything else converts.
    pub fn cast(&mut self, v: Value, dtype: DType) -> Value {
        if self.dtype(v) == dtype {
            return v;
        }
        if dtype == DType::Bool {
            return self.compare_const(Cmp::Ne, v, 0.0);
        }
        self.convert(v, dtype)
    }

    // ---- complex values ------------------------------------------------------------------

    /// The real part of a complex value (a real value itself).
    pub fn real(&mut self, v: Value) -> Value {
        self.part("stablehlo.real", v)
    }

    /// The imaginary part of a complex value.
    pub fn imag(&mut self, v: Value) -> Value {
        self.part("stablehlo.imag", v)
    }

    fn part(&mut self, name: &str, v: Value) -> Value {
        let ty = self.ty(v);
        if !ty.dtype.is_complex() {
            return v;
        }
        if ty.dtype == DType::C32 {
            // The device's parts are f32 holding f16 values: exact in f16.
            let ty = ty.with_dtype(DType::F32);
            let part = self.op(name, &[v], "", ty);
            return self.convert(part, DType::F16);
        }
        let ty = ty.with_dtype(ty.dtype.real_part());
        self.op(name, &[v], "", ty)
    }

    /// The complex value with parts `re` and `im` (of one float type and shape); f16 parts make
    /// a complex32 value (complex64 on the device).
    pub fn complex(&mut self, re: Value, im: Value) -> Value {
        if self.dtype(re) == DType::F16 {
            let ty = self.ty(re).with_dtype(DType::C32);
            let re = self.convert(re, DType::F32);
            let im = self.convert(im, DType::F32);
            return self.op("stablehlo.complex", &[re, im], "", ty);
        }
        let ty = self.ty(re);
        let ty = ty.with_dtype(ty.dtype.to_complex());
        self.op("stablehlo.complex", &[re, im], "", ty)
    }

    /// The complex conjugate (a real value itself).
    pub fn conj(&mut self, v: Value) -> Value {
        if !self.dtype(v).is_complex() {
            return v;
        }
        let re = self.real(v);
        let im = self.imag(v);
        let im = self.neg(im);
        self.complex(re, im)
    }

    /// `v`'s bits read as `ty` (`stablehlo.bitcast_convert`, with its shape rules: a narrower
    /// element type adds a trailing dimension, a wider one takes it away); `ty` may regroup the
    /// elements into any shape of the same byte count. StableHLO reinterprets complex values only
    /// as complex ones, so a complex value is read as pairs of its parts (its memory layout), and
    /// pairs of parts make a complex value.
    pub fn bitcast(&mut self, v: Value, ty: TensorType) -> Value {
        let from = self.ty(v).clone();
        if from == ty {
            return v;
        }
        // A bool is a byte in memory but one bit (`i1`) in StableHLO, which has no bitcast to
        // or from it: bools are read as the bytes 0 and 1, and bytes as bools by `!= 0`.
        if from.dtype == DType::Bool {
            let bytes = self.convert(v, DType::U8);
            return self.bitcast(bytes, ty);
        }
        if ty.dtype == DType::Bool {
            let bytes = self.bitcast(v, ty.with_dtype(DType::U8));
            return self.compare_const(Cmp::Ne, bytes, 0.0);
        }
        if from.dtype.is_complex() {
            let re = self.real(v);
            let im = self.imag(v);
            let mut paired = from.shape.to_vec();
            paired.push(1);
            let re = self.reshape(re, &paired);
            let im = self.reshape(im, &paired);
            let parts = self.concatenate(&[re, im], paired.len() - 1);
            return self.bitcast(parts, ty);
        }
        if ty.dtype.is_complex() {
            let mut paired = ty.shape.to_vec();
            paired.push(2);
            let parts = self.bitcast(v, TensorType::new(ty.dtype.real_part(), &paired));
            let last = paired.len() - 1;
            let re = self.slice_dim(parts, last, 0, 1, 1);
            let im = self.slice_dim(parts, last, 1, 2, 1);
            let re = self.reshape(re, &ty.shape);
            let im = self.reshape(im, &ty.shape);
            return self.complex(re, im);
        }
        let (fs, ts) = (from.dtype.size_bytes(), ty.dtype.size_bytes());
        if fs == ts {
            let v = self.reshape(v, &ty.shape);
            return self.op("stablehlo.bitcast_convert", &[v], "", ty);
        }
        if fs < ts {
            let mut grouped = ty.shape.to_vec();
            grouped.push((ts / fs) as i64);
            let v = self.reshape(v, &grouped);
            return self.op("stablehlo.bitcast_convert", &[v], "", ty);
        }
        let mut split = from.shape.to_vec();
        split.push((fs / ts) as i64);
        let split = TensorType::new(ty.dtype, &split);
        let v = self.op("stablehlo.bitcast_convert", &[v], "", split);
        self.reshape(v, &ty.shape)
    }

    // ---- reductions and contractions -----------------------------------------------------

    /// `stablehlo.reduce` of several inputs together over `dims`; `body` combines
    /// `(accumulators..., elements...)` into new accumulators.
    pub fn reduce(
        &mut self,
        inputs: &[Value],
        inits: &[Value],
        dims: &[usize],
        body: impl FnOnce(&mut Emitter, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let scalar_types: Vec<TensorType> = inits
            .iter()
            .map(|&i| TensorType::scalar(self.dtype(i)))
            .collect();
        let mut arg_types = scalar_types.clone();
        arg_types.extend(scalar_types.iter().cloned());
        let region = self.region(&arg_types, body);
        self.note_reduction(inputs[0], dims);
        let kept: Shape = self
            .shape(inputs[0])
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let results: Vec<TensorType> = inputs
            .iter()
            .map(|&v| TensorType {
                dtype: self.dtype(v),
                shape: kept.clone(),
            })
            .collect();
        let mut operands = inputs.to_vec();
        operands.extend_from_slice(inits);
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        self.op_with_regions(
            "stablehlo.reduce",
            &operands,
            &[region],
            &format!("dimensions = {}", i64_array(&dims)),
            results,
        )
    }

    /// Records the longest of `v`'s `dims` for [`LONGEST_REDUCTION_ATTR`].
    fn note_reduction(&mut self, v: Value, dims: &[usize]) {
        let shape = self.shape(v);
        let longest = dims.iter().map(|&d| shape[d]).max().unwrap_or(0);
        self.longest_reduction = self.longest_reduction.max(longest);
    }

    /// Reduce one input with a binary StableHLO op (`stablehlo.add`, `stablehlo.maximum`...).
    pub fn reduce_with(&mut self, v: Value, init: f64, dims: &[usize], combiner: &str) -> Value {
        let dtype = self.dtype(v);
        let init = if dtype == DType::Bool {
            self.scalar_constant(dtype, ScalarValue::Bool(init != 0.0))
        } else {
            self.f64_constant(dtype, init)
        };
        let combiner = combiner.to_string();
        self.reduce(&[v], &[init], dims, |e, args| {
            vec![e.binary(&combiner, args[0], args[1])]
        })[0]
    }

    /// The sum over `dims`. A large float sum over trailing dims runs in two stages (see
    /// [`Emitter::two_stage_sum`]).
    pub fn reduce_sum(&mut self, v: Value, dims: &[usize]) -> Value {
        if let Some(sum) = self.two_stage_sum(v, dims) {
            return sum;
        }
        self.reduce_with(v, 0.0, dims, "stablehlo.add")
    }

    /// A float sum over trailing `dims` of at least [`TWO_STAGE_SUM_MIN`] elements, as sums of
    /// groups of [`SUM_GROUP`] consecutive elements (zero-padded to whole groups) and then the
    /// sum of those. XLA's CPU compiler rewrites a long reduction into a `reduce_window` tree, and
    /// an elementwise producer does not fuse into that: the producer is written to a buffer as
    /// large as the input first (64 MB for a chain over 16M floats, in fresh pages every call).
    /// A group of 32 is short enough to stay a plain reduction, so the producer fuses into it,
    /// and the tree only sums the partial sums. The second stage starts from -0.0, which is as
    /// much the identity of float addition as 0.0 (partial sums are never -0.0, they start from
    /// 0.0); with equal starting values XLA would merge the two stages back into one.
    fn two_stage_sum(&mut self, v: Value, dims: &[usize]) -> Option<Value> {
        let dtype = self.dtype(v);
        if !dtype.is_float() || dims.is_empty() {
            return None;
        }
        let shape = self.shape(v).to_vec();
        let (r, k) = (shape.len(), dims.len());
        if k > r || dims.iter().enumerate().any(|(i, &d)| d != r - k + i) {
            return None;
        }
        let n: i64 = shape[r - k..].iter().product();
        if n < TWO_STAGE_SUM_MIN {
            return None;
        }
        let kept = &shape[..r - k];
        let groups = (n + SUM_GROUP - 1) / SUM_GROUP;
        let mut flat = kept.to_vec();
        flat.push(n);
        let mut x = self.reshape(v, &flat);
        if groups * SUM_GROUP != n {
            let zero = self.f64_constant(dtype, 0.0);
            let none = vec![0; flat.len()];
            let mut high = none.clone();
            high[kept.len()] = groups * SUM_GROUP - n;
            x = self.pad(x, zero, &none, &high, &none);
        }
        let mut grouped = kept.to_vec();
        grouped.extend([groups, SUM_GROUP]);
        let x = self.reshape(x, &grouped);
        let partial = self.reduce_with(x, 0.0, &[kept.len() + 1], "stablehlo.add");
        Some(self.reduce_with(partial, -0.0, &[kept.len()], "stablehlo.add"))
    }

    /// The `precision_config` attribute (with its leading comma) for a matrix product or
    /// convolution over `operand`: for float32, the precision PyTorch's
    /// `torch.get_float32_matmul_precision()` asked for (full precision by default: without
    /// the attribute XLA's GPU compiler multiplies float32 through TF32, 10-bit mantissas);
    /// float64 always at full precision. CPU compilers ignore it.
    pub fn precision_config(&self, operand: Value) -> &'static str {
        match (self.dtype(operand), Precision::current()) {
            (DType::F64 | DType::C64 | DType::C128, _) | (DType::F32, Precision::Highest) => {
                ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]"
            }
            (DType::F32, Precision::High) => {
                ", precision_config = [#stablehlo<precision HIGH>, #stablehlo<precision HIGH>]"
            }
            (DType::F32, Precision::Medium) => {
                ", precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]"
            }
            _ => "",
        }
    }

    /// `stablehlo.dot_general`; result dims are batch, lhs free, rhs free.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_general(
        &mut self,
        lhs: Value,
        rhs: Value,
        lhs_batch: &[usize],
        rhs_batch: &[usize],
        lhs_contract: &[usize],
        rhs_contract: &[usize],
        result_dtype: DType,
    ) -> Value {
        self.note_reduction(lhs, lhs_contract);
        let ls = self.shape(lhs).to_vec();
        let rs = self.shape(rhs).to_vec();
        let mut shape: Shape = lhs_batch.iter().map(|&d| ls[d]).collect();
        shape.extend(
            (0..ls.len())
                .filter(|d| !lhs_batch.contains(d) && !lhs_contract.contains(d))
                .map(|d| ls[d]),
        );
        shape.extend(
            (0..rs.len())
                .filter(|d| !rhs_batch.contains(d) && !rhs_contract.contains(d))
                .map(|d| rs[d]),
        );
        let l = |v: &[usize]| bracket_list(&v.iter().map(|&d| d as i64).collect::<Vec<_>>());
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>{}",
            l(lhs_batch),
            l(rhs_batch),
            l(lhs_contract),
            l(rhs_contract),
            self.precision_config(lhs)
        );
        self.op(
            "stablehlo.dot_general",
            &[lhs, rhs],
            &attrs,
            TensorType {
                dtype: result_dtype,
                shape,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_round_to_nearest_even() {
        assert_eq!(literal(DType::F32, ScalarValue::Float(0.1)), "0x3DCCCCCD");
        assert_eq!(literal(DType::BF16, ScalarValue::Float(0.1)), "0x3DCD");
        assert_eq!(literal(DType::F16, ScalarValue::Float(0.1)), "0x2E66");
        assert_eq!(literal(DType::F16, ScalarValue::Float(1e-7)), "0x0002");
        assert_eq!(literal(DType::F16, ScalarValue::Float(1e6)), "0x7C00");
        assert_eq!(
            literal(DType::F32, ScalarValue::Float(f64::NAN)),
            "0x7FC00000"
        );
        assert_eq!(
            literal(DType::F32, ScalarValue::Float(f64::NEG_INFINITY)),
            "0xFF800000"
        );
        assert_eq!(literal(DType::F64, ScalarValue::Float(2.0)), "2.0");
        assert_eq!(literal(DType::U8, ScalarValue::Int(-1)), "255");
        assert_eq!(literal(DType::U16, ScalarValue::Int(65537)), "1");
        assert_eq!(
            literal(DType::U64, ScalarValue::Int(-1)),
            "18446744073709551615"
        );
        assert_eq!(literal(DType::Bool, ScalarValue::Int(3)), "true");
    }
}
