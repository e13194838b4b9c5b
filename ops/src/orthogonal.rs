//! The classical orthogonal polynomials of `torch.special` (Chebyshev's four kinds and their
//! shifted forms, Hermite's two, Laguerre's and Legendre's) at a tensor of points and degrees:
//! each by its three-term recurrence, all elements in one `stablehlo.while` that runs to the
//! largest degree, an element's value held once its own degree is reached.

use crate::dtype::{DType, ScalarValue, TensorType};
use crate::emitter::{Cmp, Emitter, Value};
use crate::OpId;

/// The ops computed here.
pub(crate) fn is_orthogonal_polynomial(op: OpId) -> bool {
    use OpId::*;
    matches!(
        op,
        SpecialChebyshevPolynomialT
            | SpecialChebyshevPolynomialU
            | SpecialChebyshevPolynomialV
            | SpecialChebyshevPolynomialW
            | SpecialShiftedChebyshevPolynomialT
            | SpecialShiftedChebyshevPolynomialU
            | SpecialShiftedChebyshevPolynomialV
            | SpecialShiftedChebyshevPolynomialW
            | SpecialHermitePolynomialH
            | SpecialHermitePolynomialHe
            | SpecialLaguerrePolynomialL
            | SpecialLegendrePolynomialP
    )
}

/// The recurrences' families: Chebyshev's share `P_{k+1} = 2x P_k - P_{k-1}` and differ in
/// `P_1`.
#[derive(Clone, Copy, PartialEq)]
enum Family {
    /// `P_1 = 2x + c`: T (`x`, handled apart), U (0), V (-1), W (+1).
    Chebyshev,
    Hermite,
    HermiteProbabilists,
    Laguerre,
    Legendre,
}

fn constant_like(e: &mut Emitter, v: Value, value: f64) -> Value {
    e.full_like(v, value)
}

