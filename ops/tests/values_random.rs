//! Random-number ops on the XLA CPU PJRT plugin: ranges, moments, reproducibility by key, and
//! dropout's mask and scaling.

mod common;

use common::*;
use ops::{DType, OpId, ScalarArg};

const N: i64 = 8192;

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn std(xs: &[f64]) -> f64 {
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

fn draw(op: OpId, dtype: DType, scalars: Vec<ScalarArg>, extra: &[i64]) -> Case {
    let mut params = vec![dtype.code() as i64];
    params.extend_from_slice(extra);
    params.push(N);
    Case::new(op, vec![], scalars, params)
}

fn uniform(dtype: DType, from: f64, to: f64, key: i64) -> Case {
    draw(
        OpId::Uniform,
        dtype,
        vec![
            ScalarArg::float(from),
            ScalarArg::float(to),
            ScalarArg::int(key),
        ],
        &[],
    )
}

fn normal(dtype: DType, m: f64, s: f64, key: i64) -> Case {
    draw(
        OpId::Normal,
        dtype,
        vec![
            ScalarArg::float(m),
            ScalarArg::float(s),
            ScalarArg::int(key),
        ],
        &[],
    )
}

#[test]
fn uniform_and_normal_draws_have_their_ranges_and_moments() {
    let cases = vec![
        uniform(DType::F32, -2.0, 3.0, 7),
        uniform(DType::F32, -2.0, 3.0, 7),
        uniform(DType::F32, -2.0, 3.0, 8),
        uniform(DType::F64, 0.0, 1.0, 9),
        uniform(DType::BF16, 0.0, 1.0, 10),
        normal(DType::F32, 1.0, 2.0, 11),
        normal(DType::F64, -3.0, 0.5, 12),
    ];
    let out = run_batch(&cases);
    let values = |i: usize| out[i][0].data.clone();

    let u = values(0);
    assert!(u.iter().all(|&x| (-2.0..3.0).contains(&x)), "uniform range");
    // The mean of 8192 draws of U(-2, 3) is 0.5 with a standard error of 0.016.
    assert!((mean(&u) - 0.5).abs() < 0.08, "uniform mean {}", mean(&u));
    assert!(
        (std(&u) - 5.0 / 12f64.sqrt()).abs() < 0.05,
        "uniform std {}",
        std(&u)
    );
    assert_eq!(values(1), u, "one key, one draw");
    assert_ne!(values(2), u, "another key, another draw");
    let differing = u.iter().zip(values(2)).filter(|(a, b)| *a != b).count();
    assert!(
        differing > N as usize * 9 / 10,
        "draws of two keys are unrelated"
    );

    let u64s = values(3);
    assert!(u64s.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert!((mean(&u64s) - 0.5).abs() < 0.02);
    // f64 draws keep 53 bits: far more distinct values than f32's 2^24 grid would allow here.
    let distinct: std::collections::BTreeSet<u64> = u64s.iter().map(|x| x.to_bits()).collect();
    assert_eq!(distinct.len(), u64s.len());

    let bf = values(4);
    assert!(bf.iter().all(|&x| (0.0..=1.0).contains(&x)));
    assert!((mean(&bf) - 0.5).abs() < 0.02);

    let z = values(5);
    assert!((mean(&z) - 1.0).abs() < 0.1, "normal mean {}", mean(&z));
    assert!((std(&z) - 2.0).abs() < 0.1, "normal std {}", std(&z));
    // Tails: about 4.6% of normal draws lie beyond two standard deviations.
    let tails = z.iter().filter(|&&x| (x - 1.0).abs() > 4.0).count() as f64 / N as f64;
    assert!((0.03..0.065).contains(&tails), "normal tails {tails}");
    let z64 = values(6);
    assert!((mean(&z64) + 3.0).abs() < 0.03);
    assert!((std(&z64) - 0.5).abs() < 0.03);
}

#[test]
fn integer_and_bernoulli_draws() {
    let probs: Vec<f64> = (0..N).map(|i| if i < N / 2 { 0.0 } else { 1.0 }).collect();
    let cases = vec![
        draw(
            OpId::RandomInt,
            DType::I64,
            vec![ScalarArg::int(-3), ScalarArg::int(5), ScalarArg::int(1)],
            &[0],
        ),
        draw(
            OpId::RandomInt,
            DType::I64,
            vec![ScalarArg::int(0), ScalarArg::int(0), ScalarArg::int(2)],
            &[1],
        ),
        draw(
            OpId::RandomInt,
            DType::U8,
            vec![ScalarArg::int(0), ScalarArg::int(256), ScalarArg::int(3)],
            &[0],
        ),
        draw(
            OpId::Bernoulli,
            DType::F32,
            vec![ScalarArg::float(0.3), ScalarArg::int(4)],
            &[],
        ),
        Case::new(
            OpId::Bernoulli,
            vec![Host::new(DType::F32, &[N], &probs)],
            vec![ScalarArg::int(5)],
            vec![DType::Bool.code() as i64, N],
        ),
    ];
    let out = run_batch(&cases);

    let ints = &out[0][0].data;
    assert!(ints
        .iter()
        .all(|&x| x.fract() == 0.0 && (-3.0..5.0).contains(&x)));
    for v in -3..5 {
        let share = ints.iter().filter(|&&x| x == v as f64).count() as f64 / N as f64;
        assert!((share - 0.125).abs() < 0.03, "value {v}: share {share}");
    }
    // The full 63-bit range: non-negative, and spread over it (half above 2^62).
    let full = &out[1][0].data;
    assert!(full.iter().all(|&x| x >= 0.0));
    let high = full.iter().filter(|&&x| x >= 2f64.powi(62)).count() as f64 / N as f64;
    assert!((high - 0.5).abs() < 0.05, "{high}");
    let bytes = &out[2][0].data;
    let distinct: std::collections::BTreeSet<i64> = bytes.iter().map(|&x| x as i64).collect();
    assert_eq!(distinct.len(), 256, "every byte value appears");

    let coin = &out[3][0].data;
    assert!(coin.iter().all(|&x| x == 0.0 || x == 1.0));
    assert!((mean(coin) - 0.3).abs() < 0.03, "{}", mean(coin));
    let exact = &out[4][0].data;
    assert_eq!(exact, &probs, "p = 0 never draws, p = 1 always");
}

#[test]
fn dropout_masks_scales_and_backward() {
    let x = Host::random(DType::F32, &[N], 0.5, 1.5, 3);
    let grad = Host::random(DType::F32, &[N], -1.0, 1.0, 4);
    let cases = vec![
        Case::new(
            OpId::NativeDropout,
            vec![x.clone()],
            vec![ScalarArg::float(0.25), ScalarArg::int(6)],
            vec![1],
        ),
        Case::new(
            OpId::NativeDropout,
            vec![x.clone()],
            vec![ScalarArg::float(0.25), ScalarArg::int(6)],
            vec![0],
        ),
        Case::new(
            OpId::NativeDropout,
            vec![x.clone()],
            vec![ScalarArg::float(1.0), ScalarArg::int(7)],
            vec![1],
        ),
    ];
    let out = run_batch(&cases);
    let (y, mask) = (&out[0][0].data, &out[0][1].data);
    let kept = mean(mask);
    assert!((kept - 0.75).abs() < 0.03, "kept {kept}");
    for i in 0..N as usize {
        let want = if mask[i] != 0.0 {
            x.data[i] / 0.75
        } else {
            0.0
        };
        assert!(
            (y[i] - want).abs() <= 1e-6 * want.abs(),
            "{i}: {} vs {want}",
            y[i]
        );
    }
    assert_eq!(out[1][0].data, x.data, "eval mode is the identity");
    assert!(out[1][1].data.iter().all(|&m| m == 1.0));
    assert!(out[2][0].data.iter().all(|&v| v == 0.0), "p = 1 drops all");
    assert!(out[2][1].data.iter().all(|&m| m == 0.0));

    let mask_host = Host::new(DType::Bool, &[N], mask);
    let back = run_batch(&[Case::new(
        OpId::NativeDropoutBackward,
        vec![grad.clone(), mask_host],
        vec![ScalarArg::float(1.0 / 0.75)],
        vec![],
    )]);
    for ((got, g), m) in back[0][0].data.iter().zip(&grad.data).zip(mask) {
        let want = g * m / 0.75;
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-30));
    }
}

