//! Typed param layouts: an op's static params (`&[i64]`) declared once, each by name and kind,
//! and decoded into a struct with one typed field per param.
//!
//! A catalogue row names its layout (`params: ReduceDtypeDims`). The layout is the only place
//! that knows positions: meta and lowering read fields by name from the decoded struct (a wrong
//! name or kind does not compile), [`Params`] refuses to be decoded with another op's layout,
//! and the plugin's kernel generator reads the same declarations from the file
//! `ops/tests/param_layouts.rs` writes (`python/torch_pjrt/csrc/param_layouts.json`).

use crate::dtype::DType;
use crate::error::OpError;
use crate::params::{OperandKind, Params, RoundingMode};

/// One declared param: its name, its kind and whether it may be left out at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldDecl {
    pub name: &'static str,
    pub kind: FieldKind,
    /// May be left out when no later param is given (it then reads as its default or `None`).
    pub optional: bool,
}

/// The kinds of [`kind`], as values (for descriptions and the plugin's layout file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    Int,
    Flag,
    F64,
    Dtype,
    OptDtype,
    Reduction,
    RoundingMode,
    OperandKind,
    OutputMask,
    /// Every value left.
    Ints,
    /// A count, then that many values.
    Counted,
}

impl FieldKind {
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Int => "int",
            FieldKind::Flag => "flag",
            FieldKind::F64 => "f64",
            FieldKind::Dtype => "dtype",
            FieldKind::OptDtype => "opt_dtype",
            FieldKind::Reduction => "reduction",
            FieldKind::RoundingMode => "rounding_mode",
            FieldKind::OperandKind => "operand_kind",
            FieldKind::OutputMask => "output_mask",
            FieldKind::Ints => "ints",
            FieldKind::Counted => "counted",
        }
    }

    /// Whether the field spans a run of values rather than one.
    pub fn is_list(self) -> bool {
        matches!(self, FieldKind::Ints | FieldKind::Counted)
    }
}

/// Reads one op's params in declaration order, checking each value against its field's kind.
pub struct ParamReader<'p, 'a> {
    params: &'p Params<'a>,
    at: usize,
}

impl<'a> ParamReader<'_, 'a> {
    /// Whether every value has been read.
    pub fn is_done(&self) -> bool {
        self.at >= self.params.values().len()
    }

    /// The error for a value of `field` that its kind refuses.
    pub fn invalid(&self, field: &str, what: &str) -> OpError {
        self.params.invalid(&format!("{field}: {what}"))
    }

    fn next(&mut self, field: &str) -> Result<i64, OpError> {
        let value = self
            .params
            .values()
            .get(self.at)
            .copied()
            .ok_or_else(|| self.params.invalid(&format!("missing {field}")))?;
        self.at += 1;
        Ok(value)
    }

    fn rest(&mut self) -> &'a [i64] {
        let values = self.params.values();
        let rest = values.get(self.at..).unwrap_or(&[]);
        self.at = values.len();
        rest
    }

    fn take(&mut self, field: &str, n: i64) -> Result<&'a [i64], OpError> {
        let values = self.params.values();
        let rest = values.get(self.at..).unwrap_or(&[]);
        if n < 0 || n as usize > rest.len() {
            return Err(self.invalid(field, "a counted list runs past the end"));
        }
        self.at += n as usize;
        Ok(&rest[..n as usize])
    }

    fn finish(&self) -> Result<(), OpError> {
        if self.is_done() {
            Ok(())
        } else {
            Err(self.params.invalid("params left after the last field"))
        }
    }
}

/// What one declared param holds and how its values read.
pub trait ParamKind {
    /// The decoded value.
    type Value<'a>;
    const KIND: FieldKind;
    const OPTIONAL: bool = false;
    fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<Self::Value<'a>, OpError>;
    /// Appends the value's params, as `read` takes them back.
    fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E);
}

/// The kinds a layout's fields may have.
pub mod kind {
    use super::*;