/// `op` of `x` at degrees `n` (both already in the result's float dtype and shape). Degrees are
/// truncated to integers as PyTorch's kernels cast them; a negative (or NaN) degree gives 0.
pub(crate) fn orthogonal_polynomial(e: &mut Emitter, op: OpId, x: Value, n: Value) -> Value {
    // float32 recurs in float64: near the ends of [-1, 1] the recurrences lose about n^2 ulps,
    // where PyTorch's kernels switch to trigonometric forms accurate to a few.
    let dtype = e.dtype(x);
    if dtype == DType::F32 {
        let x = e.convert(x, DType::F64);
        let n = e.convert(n, DType::F64);
        let value = orthogonal_polynomial(e, op, x, n);
        return e.convert(value, DType::F32);
    }
    use OpId::*;
    let shifted = matches!(
        op,
        SpecialShiftedChebyshevPolynomialT
            | SpecialShiftedChebyshevPolynomialU
            | SpecialShiftedChebyshevPolynomialV
            | SpecialShiftedChebyshevPolynomialW
    );
    // The shifted polynomials are the plain ones at 2x - 1, on [0, 1].
    let x = if shifted {
        let twice = e.add(x, x);
        let one = constant_like(e, x, 1.0);
        e.sub(twice, one)
    } else {
        x
    };
    let family = match op {
        SpecialHermitePolynomialH => Family::Hermite,
        SpecialHermitePolynomialHe => Family::HermiteProbabilists,
        SpecialLaguerrePolynomialL => Family::Laguerre,
        SpecialLegendrePolynomialP => Family::Legendre,
        _ => Family::Chebyshev,
    };
    let one = constant_like(e, x, 1.0);
    let twice_x = e.add(x, x);
    let first = match op {
        SpecialChebyshevPolynomialT | SpecialShiftedChebyshevPolynomialT => x,
        SpecialChebyshevPolynomialU | SpecialShiftedChebyshevPolynomialU => twice_x,
        SpecialChebyshevPolynomialV | SpecialShiftedChebyshevPolynomialV => e.sub(twice_x, one),
        SpecialChebyshevPolynomialW | SpecialShiftedChebyshevPolynomialW => e.add(twice_x, one),
        SpecialHermitePolynomialH => twice_x,
        SpecialLaguerrePolynomialL => e.sub(one, x),
        _ => x,
    };
    let degree = e.unary("stablehlo.floor", n);
    let ceiling = e.unary("stablehlo.ceil", n);
    let negative = e.compare_const(Cmp::Lt, n, 0.0);
    let degree = e.select(negative, ceiling, degree);
    // A NaN degree counts as negative, and stays out of the loop's bound.
    let nan = e.compare(Cmp::Ne, n, n);
    let minus_one = constant_like(e, n, -1.0);
    let degree = e.select(nan, minus_one, degree);
    // The loop runs to the largest degree (at least 1, where it runs no step).
    let scalar = TensorType::scalar(dtype);
    let floor = e.constant(scalar.clone(), ScalarValue::Float(1.0));
    let all: Vec<usize> = (0..e.rank(degree)).collect();
    let largest = e.reduce_with(degree, f64::NEG_INFINITY, &all, "stablehlo.maximum");
    let largest = e.max(largest, floor);
    let counter = e.constant(scalar, ScalarValue::Float(1.0));
    let shape = e.shape(x).to_vec();
    let carried = e.while_loop(
        &[counter, one, first, largest, x, degree],
        |e, v| e.compare(Cmp::Lt, v[0], v[3]),
        |e, v| {
            let (k, previous, current, largest, x, degree) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            let k_all = e.broadcast_in_dim(k, &shape, &[]);
            let next = recurrence_step(e, family, x, k_all, previous, current);
            let active = e.compare(Cmp::Lt, k_all, degree);
            let previous = e.select(active, current, previous);
            let current = e.select(active, next, current);
            let one = e.full_like(k, 1.0);
            let k = e.add(k, one);
            vec![k, previous, current, largest, x, degree]
        },
    );
    let value = carried[2];
    let zero_degree = e.compare_const(Cmp::Eq, degree, 0.0);
    let value = e.select(zero_degree, one, value);
    let valid = e.compare_const(Cmp::Ge, degree, 0.0);
    let zero = constant_like(e, x, 0.0);
    e.select(valid, value, zero)
}

/// `P_{k+1}` from `P_k` (`current`), `P_{k-1}` (`previous`), the point and `k`.
fn recurrence_step(
    e: &mut Emitter,
    family: Family,
    x: Value,
    k: Value,
    previous: Value,
    current: Value,
) -> Value {
    match family {
        Family::Chebyshev => {
            let twice_x = e.add(x, x);
            let product = e.mul(twice_x, current);
            e.sub(product, previous)
        }
        Family::Hermite => {
            let twice_x = e.add(x, x);
            let product = e.mul(twice_x, current);
            let twice_k = e.add(k, k);
            let back = e.mul(twice_k, previous);
            e.sub(product, back)
        }
        Family::HermiteProbabilists => {
            let product = e.mul(x, current);
            let back = e.mul(k, previous);
            e.sub(product, back)
        }
        // ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1)
        Family::Laguerre => normalized_step(e, k, previous, current, |e, odd| e.sub(odd, x)),
        // ((2k + 1) x P_k - k P_{k-1}) / (k + 1)
        Family::Legendre => normalized_step(e, k, previous, current, |e, odd| e.mul(odd, x)),
    }
}

/// `(f(2k + 1) P_k - k P_{k-1}) / (k + 1)`, the shape of Laguerre's and Legendre's recurrences.
fn normalized_step(
    e: &mut Emitter,
    k: Value,
    previous: Value,
    current: Value,
    factor: impl FnOnce(&mut Emitter, Value) -> Value,
) -> Value {
    let one = e.full_like(k, 1.0);
    let odd = e.add(k, k);
    let odd = e.add(odd, one);
    let factor = factor(e, odd);
    let product = e.mul(factor, current);
    let back = e.mul(k, previous);
    let numerator = e.sub(product, back);
    let next_k = e.add(k, one);
    e.div(numerator, next_k)
}
