//! First end-to-end check: an add in each mode.
mod common;
use common::*;
use defer::Mode;
use ops::OpId;

#[test]
fn add_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let a = upload_f32(&e, &[1., 2., 3.], &[3]);
        let b = upload_f32(&e, &[10., 20., 30.], &[3]);
        let c = op(&e, OpId::Add, &[&a, &b], &[], &[]);
        let d = op(&e, OpId::Mul, &[&c, &a], &[], &[]);
        assert_eq!(read_f32(&e, &d), vec![11., 44., 99.], "{mode:?}");
        println!("{mode:?}: {}", e.metrics().report());
    }
}
