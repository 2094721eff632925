//! Printing tensors the way PyTorch does.
//!
//! The rules follow `torch/_tensor_str.py`: floats print with 4 decimals, in scientific
//! notation when the magnitudes span more than 1000x or leave `[1e-4, 1e8)`, and as `1.` when
//! every value is an integer; every element of a tensor is padded to one width; tensors with
//! more than 1000 elements show the first and last 3 entries of each dimension around `...`;
//! the dtype is printed when it is not the default of its kind (`f32`, `i64`, `bool`).

use std::fmt;

use kiln_ir::{Category, DType};

use super::Tensor;

const THRESHOLD: usize = 1000;
const EDGE_ITEMS: usize = 3;
const LINE_WIDTH: usize = 80;

impl fmt::Display for Tensor {
    /// Computes the tensor (a realization trigger) and prints it like PyTorch.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.5, 3.25, 4.0], [2, 2]);
    /// assert_eq!(x.to_string(), "tensor([[ 1.0000, -2.5000],\n        [ 3.2500,  4.0000]])");
    /// assert_eq!(Tensor::arange(0i64, 3, 1).to_string(), "tensor([0, 1, 2])");
    /// assert_eq!(Tensor::scalar(2.0f64).to_string(), "tensor(2., dtype=f64)");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A large tensor is cut down to the elements shown before it is read, so printing a
        // GPU tensor copies those alone, and a lazy one computes little more.
        let summarize = self.numel() > THRESHOLD;
        let shown =
            if summarize { super::grad_mode::no_grad(|| summary(self)) } else { self.clone() };
        let dims = self.dims();
        let body = match self.dtype().category() {
            Category::Float => shown
                .try_to_vec::<f64>()
                .map(|v| render(dims, &v, summarize, float_formatter(dims, &v, summarize))),
            Category::Int => shown
                .try_to_vec::<i64>()
                .map(|v| render(dims, &v, summarize, |x: &i64| x.to_string())),
            Category::Bool => shown.try_to_vec::<bool>().map(|v| {
                let word = |x: &bool| if *x { "True".into() } else { "False".into() };
                render(dims, &v, summarize, word)
            }),
        };
        let body = match body {
            Ok(b) => b,
            Err(e) => return write!(f, "tensor(<failed to compute: {e}>)"),
        };
        let mut suffix = Vec::new();
        if self.numel() == 0 && self.ndim() != 1 {
            suffix.push(format!("size={:?}", self.dims()));
        }
        if self.dtype() != DType::default_for(self.dtype().category()) {
            suffix.push(format!("dtype={}", self.dtype()));
        }
        if self.device() != kiln_runtime::Device::Cpu {
            suffix.push(format!("device='{}'", self.device()));
        }
        match self.grad_fn_name() {
            Some(name) => suffix.push(format!("grad_fn=<{name}>")),
            None if self.requires_grad() => suffix.push("requires_grad=True".into()),
            None => {}
        }
        write!(f, "tensor({body}")?;
        for s in suffix {
            write!(f, ", {s}")?;
        }
        f.write_str(")")
    }
}

/// The first and last `EDGE_ITEMS` of every longer dimension: what a summarized print shows.
fn summary(t: &Tensor) -> Tensor {
    let mut out = t.clone();
    for (d, &size) in t.dims().iter().enumerate() {
        if size > 2 * EDGE_ITEMS {
            let dim = d as i64;
            let (head, tail) =
                (out.narrow(dim, 0, EDGE_ITEMS), out.narrow(dim, size - EDGE_ITEMS, EDGE_ITEMS));
            out = Tensor::cat(&[&head, &tail], dim);
        }
    }
    out
}

/// The dimensions of the data read for printing: [`summary`]'s when summarizing.
fn stored_dims(dims: &[usize], summarize: bool) -> Vec<usize> {
    let cut = |d: usize| if summarize && d > 2 * EDGE_ITEMS { 2 * EDGE_ITEMS } else { d };
    dims.iter().map(|&d| cut(d)).collect()
}

/// Which elements of a dimension of size `dim` are shown, as indices into the data read
/// (see [`stored_dims`]): all, or the first and last `EDGE_ITEMS` around a gap.
fn shown(dim: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && dim > 2 * EDGE_ITEMS {
        let mut v: Vec<Option<usize>> = (0..EDGE_ITEMS).map(Some).collect();
        v.push(None);
        v.extend((EDGE_ITEMS..2 * EDGE_ITEMS).map(Some));
        v
    } else {
        (0..dim).map(Some).collect()
    }
}

