//! Named tensors to and from safetensors files.
//!
//! The format of Hugging Face's `safetensors`: a JSON header of names, dtypes, shapes and
//! offsets, then the raw little-endian data. Every kiln dtype round-trips bit for bit.
//! [`crate::nn::Parameters::save`] and [`crate::nn::Parameters::load`] use these for whole
//! models.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let path = std::env::temp_dir().join(format!("kiln-doc-{}.safetensors", std::process::id()));
//! let w = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0], [2, 2]);
//! let ids = Tensor::from_vec(vec![7i64, 8, 9], [3]);
//! kiln::serialize::save(&path, &[("w".to_string(), w.clone()), ("ids".to_string(), ids)]).unwrap();
//! let loaded = kiln::serialize::load(&path).unwrap();
//! assert_eq!(loaded[0].0, "ids"); // sorted by name
//! assert_eq!(loaded[1].1.to_vec::<f32>(), w.to_vec::<f32>());
//! # std::fs::remove_file(&path).unwrap();
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::{DType, Error, Result, Tensor};

/// Tensors with their names, as files hold them.
pub type NamedTensors = Vec<(String, Tensor)>;

/// Writes `tensors` (name, tensor) to a safetensors file at `path`, computing pending ones.
///
/// # Errors
/// [`Error::Io`] when the file cannot be written; [`Error::Value`] for a repeated name;
/// [`Error::Runtime`] when computing a pending tensor fails.
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    save_with_metadata(path, tensors, &BTreeMap::new())
}

/// [`save`], also writing `metadata` (string pairs) into the file's header, where
/// safetensors keeps free-form metadata (`__metadata__`).
///
/// # Errors
/// As [`save`].
pub fn save_with_metadata(
    path: impl AsRef<Path>,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let path = path.as_ref();
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::value(
            "save",
            format!("the name {:?} appears twice; names must be unique", w[0]),
        ));
    }
    Tensor::try_realize_all(&tensors.iter().map(|(_, t)| t).collect::<Vec<_>>())?;
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, t)| to_bytes(t)).collect::<Result<_>>()?;
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), data)| {
            TensorView::new(format_dtype(t.dtype()), t.dims().to_vec(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| {
                    Error::Internal(format!("save: a tensor view of {name} was refused: {e}"))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = (!metadata.is_empty())
        .then(|| metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    let io = |e: &dyn std::fmt::Display| Error::Io {
        op: "save",
        detail: format!("cannot write {}: {e}", path.display()),
    };
    // safetensors writes a temporary file (mode 0600) and renames it over `path`: the file
    // gets the mode of the one it replaces, or that a plain create gives (the umask's).
    let permissions = match std::fs::metadata(path) {
        Ok(m) => m.permissions(),
        Err(_) => std::fs::File::create(path)
            .and_then(|f| f.metadata())
            .map_err(|e| io(&e))?
            .permissions(),
    };
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| io(&e))?;
    std::fs::set_permissions(path, permissions).map_err(|e| io(&e))
}

/// Reads every tensor of a safetensors file, sorted by name.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read or is not valid safetensors, or holds a dtype
/// kiln does not have (`u16`, `i16`, the 8-bit floats, ...).
pub fn load(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    load_with_metadata(path).map(|(tensors, _)| tensors)
}

/// [`load`], also returning the header's metadata (empty when the file has none).
///
/// # Errors
/// As [`load`].
pub fn load_with_metadata(
    path: impl AsRef<Path>,
) -> Result<(NamedTensors, BTreeMap<String, String>)> {
    let path = path.as_ref();
    let io = |detail: String| Error::Io { op: "load", detail };
    let bytes =
        std::fs::read(path).map_err(|e| io(format!("cannot read {}: {e}", path.display())))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| io(format!("{} is not a valid safetensors file: {e}", path.display())))?;
    let mut out = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let Some(dtype) = kiln_dtype(view.dtype()) else {
                return Err(io(format!(
                    "{}: tensor {name:?} has dtype {:?}, which kiln does not support",
                    path.display(),
                    view.dtype()
                )));
            };
            let tensor = from_bytes(dtype, view.shape(), view.data());
            Ok((name, tensor))
        })
        .collect::<Result<Vec<_>>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata = SafeTensors::read_metadata(&bytes)
        .map(|(_, m)| m.metadata().clone().unwrap_or_default().into_iter().collect())
        .map_err(|e| io(format!("{} has an unreadable header: {e}", path.display())))?;
    Ok((out, metadata))
}

