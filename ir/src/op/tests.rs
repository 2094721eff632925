//! Inference of ops' shapes and dtypes, on small cases.
use super::*;

#[test]
fn matmul_infers_batched_shapes() {
    let a = Shape::from([2, 3, 4]);
    let b = Shape::from([2, 4, 5]);
    let (s, d) = Op::MatMul.infer(&[(&a, DType::F32), (&b, DType::F32)]).unwrap();
    assert_eq!((s, d), (Shape::from([2, 3, 5]), DType::F32));
    let bad = Shape::from([2, 5, 5]);
    let err = Op::MatMul.infer(&[(&a, DType::F32), (&bad, DType::F32)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "matmul: shapes [2, 3, 4] and [2, 5, 5] are not compatible: 4 != 5"
    );
}

#[test]
fn comparisons_give_bool_and_arithmetic_rejects_it() {
    let s = Shape::from([3]);
    let (_, d) = Op::Binary(BinaryOp::Lt).infer(&[(&s, DType::I32), (&s, DType::I32)]).unwrap();
    assert_eq!(d, DType::Bool);
    let err = Op::Binary(BinaryOp::Add).infer(&[(&s, DType::Bool), (&s, DType::Bool)]).unwrap_err();
    assert_eq!(err.to_string(), "add: is not defined for bool inputs");
    assert!(Op::Unary(UnaryOp::Exp).infer(&[(&s, DType::I64)]).is_err());
}

#[test]
fn reductions_keep_reduced_axes() {
    let s = Shape::from([2, 3, 4]);
    let op = Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 2] };
    assert_eq!(op.infer(&[(&s, DType::F64)]).unwrap().0, Shape::from([1, 3, 1]));
    let argmax = Op::Reduce { op: ReduceOp::ArgMax, axes: vec![1] };
    assert_eq!(argmax.infer(&[(&s, DType::F16)]).unwrap(), (Shape::from([2, 1, 4]), DType::I64));
}