#[test]
fn bad_arguments_raise_pytorchs_errors() {
    let err = |op, inputs: &[ops::TensorType], scalars: &[ScalarArg], params: &[i64]| {
        ops::meta(op, inputs, scalars, params)
            .expect_err("an error")
            .to_string()
    };
    let f32 = DType::F32.code() as i64;
    let i64c = DType::I64.code() as i64;
    let key = ScalarArg::int(0);
    assert!(err(
        OpId::Uniform,
        &[],
        &[ScalarArg::float(2.0), ScalarArg::float(1.0), key],
        &[f32, 3]
    )
    .contains("uniform_ expects to return a [from, to) range, but found from=2 > to=1"));
    assert!(err(
        OpId::Uniform,
        &[],
        &[ScalarArg::float(0.0), ScalarArg::float(1.0), key],
        &[i64c, 3]
    )
    .contains("\"check_uniform_bounds\" not implemented for 'Long'"));
    assert!(err(
        OpId::Normal,
        &[],
        &[ScalarArg::float(0.0), ScalarArg::float(-1.0), key],
        &[f32, 3]
    )
    .contains("normal expects std >= 0.0, but found std -1"));
    assert!(err(
        OpId::RandomInt,
        &[],
        &[ScalarArg::int(5), ScalarArg::int(5), key],
        &[i64c, 0, 3]
    )
    .contains("random_ expects 'from' to be less than 'to', but got from=5 >= to=5"));
    assert!(err(
        OpId::Bernoulli,
        &[],
        &[ScalarArg::float(1.5), key],
        &[f32, 3]
    )
    .contains("bernoulli_ expects p to be in [0, 1], but got p=1.5"));
    assert!(err(
        OpId::NativeDropout,
        &[ops::TensorType::new(DType::F32, &[3])],
        &[ScalarArg::float(-0.5), key],
        &[1]
    )
    .contains("dropout probability has to be between 0 and 1, but got -0.5"));
}

