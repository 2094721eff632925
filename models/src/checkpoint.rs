//! A Hugging Face checkpoint folder's weights: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists, memory-mapped, every tensor's header checked against
//! its file before anything is read. A model takes its tensors by name through a [`Loader`],
//! which converts each to the requested dtype and device and collects every problem
//! (missing, mismatched, unexpected), so one error lists them all, as PyTorch's
//! `load_state_dict` does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kiln::{DType, Device, Error, Result, Tensor};
use kiln_runtime::mmap::MappedFile;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::compressed::Packed;
use crate::quantize::QuantKind;
use crate::quantized::{Activations, Quantized};

/// How [`crate::gpt2::Gpt2::from_pretrained`] and friends place the weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadOptions {
    /// The dtype of the model's parameters (weights stored in another float type are
    /// converted on load).
    pub dtype: DType,
    /// The device the parameters live on.
    pub device: Device,
    /// Whether the projections, the head and the embedding table keep the GGML blocks a
    /// GGUF file stores them in (on [`LoadOptions::device`]): the products read the blocks
    /// ([`crate::linear::Linear::quantized`]) and the lookups dequantize the rows they pick;
    /// norms and tensors stored as floats are converted to `dtype` as before. The same for
    /// a checkpoint folder a quantized model was saved to
    /// ([`crate::llama::Llama::save_pretrained`]), and for compressed-tensors' int8 rows and
    /// packed int4 weights (kept as Q4_0 blocks). Off by default (blocks are then
    /// dequantized to `dtype`).
    pub keep_quantized: bool,
    /// How the products of weights kept quantized take their input in decode steps
    /// (weight-only, f32, by default; [`Activations::Int8`] quantizes it too, as llama.cpp
    /// does).
    pub activations: Activations,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions {
            dtype: DType::F32,
            device: Device::Cpu,
            keep_quantized: false,
            activations: Activations::F32,
        }
    }
}

/// One tensor's entry in a file's header.
#[derive(Clone, Debug)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// The byte range of its data within the file.
    bytes: std::ops::Range<usize>,
    /// How a tensor stored quantized is stored, as the file's metadata says
    /// ([`crate::save::QUANTIZED_KEY`]).
    kind: Option<QuantKind>,
}

/// The weights of a checkpoint folder, mapped and indexed by name.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, MappedFile)>,
    entries: BTreeMap<String, Entry>,
    /// compressed-tensors' packed int4 weights, by the weight's name (their parts are
    /// entries).
    packed: BTreeMap<String, Packed>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Checkpoint({}, {} tensors in {} files)",
            self.dir.display(),
            self.entries.len(),
            self.files.len()
        )
    }
}

fn io(detail: String) -> Error {
    Error::Io { op: "from_pretrained", detail }
}

