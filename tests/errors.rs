//! Every mistake gives an error naming the op and the shapes or dtypes, at the line that
//! made it, and the panicking forms panic with the same message.

use kiln::prelude::*;

fn message(r: kiln::Result<Tensor>) -> String {
    r.expect_err("the call should fail").to_string()
}

#[test]
fn shape_mistakes_name_the_op_and_shapes() {
    let a = Tensor::zeros([2, 3]);
    let b = Tensor::zeros([4, 3]);
    assert_eq!(
        message(a.try_add(&b)),
        "add: shapes [2, 3] and [4, 3] cannot be broadcast together: dimension 0 of the result would need 2 and 4 to agree (sizes must be equal, or one of them 1)"
    );
    assert_eq!(
        message(a.try_matmul(&b)),
        "matmul: shapes [2, 3] and [4, 3] are not compatible: 3 != 4"
    );
    assert_eq!(
        message(Tensor::zeros([2, 2, 3]).try_matmul(&Tensor::zeros([3, 3, 2]))),
        "matmul: batch dimensions [2] and [3] of shapes [2, 2, 3] and [3, 3, 2] cannot be broadcast together"
    );
    assert!(
        message(Tensor::scalar(1.0f32).try_matmul(&a))
            .starts_with("matmul: both operands need at least one dimension")
    );
    assert!(
        message(a.try_mm(&Tensor::zeros([3])))
            .starts_with("mm: expects two tensors of rank 2, got shapes [2, 3] and [3]")
    );
    assert!(
        message(Tensor::zeros([2, 3, 4]).try_bmm(&Tensor::zeros([3, 4, 5])))
            .starts_with("bmm: batch sizes differ")
    );
    assert_eq!(
        message(a.try_reshape(&[4, -1])),
        "reshape: shape [4, -1] is invalid for a tensor of shape [2, 3] (6 elements)"
    );
    assert_eq!(
        message(a.try_view(&[5])),
        "view: shape [5] has 5 elements but the tensor of shape [2, 3] has 6"
    );
    assert_eq!(message(a.try_view(&[-1, -1])), "view: only one dimension can be -1, got [-1, -1]");
    assert_eq!(
        message(a.t().try_view(&[6])),
        "view: a tensor of shape [3, 2] with strides [1, 3] cannot be viewed as [6] without copying; use .reshape(..), which copies when it must, or call .contiguous() first"
    );
    assert!(
        message(a.try_expand(&[4, 3]))
            .starts_with("expand: cannot expand shape [2, 3] to [4, 3]: dimension 0 has size 2")
    );
    assert!(
        message(a.try_permute(&[0]))
            .starts_with("permute: got 1 dimensions [0] for a tensor of rank 2")
    );
    assert!(
        message(Tensor::zeros([2, 2, 2]).try_t())
            .starts_with("t: expects a tensor of rank 2 or less, got shape [2, 2, 2]")
    );
    assert!(
        message(Tensor::try_from_vec(vec![1.0f32; 5], [2, 3]))
            .starts_with("from_vec: 5 values cannot fill shape [2, 3], which has 6 elements")
    );
    assert!(
        message(Tensor::zeros([0, 2]).try_max())
            .starts_with("max: cannot reduce dimension 0 of size 0 in [0, 2]")
    );
    let item = Tensor::zeros([2]).try_item::<f32>().unwrap_err().to_string();
    assert!(
        item.starts_with("item: needs a tensor with one element, got shape [2] (2 elements)"),
        "{item}"
    );
}

#[test]
fn dims_and_indices_out_of_range() {
    let a = Tensor::zeros([2, 3]);
    assert_eq!(
        message(a.try_sum_dim(2, false)),
        "sum: dimension 2 is out of range for a tensor of rank 2: expected a dimension in -2..=1"
    );
    assert!(
        message(a.try_sum_dim([1, -1], false))
            .starts_with("sum: dimension 1 appears more than once")
    );
    assert!(
        message(a.try_transpose(0, -3))
            .starts_with("transpose: dimension -3 is out of range for a tensor of rank 2")
    );
    assert!(
        message(a.try_unsqueeze(4))
            .starts_with("unsqueeze: dimension 4 is out of range for a tensor of rank 3")
    );
    assert!(message(a.try_squeeze(2)).starts_with("squeeze: dimension 2 is out of range"));
    assert!(message(a.try_permute(&[0, 0])).starts_with("permute: dimension 0 appears twice"));
    assert_eq!(
        message(a.try_narrow(1, 2, 2)),
        "narrow: elements 2..4 of dimension 1 are out of range for size 3 (shape [2, 3])"
    );
    assert!(
        Tensor::scalar(1.0f32)
            .try_sum_dim(0, false)
            .unwrap_err()
            .to_string()
            .contains("a scalar has no dimensions")
    );
    assert!(matches!(
        a.try_max_dim(5, false).unwrap_err(),
        kiln::Error::Index { op: "max_dim", .. }
    ));
}