/// The counter hash behind every draw: flat over 64 bins, no correlation between neighbouring
/// elements of one draw or between the same element of draws with consecutive keys (a counter
/// and a key that differ by one must give unrelated words).
#[test]
fn draws_are_flat_and_uncorrelated_across_elements_and_keys() {
    let cases: Vec<Case> = (0..3)
        .map(|key| uniform(DType::F64, 0.0, 1.0, 1000 + key))
        .collect();
    let out = run_batch(&cases);
    let draws: Vec<&Vec<f64>> = out.iter().map(|o| &o[0].data).collect();
    let correlation = |a: &[f64], b: &[f64]| {
        let (ma, mb) = (mean(a), mean(b));
        let cov: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - ma) * (y - mb))
            .sum::<f64>();
        cov / ((a.len() - 1) as f64 * std(a) * std(b))
    };
    // For N = 8192 independent pairs the correlation's standard deviation is about 0.011.
    let limit = 0.045;
    for d in &draws {
        let r = correlation(&d[..d.len() - 1], &d[1..]);
        assert!(r.abs() < limit, "neighbouring elements correlate: {r}");
        let mut bins = [0usize; 64];
        for &x in d.iter() {
            bins[(x * 64.0) as usize] += 1;
        }
        let expected = N as f64 / 64.0;
        let chi2: f64 = bins
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // 63 degrees of freedom: above 110 happens with probability below 2e-4.
        assert!(chi2 < 110.0, "bins are not flat: chi2 {chi2}");
    }
    for pair in draws.windows(2) {
        let r = correlation(pair[0], pair[1]);
        assert!(r.abs() < limit, "draws of consecutive keys correlate: {r}");
    }
    assert_ne!(draws[0], draws[1]);
}