impl Checkpoint {
    /// Maps `dir/model.safetensors`, or every shard `dir/model.safetensors.index.json`
    /// names, and reads their headers. Tensors stored quantized are known by the files'
    /// metadata ([`crate::save::QUANTIZED_KEY`]) or, for compressed-tensors' per-channel
    /// int8 and packed int4 schemes, by `config.json` (a packed weight is seen under its
    /// weight's name, its parts checked against each other).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file: none of the two present, an unreadable or invalid
    /// index, a shard it names that is missing or holds none of the tensors the index puts
    /// there, a file that is not valid safetensors or is shorter than its header says, a
    /// compressed-tensors config of a scheme kiln does not read, a packed weight whose
    /// parts disagree or that has zero points or an activation order.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let (names, expected) = if index.exists() {
            let (files, expected) = read_index(&index)?;
            (files, Some(expected))
        } else if single.exists() {
            (vec!["model.safetensors".to_string()], None)
        } else {
            return Err(io(format!(
                "{} holds neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            )));
        };
        let mut checkpoint = Checkpoint {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            entries: BTreeMap::new(),
            packed: BTreeMap::new(),
        };
        for name in names {
            let path = dir.join(&name);
            let map = MappedFile::open(&path)
                .map_err(|e| io(format!("cannot map {}: {e}", path.display())))?;
            checkpoint.add_file(path, map)?;
        }
        let schemes = crate::compressed::schemes(dir)?;
        if schemes.int8_rows {
            checkpoint.mark_int8_rows();
        }
        if schemes.int4_packed {
            checkpoint.mark_packed()?;
        }
        if let Some(expected) = expected {
            for (tensor, file) in expected {
                let Some(entry) = checkpoint.entries.get(&tensor) else {
                    return Err(io(format!(
                        "{}: the index puts {tensor:?} in {file}, which does not hold it",
                        index.display()
                    )));
                };
                let holder = &checkpoint.files[entry.file].0;
                if holder.file_name().and_then(|n| n.to_str()) != Some(file.as_str()) {
                    return Err(io(format!(
                        "{}: the index puts {tensor:?} in {file}, but it is in {}",
                        index.display(),
                        holder.display()
                    )));
                }
            }
        }
        Ok(checkpoint)
    }

    /// Reads one file's header: every tensor's dtype, shape and byte range, checked by
    /// safetensors against the file's length.
    fn add_file(&mut self, path: PathBuf, map: MappedFile) -> Result<()> {
        let bytes = map.bytes();
        let file = SafeTensors::deserialize(bytes)
            .map_err(|e| io(format!("{} is not a valid safetensors file: {e}", path.display())))?;
        let kinds = quantized_kinds(&path, bytes, &file)?;
        let index = self.files.len();
        for (name, view) in file.tensors() {
            let start = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
            let entry = Entry {
                file: index,
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                bytes: start..start + view.data().len(),
                kind: kinds.get(&name).copied(),
            };
            if self.entries.insert(name.clone(), entry).is_some() {
                return Err(io(format!(
                    "{}: the tensor {name:?} is in two files",
                    self.dir.display()
                )));
            }
        }
        self.files.push((path, map));
        Ok(())
    }

    /// Marks as per-channel int8 every `i8` `[rows, cols]` tensor with float scales
    /// `[rows, 1]` beside it (a compressed-tensors checkpoint's quantized weights).
    fn mark_int8_rows(&mut self) {
        let rows: Vec<String> = (self.entries.iter())
            .filter(|(name, e)| {
                let scale = self.entries.get(&format!("{name}{}", crate::save::SCALE_SUFFIX));
                matches!((e.dtype, e.shape.as_slice(), scale), (Dtype::I8, &[rows, _], Some(s))
                    if scale_dtype(s.dtype) && s.shape == [rows, 1])
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in rows {
            if let Some(entry) = self.entries.get_mut(&name) {
                entry.kind.get_or_insert(QuantKind::Int8);
            }
        }
    }

    /// Records every packed int4 weight (`NAME_packed` with `NAME_scale` and `NAME_shape`
    /// beside it), each part checked against the others.
    fn mark_packed(&mut self) -> Result<()> {
        use crate::compressed::{PACKED_SUFFIX, SHAPE_SUFFIX};
        let bases: Vec<String> = (self.entries.keys())
            .filter_map(|n| n.strip_suffix(PACKED_SUFFIX).map(str::to_string))
            .collect();
        for name in bases {
            let part = |suffix: &str| format!("{name}{suffix}");
            let bad = |why: String| io(format!("{}: {name}: {why}", self.dir.display()));
            for other in ["_zero_point", "_g_idx"] {
                if self.entries.contains_key(&part(other)) {
                    return Err(bad(format!(
                        "{} is there: asymmetric or activation-ordered int4 weights are not read",
                        part(other)
                    )));
                }
            }
            let (packed, scale) = (
                &self.entries[&part(PACKED_SUFFIX)],
                self.entries.get(&part(crate::save::SCALE_SUFFIX)),
            );
            let shape = self
                .tensor(&part(SHAPE_SUFFIX))
                .and_then(|t| t.to_dtype(DType::I64).try_to_vec::<i64>());
            let (out, inp) = match shape.as_deref() {
                Ok(&[out, inp]) => {
                    (usize::try_from(out).unwrap_or(0), usize::try_from(inp).unwrap_or(0))
                }
                _ => {
                    return Err(bad(format!("{} is missing or not two sizes", part(SHAPE_SUFFIX))));
                }
            };
            let groups = match scale.map(|s| (s.dtype, s.shape.as_slice())) {
                Some((dtype, &[rows, groups]))
                    if scale_dtype(dtype)
                        && rows == out
                        && groups > 0
                        && inp.is_multiple_of(groups) =>
                {
                    groups
                }
                other => {
                    return Err(bad(format!(
                        "its scales {} are {other:?}: float [{out}, groups], the groups dividing {inp} inputs",
                        part(crate::save::SCALE_SUFFIX)
                    )));
                }
            };
            if packed.dtype != Dtype::I32 || packed.shape != [out, inp.div_ceil(8)] {
                return Err(bad(format!(
                    "{} is {:?} {:?}: int4 values of a [{out}, {inp}] weight pack into i32 [{out}, {}]",
                    part(PACKED_SUFFIX),
                    packed.dtype,
                    packed.shape,
                    inp.div_ceil(8)
                )));
            }
            self.packed.insert(name, Packed { out, inp, groups });
        }
        Ok(())
    }

    /// A packed int4 weight's stored nibbles (the `i32` words' bytes) and its scales as f32.
    fn packed_parts(&self, name: &str) -> Result<(&[u8], Vec<f32>)> {
        let entry = &self.entries[&format!("{name}{}", crate::compressed::PACKED_SUFFIX)];
        let bytes = &self.files[entry.file].1.bytes()[entry.bytes.clone()];
        let scales = self.tensor(&format!("{name}{}", crate::save::SCALE_SUFFIX))?;
        Ok((bytes, scales.to_dtype(DType::F32).try_to_vec::<f32>()?))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The stored shape of `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// The tensor `name` as stored (its own dtype), on the CPU.
    ///
    /// # Errors
    /// As [`Checkpoint::tensor_on`].
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.tensor_on(name, Device::Cpu)
    }

    /// The tensor `name` as stored (its own dtype), on `device`: copied from the mapped file
    /// once, into host memory or straight to a GPU (no host buffer in between).
    ///
    /// # Errors
    /// [`Error::Load`] when it is missing; [`Error::Io`] when its dtype is not a float or
    /// integer type kiln has; the device's errors.
    pub fn tensor_on(&self, name: &str, device: Device) -> Result<Tensor> {
        let entry = self.entries.get(name).ok_or_else(|| Error::Load {
            detail: format!("missing: {name} (not in {})", self.dir.display()),
        })?;
        let data = &self.files[entry.file].1.bytes()[entry.bytes.clone()];
        let dtype = kiln::serialize::kiln_dtype(entry.dtype).ok_or_else(|| {
            io(format!(
                "{}: {name} is stored as {:?}, which kiln does not load (f32, f16, bf16, f64, i64, i32, i8, u8 and bool it does)",
                self.files[entry.file].0.display(),
                entry.dtype
            ))
        })?;
        Tensor::try_from_le_bytes(data, dtype, entry.shape.clone(), device)
    }
}

/// The shard files an index names, in order, and where it puts each tensor.
fn read_index(path: &Path) -> Result<(Vec<String>, BTreeMap<String, String>)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io(format!("cannot read {}: {e}", path.display())))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| io(format!("{} is not valid JSON: {e}", path.display())))?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err(io(format!("{} has no \"weight_map\" object", path.display())));
    };
    let mut files = Vec::new();
    let mut expected = BTreeMap::new();
    for (tensor, file) in map {
        let Some(file) = file.as_str().filter(|f| !f.contains('/') && !f.contains('\\')) else {
            return Err(io(format!(
                "{}: the weight_map entry of {tensor:?} should be a file name in the folder, found {file}",
                path.display()
            )));
        };
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
        expected.insert(tensor.clone(), file.to_string());
    }
    files.sort();
    Ok((files, expected))
}

/// The tensors `file`'s metadata says are stored quantized, with their kinds, each checked:
/// GGML blocks of a type kiln's products read, u8 `[rows, row bytes]` of whole blocks; or
/// per-channel int8, `i8` `[rows, cols]` with float scales `[rows, 1]` under `NAME_scale`.
fn quantized_kinds(
    path: &Path,
    bytes: &[u8],
    file: &SafeTensors<'_>,
) -> Result<BTreeMap<String, QuantKind>> {
    let (_, metadata) = SafeTensors::read_metadata(bytes)
        .map_err(|e| io(format!("{} has an unreadable header: {e}", path.display())))?;
    let mut kinds = BTreeMap::new();
    let Some(metadata) = metadata.metadata() else { return Ok(kinds) };
    for (key, value) in metadata {
        let Some(name) = key.strip_prefix(crate::save::QUANTIZED_KEY) else { continue };
        let bad =
            |why: String| io(format!("{}: {name} ({key:?}: {value:?}) {why}", path.display()));
        let kind = QuantKind::from_name(value)
            .ok_or_else(|| bad("names a kind the quantized products do not read".into()))?;
        let view = file.tensor(name).map_err(|_| bad("is not a tensor of the file".into()))?;
        let (dtype, shape) = (view.dtype(), view.shape());
        match kind {
            QuantKind::Blocks(ggml) => {
                let (_, size) = ggml.block().expect("a kept type is known");
                if !matches!(shape, [_, row] if dtype == Dtype::U8 && row.is_multiple_of(size) && *row > 0)
                {
                    return Err(bad(format!(
                        "is stored as {dtype:?} {shape:?}: {ggml} blocks are u8 [rows, a multiple of {size} bytes]"
                    )));
                }
            }
            QuantKind::Int8 => {
                let &[rows, _] = shape else {
                    return Err(bad(format!(
                        "is stored as {dtype:?} {shape:?}: int8 rows are i8 [rows, cols]"
                    )));
                };
                let scale = format!("{name}{}", crate::save::SCALE_SUFFIX);
                let fits = file
                    .tensor(&scale)
                    .is_ok_and(|s| scale_dtype(s.dtype()) && s.shape() == [rows, 1]);
                if dtype != Dtype::I8 || !fits {
                    return Err(bad(format!(
                        "is stored as {dtype:?} {shape:?}: int8 rows are i8 [rows, cols], with float scales [{rows}, 1] in {scale}"
                    )));
                }
            }
        }
        kinds.insert(name.to_string(), kind);
    }
    Ok(kinds)
}

/// Whether int8 rows' scales may be stored as `dtype` (f32, or the 16-bit floats
/// compressed-tensors writes for 16-bit models; they are widened to f32 on load).
fn scale_dtype(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// Named tensors a model loads from: a [`Checkpoint`] folder, or a GGUF file seen through
/// its architecture's names ([`crate::gguf::GgufWeights`]).
pub trait Weights {
    /// Where the tensors come from (a folder, a file), for messages.
    fn source(&self) -> String;
    /// Every tensor's name, sorted.
    fn names(&self) -> Vec<String>;
    /// The shape of `name`, when there is such a tensor.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The tensor `name` on `device`, of its stored dtype (a float type for weights).
    ///
    /// # Errors
    /// When it is missing or cannot be read.
    fn tensor_on(&self, name: &str, device: Device) -> Result<Tensor>;
    /// `name` as stored quantized (on the CPU), when it is stored in a kind a projection
    /// can keep; `None` for float tensors.
    ///
    /// # Errors
    /// When it cannot be read.
    fn quantized(&self, _name: &str) -> Result<Option<StoredWeight>> {
        Ok(None)
    }
}

/// A weight as stored quantized: its kind, its data (GGML blocks, u8 `[rows, row bytes]`;
/// or int8 rows, `i8` `[rows, cols]`) and per-channel int8's scales (f32 `[rows]`).
#[derive(Clone, Debug)]
pub struct StoredWeight {
    /// How it is stored.
    pub kind: QuantKind,
    /// The blocks or rows.
    pub data: Tensor,
    /// Per-channel int8's scales.
    pub scales: Option<Tensor>,
}

impl StoredWeight {
    /// The weight's values, f32 `[rows, cols]`: the blocks dequantized as GGML does, or
    /// `scale · q`.
    ///
    /// # Errors
    /// When blocks cannot be read.
    pub fn dequantize(&self) -> Result<Tensor> {
        match (self.kind, &self.scales) {
            (QuantKind::Blocks(kind), _) => crate::quantized::dequantize_with(kind, &self.data),
            (QuantKind::Int8, Some(scales)) => Ok(crate::int8::dequantize(&self.data, scales)),
            (QuantKind::Int8, None) => Err(io("int8 rows without their scales".into())),
        }
    }
}

impl Weights for Checkpoint {
    fn source(&self) -> String {
        self.dir.display().to_string()
    }

    /// Every tensor's name but the scales of int8 rows (part of their weight's entry); a
    /// packed int4 weight under its weight's name, not its parts'.
    fn names(&self) -> Vec<String> {
        use crate::compressed::{PACKED_SUFFIX, SHAPE_SUFFIX};
        let scale = |name: &String| format!("{name}{}", crate::save::SCALE_SUFFIX);
        let mut parts: BTreeSet<String> = (self.entries.iter())
            .filter(|(_, e)| e.kind == Some(QuantKind::Int8))
            .map(|(name, _)| scale(name))
            .collect();
        for name in self.packed.keys() {
            parts.extend([
                scale(name),
                format!("{name}{PACKED_SUFFIX}"),
                format!("{name}{SHAPE_SUFFIX}"),
            ]);
        }
        let mut names: Vec<String> =
            self.entries.keys().filter(|n| !parts.contains(*n)).cloned().collect();
        names.extend(self.packed.keys().cloned());
        names.sort();
        names
    }

    /// The stored shape, or for blocks and packed weights the shape of the values they hold.
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        if let Some(p) = self.packed.get(name) {
            return Some(vec![p.out, p.inp]);
        }
        let entry = self.entries.get(name)?;
        match (entry.kind, entry.shape.as_slice()) {
            (Some(QuantKind::Blocks(kind)), &[rows, row_bytes]) => {
                let (values, size) = kind.block()?;
                Some(vec![rows, row_bytes / size * values])
            }
            _ => Some(entry.shape.clone()),
        }
    }

    /// The stored tensor, or for a quantized one its values dequantized to f32.
    fn tensor_on(&self, name: &str, device: Device) -> Result<Tensor> {
        if let Some(p) = self.packed.get(name) {
            let (packed, scales) = self.packed_parts(name)?;
            return Ok(Tensor::from_vec(p.values(packed, &scales), [p.out, p.inp]).to(device));
        }
        match self.quantized(name)? {
            Some(stored) => Ok(stored.dequantize()?.to(device)),
            None => Checkpoint::tensor_on(self, name, device),
        }
    }

    /// Blocks or int8 rows as stored; a packed int4 weight as the Q4_0 blocks of the same
    /// values, where they can hold them (else it loads dequantized, with a warning).
    fn quantized(&self, name: &str) -> Result<Option<StoredWeight>> {
        if let Some(p) = self.packed.get(name) {
            let (packed, scales) = self.packed_parts(name)?;
            return Ok(match p.q4_0(packed, &scales) {
                Ok(blocks) => Some(StoredWeight {
                    kind: QuantKind::Blocks(kiln_runtime::quant::GgmlType::Q4_0),
                    data: Tensor::from_vec(blocks, [p.out, p.inp / 32 * 18]),
                    scales: None,
                }),
                Err(why) => {
                    eprintln!(
                        "kiln: warning: {}: {name} loads dequantized, not kept: {why}",
                        self.dir.display()
                    );
                    None
                }
            });
        }
        let Some(kind) = self.entries.get(name).and_then(|e| e.kind) else { return Ok(None) };
        let data = Checkpoint::tensor_on(self, name, Device::Cpu)?;
        let scales = match kind {
            QuantKind::Int8 => {
                let scale = format!("{name}{}", crate::save::SCALE_SUFFIX);
                let scales = Checkpoint::tensor_on(self, &scale, Device::Cpu)?;
                Some(scales.try_reshape(&[-1])?.to_dtype(DType::F32).contiguous())
            }
            QuantKind::Blocks(_) => None,
        };
        Ok(Some(StoredWeight { kind, data, scales }))
    }
}

/// Takes a model's tensors out of its [`Weights`] by name, converting each to the
/// options' dtype and device, and collects every problem for one error at the end.
pub struct Loader<'a> {
    weights: &'a dyn Weights,
    options: LoadOptions,
    taken: BTreeSet<String>,
    problems: Vec<String>,
    /// The parameters handed out, computed (converted, moved) together by `finish`.
    loaded: Vec<Tensor>,
}

impl<'a> Loader<'a> {
    /// A loader over `weights`.
    pub fn new(weights: &'a dyn Weights, options: LoadOptions) -> Loader<'a> {
        Loader {
            weights,
            options,
            taken: BTreeSet::new(),
            problems: Vec::new(),
            loaded: Vec::new(),
        }
    }

    /// The weights it loads from.
    pub fn weights(&self) -> &dyn Weights {
        self.weights
    }

    /// The tensor `name`, which the model expects of shape `shape`, as a parameter (the
    /// options' dtype and device). A problem is noted and zeros of `shape` stand in, so
    /// that loading goes on and [`Loader::finish`] reports every problem at once.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Tensor {
        self.taken.insert(name.to_string());
        let stand_in =
            || Tensor::zeros(shape.to_vec()).to_dtype(self.options.dtype).to(self.options.device);
        let Some(stored) = self.weights.shape(name) else {
            self.problems.push(format!("missing: {name} (the model expects {shape:?})"));
            return stand_in();
        };
        if stored != shape {
            self.problems.push(format!(
                "{name}: the checkpoint holds shape {stored:?}, the model (config.json) expects {shape:?}"
            ));
            return stand_in();
        }
        // Stored bytes go to the device once; a conversion runs there, when `finish`
        // computes every parameter.
        match self.weights.tensor_on(name, self.options.device) {
            Ok(t) if t.dtype().is_float() => {
                let t = t.to_dtype(self.options.dtype).detach();
                self.loaded.push(t.clone());
                t
            }
            Ok(t) => {
                self.problems
                    .push(format!("{name}: stored as {}, a float parameter expected", t.dtype()));
                stand_in()
            }
            Err(e) => {
                self.problems.push(e.to_string());
                stand_in()
            }
        }
    }

    /// A projection's weight `[out, inp]`: as stored, with how, when the options keep
    /// quantized weights and the weights hold it so ([`Loader::take_quantized`]), else
    /// [`Loader::take`].
    pub(crate) fn take_projection(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> (Tensor, Option<Quantized>) {
        match self.take_quantized(name, out, inp) {
            Some((data, q)) => (data, Some(q)),
            None => (self.take(name, &[out, inp]), None),
        }
    }

    /// `name` (a weight `[out, inp]`) as stored quantized, read once, when the options keep
    /// quantized weights and the weights hold it so; else nothing is taken.
    pub(crate) fn take_quantized(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Option<(Tensor, Quantized)> {
        if !self.options.keep_quantized
            || self.weights.shape(name).as_deref() != Some(&[out, inp][..])
        {
            return None;
        }
        match self.weights.quantized(name) {
            Ok(Some(StoredWeight { kind, data, scales })) => {
                let device = self.options.device;
                let (data, scales) = (data.to(device), scales.map(|s| s.to(device)));
                self.taken.insert(name.to_string());
                self.loaded.extend([Some(data.clone()), scales.clone()].into_iter().flatten());
                let activations = self.options.activations;
                Some((data, Quantized { kind, activations, scales }))
            }
            Ok(None) => None,
            Err(e) => {
                self.problems.push(e.to_string());
                None
            }
        }
    }

    /// [`Loader::take`] of a matrix stored `[rows, cols]`, returned transposed and
    /// contiguous (`[cols, rows]`): GPT-2's `Conv1D` weights become `Linear` ones.
    pub fn take_transposed(&mut self, name: &str, stored: [usize; 2]) -> Tensor {
        let t = self.take(name, &stored).t().contiguous();
        self.loaded.push(t.clone());
        t
    }

    /// Marks `name` as known but not a parameter (a buffer transformers saves, such as
    /// GPT-2's causal mask): it is neither loaded nor reported as unexpected.
    pub fn skip(&mut self, name: &str) {
        self.taken.insert(name.to_string());
    }

    /// Ends loading: every problem noted, and every tensor of the checkpoint the model did
    /// not take, in one [`Error::Load`]; otherwise the parameters are computed (converted
    /// and moved), so that a model's first call finds them stored, as every later one does.
    ///
    /// # Errors
    /// [`Error::Load`], one line per problem, when there were any; the conversion's errors
    /// (out of memory).
    pub fn finish(self) -> Result<()> {
        let mut problems = self.problems;
        for name in self.weights.names() {
            if !self.taken.contains(&name) {
                problems.push(format!("unexpected: {name} (in the checkpoint, not in the model)"));
            }
        }
        if problems.is_empty() {
            let loaded: Vec<&Tensor> = self.loaded.iter().collect();
            return Tensor::try_realize_all(&loaded);
        }
        Err(Error::Load { detail: format!("{}:\n{}", self.weights.source(), problems.join("\n")) })
    }
}