#[test]
fn dtype_mistakes_name_the_dtypes() {
    let i = Tensor::from_vec(vec![1i64, 2], [2]);
    let f = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert_eq!(
        message(i.try_mean()),
        "mean: needs a float tensor, got i64; convert it first with .float()"
    );
    assert_eq!(
        message(f.try_matmul(&f.double())),
        "matmul: operands have dtypes f32 and f64; cast one of them so they agree"
    );
    assert_eq!(
        message(b.try_add(&b)),
        "add: is not defined for two bool operands; cast one with .long() or .float() first"
    );
    assert_eq!(
        message(b.try_neg()),
        "neg: is not defined for bool tensors; to invert a mask use .logical_not()"
    );
    assert_eq!(message(b.try_relu()), "relu: is not defined for bool inputs");
    assert!(message(b.try_matmul(&b)).starts_with("matmul: is not defined for bool operands"));
    assert!(
        message(Tensor::try_arange(0i64, 10, 0))
            .starts_with("arange: step 0 cannot go from 0 to 10")
    );
    assert!(
        message(Tensor::try_arange(0.0f32, 1.0, -0.5))
            .starts_with("arange: step -0.5 cannot go from 0 to 1")
    );
    assert_eq!(
        message(Tensor::try_randint(3, 3, [2])),
        "randint: low (3) must be less than high (3)"
    );
    assert!(matches!(i.try_mean().unwrap_err(), kiln::Error::DType { op: "mean", .. }));
}

#[test]
fn panicking_forms_panic_with_the_message_at_the_callers_line() {
    let a = Tensor::zeros([2, 3]);
    let b = Tensor::zeros([4, 5]);
    let line = line!() + 1;
    let caught = std::panic::catch_unwind(|| a.matmul(&b));
    let err = caught.expect_err("mismatched matmul panics");
    let msg = err.downcast_ref::<String>().expect("the panic carries the error message");
    assert_eq!(msg, "matmul: shapes [2, 3] and [4, 5] are not compatible: 3 != 4");
    // The location of the panic is the caller's line, through #[track_caller]; checked by a
    // panic hook so the test does not depend on the default hook's output format.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *seen2.lock().unwrap() = info.location().map(|l| (l.file().to_string(), l.line()));
    }));
    let here = line!() + 1;
    let _ = std::panic::catch_unwind(|| &a + &b);
    std::panic::set_hook(previous);
    let (file, at) = seen.lock().unwrap().clone().expect("the hook saw the panic");
    assert!(file.ends_with("errors.rs"), "panic located in {file}");
    assert_eq!(at, here);
    let _ = line;
}

#[test]
#[should_panic(expected = "sum: dimension 3 is out of range")]
fn reductions_panic_on_bad_dims() {
    let _ = Tensor::zeros([2, 3]).sum_dim(3, false);
}

#[test]
fn runtime_failures_name_the_op_and_the_line_that_recorded_it() {
    // 2^46 f32 values (256 TiB, more than x86-64's 128 TiB of user address space, so no
    // overcommitting kernel hands it out either) cannot be allocated: the shape is fine, so
    // recording succeeds and the failure surfaces when the value is computed, pointing back
    // at this line.
    let line = line!() + 1;
    let huge = Tensor::ones([1 << 23, 1 << 23]) * 2.0;
    let err = huge.sum().try_item::<f32>().unwrap_err();
    let kiln::Error::Runtime(run) = &err else { panic!("expected a runtime error, got {err:?}") };
    assert!(matches!(run.error, kiln::RuntimeError::OutOfMemory { .. }), "{err}");
    let origin = run.origin.expect("the failing node records where it was made");
    assert!(origin.file().ends_with("errors.rs"), "{err}");
    assert_eq!(origin.line(), line);
    let text = err.to_string();
    assert!(text.starts_with("out of memory on cpu: could not allocate"), "{text}");
    assert!(text.contains(&format!("errors.rs:{line}")), "{text}");
}