/// The values that will be printed (for choosing a format from them only, as PyTorch does).
fn shown_values<T: Copy>(dims: &[usize], data: &[T], summarize: bool) -> Vec<T> {
    let mut out = Vec::new();
    let strides = kiln_ir::Shape::from(stored_dims(dims, summarize)).contiguous_strides();
    let mut stack = vec![(0usize, 0usize)];
    while let Some((depth, offset)) = stack.pop() {
        if depth == dims.len() {
            out.push(data[offset]);
            continue;
        }
        for i in shown(dims[depth], summarize).into_iter().rev().flatten() {
            stack.push((depth + 1, offset + i * strides[depth] as usize));
        }
    }
    out
}

fn float_formatter(dims: &[usize], data: &[f64], summarize: bool) -> impl Fn(&f64) -> String {
    let values = shown_values(dims, data, summarize);
    let finite: Vec<f64> =
        values.iter().copied().filter(|v| v.is_finite() && *v != 0.0).map(f64::abs).collect();
    let int_mode = values.iter().filter(|v| v.is_finite()).all(|v| v.fract() == 0.0);
    let (min, max) =
        finite.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let sci = !finite.is_empty() && (max / min > 1000.0 || max > 1e8 || (!int_mode && min < 1e-4));
    move |&v: &f64| {
        if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf".into() } else { "-inf".into() }
        } else if sci {
            scientific(v)
        } else if int_mode {
            format!("{v:.0}.")
        } else {
            format!("{v:.4}")
        }
    }
}

/// `{:.4e}` as Python prints it: `1.2346e+04`, `-3.0000e-05`.
fn scientific(v: f64) -> String {
    let s = format!("{v:.4e}");
    let (mantissa, exp) = s.split_once('e').expect("Rust's {:e} output has an exponent");
    let exp: i32 = exp.parse().expect("Rust's {:e} exponent is an integer");
    format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

/// `data` (of [`stored_dims`]) printed as a tensor of `dims`.
fn render<T: Copy>(
    dims: &[usize],
    data: &[T],
    summarize: bool,
    fmt_one: impl Fn(&T) -> String,
) -> String {
    if dims.is_empty() {
        return fmt_one(&data[0]);
    }
    if data.is_empty() {
        return "[]".into();
    }
    let width =
        shown_values(dims, data, summarize).iter().map(|v| fmt_one(v).len()).max().unwrap_or(0);
    let strides = kiln_ir::Shape::from(stored_dims(dims, summarize)).contiguous_strides();
    let mut out = String::new();
    write_dim(&mut out, dims, &strides, data, 0, 0, summarize, width, &fmt_one);
    out
}

#[allow(clippy::too_many_arguments, reason = "a private recursive helper over one print job")]
fn write_dim<T: Copy>(
    out: &mut String,
    dims: &[usize],
    strides: &[isize],
    data: &[T],
    depth: usize,
    offset: usize,
    summarize: bool,
    width: usize,
    fmt_one: &impl Fn(&T) -> String,
) {
    // PyTorch's indent: "tensor(" plus one column per enclosing bracket; continuation lines
    // start one column further in, under this dimension's first element.
    let indent = " ".repeat(7 + depth + 1);
    out.push('[');
    let items = shown(dims[depth], summarize);
    if depth + 1 == dims.len() {
        let per_line = ((LINE_WIDTH - (7 + depth)) / (width + 2)).max(1);
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                out.push(',');
                out.push_str(if n % per_line == 0 { "\n" } else { " " });
                if n % per_line == 0 {
                    out.push_str(&indent);
                }
            }
            match item {
                Some(i) => out.push_str(&format!(
                    "{:>width$}",
                    fmt_one(&data[offset + i * strides[depth] as usize])
                )),
                None => out.push_str(" ..."),
            }
        }
    } else {
        let gap = "\n".repeat(dims.len() - depth - 1);
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                out.push(',');
                out.push_str(&gap);
                out.push_str(&indent);
            }
            match item {
                Some(i) => write_dim(
                    out,
                    dims,
                    strides,
                    data,
                    depth + 1,
                    offset + i * strides[depth] as usize,
                    summarize,
                    width,
                    fmt_one,
                ),
                None => out.push_str("..."),
            }
        }
    }
    out.push(']');
}