/// Copies `loaded` into `params` by name, after checking that names, shapes and dtypes all
/// match; on any difference nothing is written and the error lists every one.
pub(crate) fn assign(params: &[(String, Tensor)], loaded: Vec<(String, Tensor)>) -> Result<()> {
    let mut loaded: std::collections::BTreeMap<String, Tensor> = loaded.into_iter().collect();
    let mut problems = Vec::new();
    let mut pairs = Vec::new();
    for (name, p) in params {
        match loaded.remove(name) {
            None => problems.push(format!("  missing from the file: {name} (shape {}, {})", p.shape(), p.dtype())),
            Some(t) if t.shape() != p.shape() => problems.push(format!(
                "  {name}: the file has shape {}, the model {}",
                t.shape(),
                p.shape()
            )),
            Some(t) if t.dtype() != p.dtype() => problems.push(format!(
                "  {name}: the file has dtype {}, the model {}; convert the model (or the file) first",
                t.dtype(),
                p.dtype()
            )),
            Some(t) => pairs.push((p, t)),
        }
    }
    for (name, t) in &loaded {
        problems.push(format!("  not in the model: {name} (shape {}, {})", t.shape(), t.dtype()));
    }
    if !problems.is_empty() {
        return Err(Error::Load { detail: problems.join("\n") });
    }
    crate::no_grad(|| {
        for (p, t) in &pairs {
            p.try_copy_(t)?;
        }
        Tensor::try_realize_all(&pairs.iter().map(|(p, _)| *p).collect::<Vec<_>>())
    })
}

fn format_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// kiln's dtype of a safetensors dtype (`None` for one kiln does not have: `i16`, `u16`,
/// the 8-bit floats, ...): what [`load`] and kiln-models' checkpoints read.
pub fn kiln_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// The elements in row-major order as little-endian bytes.
fn to_bytes(t: &Tensor) -> Result<Vec<u8>> {
    fn le<T, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.into_iter().flat_map(f).collect()
    }
    Ok(match t.dtype() {
        DType::F32 => le(t.try_to_vec::<f32>()?, f32::to_le_bytes),
        DType::F64 => le(t.try_to_vec::<f64>()?, f64::to_le_bytes),
        DType::F16 => le(t.try_to_vec::<f16>()?, f16::to_le_bytes),
        DType::BF16 => le(t.try_to_vec::<bf16>()?, bf16::to_le_bytes),
        DType::I64 => le(t.try_to_vec::<i64>()?, i64::to_le_bytes),
        DType::I32 => le(t.try_to_vec::<i32>()?, i32::to_le_bytes),
        DType::I8 => le(t.try_to_vec::<i8>()?, i8::to_le_bytes),
        DType::U8 => t.try_to_vec::<u8>()?,
        DType::Bool => le(t.try_to_vec::<bool>()?, |b| [u8::from(b)]),
    })
}

/// A tensor from little-endian bytes whose length the safetensors parser has checked.
fn from_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Tensor {
    fn parse<T, const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        data.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks_exact yields chunks of N bytes")))
            .collect()
    }
    let shape = shape.to_vec();
    match dtype {
        DType::F32 => Tensor::from_vec(parse(data, f32::from_le_bytes), shape),
        DType::F64 => Tensor::from_vec(parse(data, f64::from_le_bytes), shape),
        DType::F16 => Tensor::from_vec(parse(data, f16::from_le_bytes), shape),
        DType::BF16 => Tensor::from_vec(parse(data, bf16::from_le_bytes), shape),
        DType::I64 => Tensor::from_vec(parse(data, i64::from_le_bytes), shape),
        DType::I32 => Tensor::from_vec(parse(data, i32::from_le_bytes), shape),
        DType::I8 => Tensor::from_vec(parse(data, i8::from_le_bytes), shape),
        DType::U8 => Tensor::from_vec(data.to_vec(), shape),
        DType::Bool => Tensor::from_vec(data.iter().map(|&b| b != 0).collect::<Vec<bool>>(), shape),
    }
}
