//! GGUF files (llama.cpp's format): metadata and tensors, memory-mapped, with GGML's block
//! types dequantized on read.
//!
//! ```no_run
//! use kiln_models::gguf::Gguf;
//! let file = Gguf::open("model-Q4_K_M.gguf")?;
//! println!("{:?}", file.get("general.architecture"));
//! for t in file.tensors() {
//!     println!("{} {:?} {}", t.name, t.shape, t.kind);
//! }
//! let embeddings = file.tensor("token_embd.weight")?; // f32, [vocab, hidden]
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! GGUF files come from strangers: [`Gguf::open`] checks every count, length, offset and
//! size against the file before it allocates or reads, so a truncated, lying or overlapping
//! file is an [`Error::Io`] that names what it claimed, never a panic.

mod llama;
mod read;
mod tokenizer;
mod value;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln::{DType, Device, Error, Result, Tensor};
use kiln_runtime::mmap::MappedFile;
use kiln_runtime::quant::{self, GgmlType};

pub use llama::GgufWeights;
pub use read::TensorInfo;
pub use value::{Array, Value};

/// A GGUF file: its metadata and tensor entries, read and checked when it is opened; the
/// tensors' data stays in the mapped file until asked for.
pub struct Gguf {
    path: PathBuf,
    file: MappedFile,
    version: u32,
    alignment: usize,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gguf({}, version {}, {} metadata entries, {} tensors)",
            self.path.display(),
            self.version,
            self.metadata.len(),
            self.tensors.len()
        )
    }
}

impl Gguf {
    /// Maps the file at `path` and reads its header.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file: it cannot be mapped; it is not GGUF, or a version other
    /// than 2 and 3, or big-endian; it is shorter than a count, length or offset says; a
    /// metadata or tensor type it does not define; a key or tensor name twice; tensors that
    /// overlap or are not aligned.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let fail = |detail: String| Error::Io {
            op: "Gguf::open",
            detail: format!("{}: {detail}", path.display()),
        };
        let file = MappedFile::open(path).map_err(|e| fail(format!("cannot map it: {e}")))?;
        let header = read::header(file.bytes()).map_err(fail)?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf {
            path: path.to_path_buf(),
            file,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the tensors' data (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Every metadata entry, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensors' entries, in the file's order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The entry of tensor `name`.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    fn entry(&self, name: &str) -> Result<&TensorInfo> {
        self.info(name).ok_or_else(|| Error::Load {
            detail: format!("missing: {name} (not in {})", self.path.display()),
        })
    }

    /// The stored bytes of tensor `name`: its GGML blocks as they lie in the file.
    ///
    /// # Errors
    /// [`Error::Load`] when the file does not hold `name`.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.entry(name)?;
        Ok(&self.file.bytes()[t.bytes.clone()])
    }

    /// The tensor `name` on the CPU: [`Gguf::tensor_on`].
    ///
    /// # Errors
    /// As [`Gguf::tensor_on`].
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.tensor_on(name, Device::Cpu)
    }

    /// The tensor `name` on `device`, of its stored dtype for `F32`, `F16`, `BF16`, `F64`,
    /// `I8`, `I32` and `I64` (copied from the mapped file once), and dequantized to `f32` for the
    /// block types ([`quant::dequantized`] lists them), bit for bit as GGML's reference
    /// dequantizes.
    ///
    /// # Errors
    /// [`Error::Load`] when the file does not hold `name`; [`Error::Io`] naming the tensor
    /// and its type when kiln does not read the type; the device's errors.
    pub fn tensor_on(&self, name: &str, device: Device) -> Result<Tensor> {
        let t = self.entry(name)?;
        let data = &self.file.bytes()[t.bytes.clone()];
        let stored = match t.kind {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            GgmlType::F64 => Some(DType::F64),
            GgmlType::I32 => Some(DType::I32),
            GgmlType::I64 => Some(DType::I64),
            GgmlType::I8 => Some(DType::I8),
            _ => None,
        };
        if let Some(dtype) = stored {
            return Tensor::try_from_le_bytes(data, dtype, t.shape.clone(), device);
        }
        let mut values = vec![0f32; t.shape.iter().product()];
        quant::dequantize(t.kind, data, &mut values).map_err(|e| Error::Io {
            op: "Gguf::tensor",
            detail: format!("{}: {name}: {e}", self.path.display()),
        })?;
        Tensor::try_from_vec(values, t.shape.clone())?.try_to(device)
    }
}