#[test]
fn cuda_probing_never_fails_and_moves_say_why() {
    let n = kiln::cuda::device_count();
    assert_eq!(kiln::cuda::is_available(), n > 0);
    let device = Device::cuda_if_available(0);
    assert_eq!(device, if n > 0 { Device::Cuda(0) } else { Device::Cpu });
    assert_eq!(Device::cuda_if_available(n), Device::Cpu);
    let x = Tensor::ones([2]);
    // A device that does not exist on any machine: the error is the same with or without
    // a GPU.
    let e = x.try_to(Device::Cuda(n)).unwrap_err();
    let msg = e.to_string();
    let prefix = format!("to: cannot move a tensor from cpu to cuda:{n}: ");
    assert!(msg.starts_with(&prefix), "{msg}");
    assert!(msg.ends_with("; keep tensors on Device::Cpu (Device::cuda_if_available picks the CPU when there is no GPU)"), "{msg}");
    if n == 0 {
        eprintln!("no CUDA device here ({msg})");
    }
    assert!(x.cpu().shares_storage_with(&x));
}

/// The origin line of the first runtime error `f`'s result gives when read.
fn failing_line(t: &Tensor) -> (String, u32) {
    let err = t.try_to_vec::<f32>().expect_err("reading should fail");
    let kiln::Error::Runtime(run) = &err else { panic!("expected a runtime error, got {err:?}") };
    let origin = run.origin.unwrap_or_else(|| panic!("no origin: {err}"));
    assert!(err.to_string().contains(&format!("{}:{}", origin.file(), origin.line())), "{err}");
    (origin.file().to_string(), origin.line())
}

/// Errors found while computing name the user's line, also when the failing op was recorded
/// deep inside a loss, a layer or a model made of layers.
#[test]
fn errors_inside_losses_and_layers_name_the_users_line() {
    use kiln::nn::{Embedding, Module, Sequential, functional as F};
    let here = |line: u32| ("tests/errors.rs".to_string(), line);
    let logits = Tensor::zeros([2, 3]);
    let target = Tensor::from_vec(vec![0i64, 5], [2]);
    let line = line!() + 1;
    let loss = F::cross_entropy(&logits, &target);
    assert_eq!(failing_line(&loss), here(line));
    let log_p = logits.log_softmax(1);
    let line = line!() + 1;
    let loss = F::try_nll_loss_with(&log_p, &target, Default::default(), None).unwrap();
    assert_eq!(failing_line(&loss), here(line));

    // The functional form, and a layer, and the same layer inside a Sequential (called
    // through `dyn Module`).
    let indices = Tensor::from_vec(vec![1i64, 9], [2]);
    let line = line!() + 1;
    let out = F::embedding(&indices, &Tensor::zeros([4, 3]));
    assert_eq!(failing_line(&out), here(line));
    let line = line!() + 1;
    let out = Embedding::new(4, 3).forward(&indices);
    assert_eq!(failing_line(&out), here(line));
    let model = Sequential::new().with(Embedding::new(4, 3));
    let line = line!() + 1;
    let out = model.try_forward(&indices).unwrap();
    assert_eq!(failing_line(&out), here(line));

    // A module of the user's own, run by a Sequential: its own line, not the Sequential's.
    struct Head;
    impl kiln::nn::Parameters for Head {
        fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
        fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
    }
    const HEAD_LINE: u32 = line!() + 4;
    impl Module for Head {
        fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
            let target = Tensor::from_vec(vec![7i64], [1]);
            F::try_cross_entropy_with(x, &target, Default::default())
        }
    }
    let model = Sequential::new().with(Head);
    let out = model.forward(&Tensor::zeros([1, 3]));
    assert_eq!(failing_line(&out), here(HEAD_LINE));
}