    /// Any integer (a dim, a size, an index, a count).
    pub struct Int;
    /// 0 or 1.
    pub struct Flag;
    /// An f64 by its bits (NaN and -0.0 survive; see [`crate::f64_param`]).
    pub struct F64;
    /// A dtype code ([`DType::code`]).
    pub struct Dtype;
    /// A dtype code, or -1 for none ([`crate::dtype_param`]).
    pub struct OptDtype;
    /// 0 = none, 1 = mean, 2 = sum.
    pub struct Reduction;
    /// `div`'s rounding mode: 0 = true division, 1 = trunc, 2 = floor.
    pub struct Rounding;
    /// Where an optional operand comes from: 0 = absent, 1 = the next tensor input, 2 = the
    /// next value scalar.
    pub struct Operand;
    /// A backward op's output mask: bits 1, 2, 4 for its three results.
    pub struct OutputMask;
    /// Every value left: a list that ends the layout.
    pub struct Ints;
    /// A list as its length followed by its values, for layouts holding several lists.
    pub struct Counted;
    /// A field that may be left out at the end: `None` then.
    pub struct Opt<K>(std::marker::PhantomData<K>);

    impl ParamKind for Int {
        type Value<'a> = i64;
        const KIND: FieldKind = FieldKind::Int;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<i64, OpError> {
            r.next(field)
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([*value]);
        }
    }

    impl ParamKind for Flag {
        type Value<'a> = bool;
        const KIND: FieldKind = FieldKind::Flag;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<bool, OpError> {
            match r.next(field)? {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(r.invalid(field, "must be 0 or 1")),
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([i64::from(*value)]);
        }
    }

    impl ParamKind for F64 {
        type Value<'a> = f64;
        const KIND: FieldKind = FieldKind::F64;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<f64, OpError> {
            Ok(f64::from_bits(r.next(field)? as u64))
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([crate::params::f64_param(*value)]);
        }
    }

    fn dtype_code(r: &ParamReader<'_, '_>, field: &str, code: i64) -> Result<DType, OpError> {
        DType::from_code(code as i32)
            .ok_or_else(|| r.invalid(field, &format!("unsupported dtype code {code}")))
    }

    impl ParamKind for Dtype {
        type Value<'a> = DType;
        const KIND: FieldKind = FieldKind::Dtype;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<DType, OpError> {
            let code = r.next(field)?;
            dtype_code(r, field, code)
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([value.code() as i64]);
        }
    }

    impl ParamKind for OptDtype {
        type Value<'a> = Option<DType>;
        const KIND: FieldKind = FieldKind::OptDtype;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<Option<DType>, OpError> {
            match r.next(field)? {
                -1 => Ok(None),
                code => dtype_code(r, field, code).map(Some),
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([crate::params::dtype_param(*value)]);
        }
    }

    impl ParamKind for Reduction {
        type Value<'a> = crate::params::Reduction;
        const KIND: FieldKind = FieldKind::Reduction;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<Self::Value<'a>, OpError> {
            match r.next(field)? {
                0 => Ok(crate::params::Reduction::None),
                1 => Ok(crate::params::Reduction::Mean),
                2 => Ok(crate::params::Reduction::Sum),
                _ => Err(r.invalid(field, "reduction must be 0, 1 or 2")),
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([*value as i64]);
        }
    }

    impl ParamKind for Rounding {
        type Value<'a> = RoundingMode;
        const KIND: FieldKind = FieldKind::RoundingMode;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<RoundingMode, OpError> {
            match r.next(field)? {
                0 => Ok(RoundingMode::True),
                1 => Ok(RoundingMode::Trunc),
                2 => Ok(RoundingMode::Floor),
                _ => Err(r.invalid(field, "rounding mode must be 0, 1 or 2")),
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([*value as i64]);
        }
    }

    impl ParamKind for Operand {
        type Value<'a> = OperandKind;
        const KIND: FieldKind = FieldKind::OperandKind;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<OperandKind, OpError> {
            match r.next(field)? {
                0 => Ok(OperandKind::Absent),
                1 => Ok(OperandKind::Tensor),
                2 => Ok(OperandKind::Scalar),
                _ => Err(r.invalid(field, "operand kind must be 0, 1 or 2")),
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([*value as i64]);
        }
    }

    impl ParamKind for OutputMask {
        type Value<'a> = [bool; 3];
        const KIND: FieldKind = FieldKind::OutputMask;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<[bool; 3], OpError> {
            let bits = r.next(field)?;
            if !(0..8).contains(&bits) {
                return Err(r.invalid(field, "the output mask has three bits"));
            }
            Ok([bits & 1 != 0, bits & 2 != 0, bits & 4 != 0])
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([value
                .iter()
                .enumerate()
                .map(|(i, &on)| i64::from(on) << i)
                .sum::<i64>()]);
        }
    }