/// Shapes whose element count or byte size overflows are errors at the call, never a
/// wrapped size (which would allocate too little and index out of bounds).
#[test]
fn shapes_too_large_for_memory_are_errors() {
    let huge = [1usize << 40, 1 << 40];
    let err = Tensor::try_full_dtype(huge, 0.0, DType::F32).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "full: a tensor of shape [1099511627776, 1099511627776] and dtype f32 would hold more than"
        ),
        "{err}"
    );
    let wraps = [1usize << 62, 8]; // 2^65 elements: wraps to 0 in usize
    assert!(Tensor::try_full_dtype(wraps, 1i64, DType::I64).is_err());
    let err = Tensor::zeros([1]).try_expand(&[1 << 62, 1 << 62]).unwrap_err().to_string();
    assert!(err.starts_with("expand: a tensor of shape"), "{err}");
    assert!(Tensor::try_eye(1 << 33).is_err());
    let panicked = std::panic::catch_unwind(|| Tensor::zeros(huge)).unwrap_err();
    let text = panicked.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("more than any memory can address"), "{text}");
    // The identity matrix is lazy: any size that fits is fine to record.
    assert_eq!(Tensor::eye(3).to_vec::<f32>(), vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(Tensor::eye(0).dims(), &[0, 0]);
    assert_eq!(Tensor::eye(100_000).dims(), &[100_000, 100_000]);
}

/// Layer constructors have `try_` forms: bad options and impossible sizes are errors.
#[test]
fn layer_constructors_return_errors() {
    use kiln::nn::{Dropout, Embedding, LayerNorm, Linear};
    let text = |e: kiln::Error| e.to_string();
    assert_eq!(text(Dropout::try_new(1.5).unwrap_err()), "Dropout: p must be in [0, 1], got 1.5");
    assert!(Dropout::try_new(f64::NAN).is_err());
    assert_eq!(
        text(Linear::try_with_options(3, 2, true, DType::I64).unwrap_err()),
        "Linear: parameters must be floating point, got i64; use DType::F32"
    );
    assert!(text(Linear::try_new(1 << 40, 1 << 40).unwrap_err()).contains("more than any memory"));
    assert!(text(Embedding::try_new(1 << 62, 4).unwrap_err()).contains("more than any memory"));
    assert_eq!(
        text(LayerNorm::try_with_options(&[4], -1.0, true).unwrap_err()),
        "LayerNorm: eps must be >= 0, got -1"
    );
    let layer = Linear::try_new(3, 2).unwrap();
    assert_eq!(
        (layer.weight.dims(), layer.bias.as_ref().map(|b| b.dims().to_vec())),
        (&[2, 3][..], Some(vec![2]))
    );
    let panicked = std::panic::catch_unwind(|| Dropout::new(-0.1)).unwrap_err();
    let message = panicked.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("Dropout: p must be in [0, 1], got -0.1"), "{message}");
}

/// The messages of representative mistakes, one per kind, as a reviewed snapshot: a change
/// to any wording shows up as a diff. (Device errors depend on the machine and are tested
/// in `cuda_probing_never_fails_and_moves_say_why`.)
#[test]
fn error_message_snapshot() {
    let a = Tensor::zeros([2, 3]);
    let messages = [
        a.try_add(Tensor::zeros([4, 3])).map(|_| ()),
        a.try_matmul(&Tensor::zeros([4, 3])).map(|_| ()),
        a.try_reshape(&[4, -1]).map(|_| ()),
        a.t().try_view(&[6]).map(|_| ()),
        a.try_sum_dim(5, false).map(|_| ()),
        a.try_select(1, 7).map(|_| ()),
        a.try_gather(1, &a).map(|_| ()),
        Tensor::try_where_(&a, &a, &a).map(|_| ()),
        kiln::try_einsum("ij,jk->ik", &[&a, &a]).map(|_| ()),
        Tensor::try_from_vec(vec![1.0f32; 5], [2, 3]).map(|_| ()),
        Tensor::try_full_dtype([1usize << 40, 1 << 40], 0.0, DType::F32).map(|_| ()),
        kiln::nn::Dropout::try_new(2.0).map(|_| ()),
    ];
    let text: Vec<String> = messages
        .into_iter()
        .map(|r| r.expect_err("a mistake").to_string())
        .map(|m| m.lines().next().unwrap_or_default().to_string())
        .collect();
    insta::assert_snapshot!("error_messages", text.join("\n"));
}