    impl ParamKind for Ints {
        type Value<'a> = &'a [i64];
        const KIND: FieldKind = FieldKind::Ints;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, _field: &str) -> Result<&'a [i64], OpError> {
            Ok(r.rest())
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend(value.iter().copied());
        }
    }

    impl ParamKind for Counted {
        type Value<'a> = &'a [i64];
        const KIND: FieldKind = FieldKind::Counted;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<&'a [i64], OpError> {
            let n = r.next(field)?;
            r.take(field, n)
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            out.extend([value.len() as i64]);
            out.extend(value.iter().copied());
        }
    }

    impl<K: ParamKind> ParamKind for Opt<K> {
        type Value<'a> = Option<K::Value<'a>>;
        const KIND: FieldKind = K::KIND;
        const OPTIONAL: bool = true;
        fn read<'a>(r: &mut ParamReader<'_, 'a>, field: &str) -> Result<Self::Value<'a>, OpError> {
            if r.is_done() {
                Ok(None)
            } else {
                K::read(r, field).map(Some)
            }
        }

        fn write<E: Extend<i64>>(value: &Self::Value<'_>, out: &mut E) {
            if let Some(value) = value {
                K::write(value, out);
            }
        }
    }
}

/// Reads one field: `$default` when the field may be left out and nothing is left.
macro_rules! read_field {
    ($r:ident, $kind:ty, $field:ident) => {
        <$kind as ParamKind>::read(&mut $r, stringify!($field))
    };
    ($r:ident, $kind:ty, $field:ident, $default:expr) => {
        if $r.is_done() {
            Ok($default)
        } else {
            <$kind as ParamKind>::read(&mut $r, stringify!($field))
        }
    };
}

/// Whether a field was declared with a default.
macro_rules! has_default {
    () => {
        false
    };
    ($default:expr) => {
        true
    };
}

/// A layout as a type: the struct its params decode into, and how that struct encodes.
pub trait LayoutType {
    /// The layout's struct (`()` for `None`).
    type Fields<'a>;
    const LAYOUT: ParamLayout;
    /// Appends the params in the layout's order.
    fn encode_into<E: Extend<i64>>(fields: &Self::Fields<'_>, out: &mut E);
}

macro_rules! param_layouts {
    ($(
        $(#[$doc:meta])*
        $layout:ident { $( $(#[$fdoc:meta])* $field:ident : $kind:ty $(= $default:expr)? ),* $(,)? }
    )*) => {
        /// Every param layout; a catalogue row names one. `None`: the op takes no params.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ParamLayout {
            None,
            $( $layout, )*
        }

        impl ParamLayout {
            /// All layouts, `None` first.
            pub const ALL: &'static [ParamLayout] = &[ParamLayout::None, $(ParamLayout::$layout),*];

            pub fn name(self) -> &'static str {
                match self {
                    ParamLayout::None => "None",
                    $(ParamLayout::$layout => stringify!($layout),)*
                }
            }

            /// The fields, in the order their values come.
            pub fn fields(self) -> &'static [FieldDecl] {
                match self {
                    ParamLayout::None => &[],
                    $(ParamLayout::$layout => {
                        const FIELDS: &[FieldDecl] = &[$(FieldDecl {
                            name: stringify!($field),
                            kind: <$kind as ParamKind>::KIND,
                            optional: <$kind as ParamKind>::OPTIONAL || has_default!($($default)?),
                        }),*];
                        FIELDS
                    })*
                }
            }
        }

        /// Each layout as a type ([`LayoutType`]), for the ops typed by their layout
        /// ([`crate::op_id::typed`]): `of::SliceRange`'s params are a [`SliceRange`].
        pub mod of {
            /// The layout of ops without params.
            pub struct None;
            $( #[doc = concat!("The layout [`", stringify!($layout), "`](super::", stringify!($layout), ").")] pub struct $layout; )*
        }

        impl LayoutType for of::None {
            type Fields<'a> = ();
            const LAYOUT: ParamLayout = ParamLayout::None;
            fn encode_into<E: Extend<i64>>(_fields: &(), _out: &mut E) {}
        }

        $(
            impl LayoutType for of::$layout {
                type Fields<'a> = $layout<'a>;
                const LAYOUT: ParamLayout = ParamLayout::$layout;
                fn encode_into<E: Extend<i64>>(fields: &$layout<'_>, out: &mut E) {
                    fields.encode_into(out);
                }
            }
        )*

        $(
            $(#[$doc])*
            #[derive(Clone, Copy, Debug, PartialEq)]
            pub struct $layout<'a> {
                $( $(#[$fdoc])* pub $field: <$kind as ParamKind>::Value<'a>, )*
            }

            impl<'a> $layout<'a> {
                /// The op's params by name; an error when the op's row names another layout or a
                /// value does not fit its field.
                pub fn decode(params: &Params<'a>) -> Result<Self, OpError> {
                    let mut r = params.reader(ParamLayout::$layout)?;
                    $( let $field = read_field!(r, $kind, $field $(, $default)?)?; )*
                    r.finish()?;
                    Ok($layout { $($field,)* })
                }

                /// Appends the params in the layout's order (what `decode` reads back).
                pub fn encode_into<E: Extend<i64>>(&self, out: &mut E) {
                    $( <$kind as ParamKind>::write(&self.$field, out); )*
                }

                /// The params in the layout's order.
                pub fn encode(&self) -> Vec<i64> {
                    let mut out = Vec::new();
                    self.encode_into(&mut out);
                    out
                }
            }
        )*
    };
}

impl<'a> Params<'a> {
    /// A reader over these params, for the op whose row names `layout`.
    pub fn reader<'p>(&'p self, layout: ParamLayout) -> Result<ParamReader<'p, 'a>, OpError> {
        let declared = self.op().param_layout();
        if declared != layout {
            return Err(OpError::runtime(format!(
                "{}: params read as {} but its catalogue row declares {} (a bug in the op catalogue)",
                self.op().name(),
                layout.name(),
                declared.name()
            )));
        }
        Ok(ParamReader {
            params: self,
            at: 0,
        })
    }
}

impl ParamLayout {
    /// The layout as text, for messages: `[keepdim: flag, dtype: opt_dtype, dims: ints...]`.
    pub fn describe(self) -> String {
        let fields: Vec<String> = self
            .fields()
            .iter()
            .map(|f| {
                format!(
                    "{}{}: {}{}",
                    f.name,
                    if f.optional { "?" } else { "" },
                    f.kind.name(),
                    if f.kind == FieldKind::Ints { "..." } else { "" }
                )
            })
            .collect();
        format!("[{}]", fields.join(", "))
    }

    /// The field that holds param `k` of `params`, walking counted lists by their counts; a
    /// trailing `ints` list holds every param from its start.
    pub fn field_at(self, params: &[i64], k: usize) -> Option<&'static FieldDecl> {
        let mut at = 0usize;
        for field in self.fields() {
            let width = match field.kind {
                FieldKind::Ints => return Some(field),
                FieldKind::Counted => 1 + usize::try_from(*params.get(at)?).ok()?,
                _ => 1,
            };
            if k < at + width {
                return Some(field);
            }
            at += width;
        }
        None
    }
}

use kind::*;

param_layouts! {
    // ---- elementwise -------------------------------------------------------------------
    /// `gelu` and its gradient: 0 = exact, 1 = the tanh approximation.
    GeluApproximate { approximate: Int = 0 }
    /// `round` to a number of decimal places.
    RoundDecimals { decimals: Int = 0 }
    /// Which replacements were given (bits 1 = nan, 2 = posinf, 4 = neginf) and their values;
    /// one not given is PyTorch's default (0 for NaN, the dtype's max and min for infinities).
    NanToNum { given: Int = 0, nan: F64 = 0.0, posinf: F64 = 0.0, neginf: F64 = 0.0 }
    DivRounding { rounding_mode: Rounding = RoundingMode::True }
    /// Where `where`'s `self` and `other` come from; left out, from the tensor inputs.
    WhereOperands { self_kind: Opt<Operand>, other_kind: Opt<Operand> }
    ClampBounds { min_kind: Operand = OperandKind::Absent, max_kind: Operand = OperandKind::Absent }

    // ---- casts and creation ------------------------------------------------------------
    ConvertTo { dtype: Dtype }
    /// A new tensor of `sizes` (a creation op or a random draw).
    Creation { dtype: Dtype, sizes: Ints }
    ArangeRange { dtype: Dtype, start: F64, end: F64, step: F64 }
    LinspaceSteps { dtype: Dtype, steps: Int }
    EyeSizes { dtype: Dtype, n: Int, m: Int }
    /// With `full_range`, the draw covers `[0, 2^63)` and ignores `to`.
    RandomIntDraw { dtype: Dtype, full_range: Flag, sizes: Ints }
    DropoutTrain { train: Flag }

    // ---- reductions and scans (an empty dim list = every dim) -----------------------------
    ReduceDims { keepdim: Flag, dims: Ints }
    ReduceDtypeDims { keepdim: Flag, dtype: OptDtype, dims: Ints }
    ReduceCorrectionDims { keepdim: Flag, correction: F64, dims: Ints }
    VectorNorm { keepdim: Flag, dtype: OptDtype, ord: F64, dims: Ints }
    /// No dim: over the flattened tensor.
    ArgReduce { keepdim: Flag, dim: Opt<Int> }
    SoftmaxDim { dim: Int, half_to_float: Flag = false }
    DimDtype { dim: Int, dtype: OptDtype }
    Invert { invert: Flag }

    // ---- products ----------------------------------------------------------------------
    SolveTriangular { upper: Flag, left: Flag, unitriangular: Flag }
    /// `scale` is read only when `has_scale`; without it the scale is `1/sqrt(E)`.
    Attention { is_causal: Flag, has_attn_bias: Flag, has_scale: Flag, scale: F64 }
    /// As `Attention`; `bias_grad`: the mask's gradient is computed too.
    AttentionBackward { is_causal: Flag, has_attn_bias: Flag, has_scale: Flag, scale: F64, bias_grad: Flag }
    Cholesky { upper: Flag }
    LuFactor { pivot: Flag }
    /// The permutation's length: the factored matrices' rows.
    LuPermutation { rows: Int }
    /// 0 = "reduced", 1 = "complete", 2 = "r".
    Qr { mode: Int }
    Eigh { upper: Flag, compute_v: Flag }
    Svd { full_matrices: Flag, compute_uv: Flag }

    // ---- shapes and indexing -----------------------------------------------------------
    Dim { dim: Int }
    Dims { dims: Ints }
    /// Sizes of a result (`-1` keeps or infers a size, as the op says).
    Sizes { sizes: Ints }
    Repeats { repeats: Ints }
    /// No dims: roll the flattened tensor.
    RollShifts { shifts: Counted, dims: Ints }
    /// `(low, high)` pairs from the last dim backwards; a negative width crops.
    PadWidths { pad: Ints }
    Diagonal { diagonal: Int = 0 }
    /// `combiner`: 1 = prod, 2 = amax, 3 = amin.
    ScatterCombine { dim: Int, combiner: Int }
    TransposeDims { dim0: Int, dim1: Int }
    /// `start` and `end` are clamped like Python's.
    SliceRange { dim: Int, start: Int, end: Int, step: Int }
    SelectIndex { dim: Int, index: Int }
    SortDim { dim: Int, descending: Flag }
    TopK { k: Int, dim: Int, largest: Flag, sorted: Flag }
    /// A result size read to the host first.
    Count { count: Int }
    /// The dim each index tensor selects along.
    IndexedDims { indexed_dims: Ints }
    /// `accumulate`: 0 = assign, 1 = add, 2 = add with `index_add`'s errors.
    IndexPutDims { accumulate: Int, indexed_dims: Ints }
    /// `size` is the extent indexed; `style` an [`crate::checks::IndexStyle`]; an index equal
    /// to `ignore` is never reported.
    IndexBounds { size: Int, negative_ok: Flag, dim: Int, style: Int, ignore: Opt<Int> }

    // ---- gradients and losses ----------------------------------------------------------
    SoftmaxBackwardDim { dim: Int, input_dtype: Dtype }
    EmbeddingBackward { num_weights: Int, padding_idx: Int, scale_grad_by_freq: Flag }
    LossReduction { reduction: Reduction }
    NllLossReduction { reduction: Reduction, ignore_index: Int }

    // ---- convolution and pooling (PyTorch has expanded each list per spatial dim, or left
    // a list of one) ---------------------------------------------------------------------
    Convolution {
        transposed: Flag, groups: Int,
        stride: Counted, padding: Counted, dilation: Counted, output_padding: Counted,
    }
    ConvolutionBackward {
        output_mask: OutputMask, transposed: Flag, groups: Int,
        stride: Counted, padding: Counted, dilation: Counted, output_padding: Counted,
    }
    /// An empty `stride` is `kernel_size`.
    MaxPool { ceil_mode: Flag, kernel_size: Counted, stride: Counted, padding: Counted, dilation: Counted }
    /// An empty `stride` is `kernel_size`.
    AvgPool {
        ceil_mode: Flag, count_include_pad: Flag,
        kernel_size: Counted, stride: Counted, padding: Counted, divisor_override: Opt<Int>,
    }
    AdaptiveOutputSize { output_size: Ints }

    // ---- normalization (presence flags place the optional inputs) --------------------------
    BatchNorm { has_weight: Flag, has_bias: Flag, has_running_mean: Flag, has_running_var: Flag, training: Flag, eps: F64 }
    BatchNormBackward {
        has_weight: Flag, has_running_mean: Flag, has_running_var: Flag, has_save_mean: Flag,
        has_save_invstd: Flag, train: Flag, eps: F64, output_mask: OutputMask,
    }
    LayerNorm { has_weight: Flag, has_bias: Flag, eps: F64, normalized_shape: Ints }
    LayerNormBackward { has_weight: Flag, has_bias: Flag, output_mask: OutputMask, normalized_shape: Ints }
    /// `n`, `c`, `hxw`: the input's batch, channels and spatial size.
    GroupNorm { has_weight: Flag, has_bias: Flag, n: Int, c: Int, hxw: Int, group: Int, eps: F64 }
    GroupNormBackward { has_weight: Flag, n: Int, c: Int, hxw: Int, group: Int, output_mask: OutputMask }

    // ---- fused optimizer steps ---------------------------------------------------------
    FusedAdamFlags {
        amsgrad: Flag, maximize: Flag, adamw: Flag, lr_is_tensor: Flag, has_found_inf: Flag,
        /// `weight_decay != 0`.
        weight_decay: Flag,
        /// `|1 - beta1| < 0.5`: the first moment is updated as a lerp with a small weight.
        small_lerp_weight: Flag,
    }
    FusedSgdFlags {
        nesterov: Flag, maximize: Flag, is_first_step: Flag, has_momentum_buffer: Flag,
        lr_is_tensor: Flag, has_found_inf: Flag,
        /// `weight_decay != 0`.
        weight_decay: Flag,
    }

    // ---- discrete Fourier transforms (`normalization`: 0 = none, 1 = by 1/sqrt(n), 2 = by 1/n)
    FftC2c { normalization: Int, forward: Flag, dims: Ints }
    FftR2c { normalization: Int, onesided: Flag, dims: Ints }
    FftC2r { normalization: Int, last_dim_size: Int, dims: Ints }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpId;

    #[test]
    fn optional_fields_and_open_lists_come_last() {
        for &layout in ParamLayout::ALL {
            let fields = layout.fields();
            for (i, field) in fields.iter().enumerate() {
                let later = &fields[i + 1..];
                if field.optional {
                    assert!(
                        later.iter().all(|f| f.optional),
                        "{}: {} may be left out, but a later field may not",
                        layout.name(),
                        field.name
                    );
                }
                if field.kind == FieldKind::Ints {
                    assert!(
                        later.is_empty(),
                        "{}: {} takes every value left, so it must end the layout",
                        layout.name(),
                        field.name
                    );
                }
                assert!(
                    !fields[..i].iter().any(|f| f.name == field.name),
                    "{}: {} is declared twice",
                    layout.name(),
                    field.name
                );
            }
        }
    }

    #[test]
    fn every_layout_is_named_by_a_row() {
        for &layout in ParamLayout::ALL {
            assert!(
                OpId::ALL.iter().any(|op| op.param_layout() == layout),
                "no catalogue row names {}",
                layout.name()
            );
        }
    }

    #[test]
    fn a_typed_op_is_an_op_of_its_layout() {
        assert_eq!(
            crate::TypedOp::<of::Count>::of(OpId::Nonzero).map(|t| t.op()),
            Some(OpId::Nonzero)
        );
        assert!(crate::TypedOp::<of::Count>::of(OpId::Slice).is_none());
        assert!(crate::TypedOp::<of::None>::of(OpId::Neg).is_some());
        // What a typed op encodes, its op's row decodes.
        let zeros = crate::typed::Zeros.encode(Creation {
            dtype: DType::F32,
            sizes: &[2, 3],
        });
        assert_eq!(zeros.op, OpId::Zeros);
        let p = Params::new(zeros.op, &zeros.params);
        assert_eq!(Creation::decode(&p).unwrap().sizes, &[2, 3]);
        assert!(crate::typed::Clone.encode(()).params.is_empty());
    }

    #[test]
    fn a_layout_reads_back_what_it_writes() {
        let conv = Convolution {
            transposed: true,
            groups: 2,
            stride: &[1, 2],
            padding: &[0, 1],
            dilation: &[1],
            output_padding: &[0, 0],
        };
        let encoded = conv.encode();
        assert_eq!(encoded, [1, 2, 2, 1, 2, 2, 0, 1, 1, 1, 2, 0, 0]);
        let params = Params::new(OpId::Convolution, &encoded);
        assert_eq!(Convolution::decode(&params).unwrap(), conv);

        let norm = VectorNorm {
            keepdim: false,
            dtype: Some(DType::F64),
            ord: f64::NEG_INFINITY,
            dims: &[-1],
        };
        let encoded = norm.encode();
        assert_eq!(
            VectorNorm::decode(&Params::new(OpId::Norm, &encoded)).unwrap(),
            norm
        );

        // A field left out reads as its default or None, and is not written when None.
        let argmax = ArgReduce::decode(&Params::new(OpId::Argmax, &[1])).unwrap();
        assert_eq!((argmax.keepdim, argmax.dim), (true, None));
        assert_eq!(argmax.encode(), [1]);
        let div = DivRounding::decode(&Params::new(OpId::Div, &[])).unwrap();
        assert_eq!(div.rounding_mode, RoundingMode::True);
    }

    #[test]
    fn a_misread_is_an_error_that_names_the_layout() {
        // Another op's layout.
        let e = ReduceDims::decode(&Params::new(OpId::Sum, &[0, -1])).unwrap_err();
        assert!(
            e.message.contains(
                "params read as ReduceDims but its catalogue row declares ReduceDtypeDims"
            ),
            "{}",
            e.message
        );
        // A value its kind refuses, too few values, too many.
        let e = ReduceDims::decode(&Params::new(OpId::Amax, &[2])).unwrap_err();
        assert!(
            e.message.contains("keepdim: must be 0 or 1"),
            "{}",
            e.message
        );
        assert!(e
            .message
            .contains("expected the layout [keepdim: flag, dims: ints...]"));
        let e = SliceRange::decode(&Params::new(OpId::Slice, &[0, 1, 2])).unwrap_err();
        assert!(e.message.contains("missing step"), "{}", e.message);
        let e = Dim::decode(&Params::new(OpId::Cat, &[0, 1])).unwrap_err();
        assert!(
            e.message.contains("params left after the last field"),
            "{}",
            e.message
        );
        let e = MaxPool::decode(&Params::new(OpId::MaxPool2dWithIndices, &[0, 3, 2])).unwrap_err();
        assert!(
            e.message
                .contains("kernel_size: a counted list runs past the end"),
            "{}",
            e.message
        );
    }

    #[test]
    fn field_at_walks_counted_lists() {
        let params = [0, 2, 3, 3, 0, 1, 1, 1, 1];
        let layout = OpId::MaxPool2dWithIndices.param_layout();
        let names: Vec<&str> = (0..params.len())
            .map(|k| layout.field_at(&params, k).map_or("-", |f| f.name))
            .collect();
        assert_eq!(
            names,
            [
                "ceil_mode",
                "kernel_size",
                "kernel_size",
                "kernel_size",
                "stride",
                "padding",
                "padding",
                "dilation",
                "dilation"
            ]
        );
        let sum = OpId::Sum.param_layout();
        assert_eq!(sum.field_at(&[0, -1, 1, 2], 3).unwrap().name, "dims");
        assert!(ParamLayout::None.field_at(&[1], 0).is_none());
    }
}
