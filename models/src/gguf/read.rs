//! The GGUF parser: every count, length, offset and size is checked against the bytes that
//! remain before anything is allocated or read, so a truncated or lying file is an error
//! naming what it claimed, never a panic, an out-of-bounds read or an allocation larger
//! than the file.

use std::collections::BTreeMap;
use std::ops::Range;

use kiln_runtime::quant::GgmlType;

use super::value::{Array, Value};

/// One tensor's entry in a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its GGML type.
    pub kind: GgmlType,
    /// Its shape, outermost first as kiln and PyTorch write it (GGUF lists dimensions
    /// innermost first: a `[rows, cols]` matrix is stored with `ne = [cols, rows]`).
    pub shape: Vec<usize>,
    /// Where its data lies in the file.
    pub bytes: Range<usize>,
}

/// A parsed header.
pub(super) struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
}

/// The dimensions a GGML tensor has at most.
const MAX_DIMS: u32 = 4;
/// How deeply metadata arrays may nest (GGUF writers use one level).
const MAX_NESTING: usize = 4;
/// The alignment of tensor data when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: usize = 32;

/// A reading position in the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The next `n` bytes, or an error naming `what` needed them.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], String> {
        let left = self.left();
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let b = &self.bytes[self.at..self.at + n];
                self.at += n;
                Ok(b)
            }
            _ => Err(format!(
                "truncated: {} at byte {} needs {n} bytes, the file has {left} left",
                what(),
                self.at
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], String> {
        Ok(self.take(N as u64, what)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let bytes = self.take(len, &|| format!("{} ({len} bytes)", what()))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{} is not UTF-8", what()))
    }

    /// `count` elements of `N` bytes each, converted by `from`: their bytes are checked to
    /// be there before the vector is allocated.
    fn numbers<const N: usize, T>(
        &mut self,
        count: u64,
        from: fn([u8; N]) -> T,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<T>, String> {
        let bytes = count
            .checked_mul(N as u64)
            .ok_or_else(|| format!("{}: {count} elements overflow", what()))?;
        let data = self.take(bytes, what)?;
        Ok(data.chunks_exact(N).map(|c| from(c.try_into().expect("chunks of N"))).collect())
    }
}

/// The fewest bytes one value of GGUF type `kind` takes (an empty string: its length; an
/// empty array: its type and count), to bound a count by the bytes left.
fn least_bytes(kind: u32) -> Option<u64> {
    Some(match kind {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn bool_of(b: u8, what: &dyn Fn() -> String) -> Result<bool, String> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(format!("{} is a bool stored as {b}, not 0 or 1", what())),
    }
}

fn unknown_type(kind: u32, what: &dyn Fn() -> String) -> String {
    format!("{} has value type {kind}, which GGUF does not define (0 to 12)", what())
}

fn value(c: &mut Cursor<'_>, kind: u32, what: &dyn Fn() -> String) -> Result<Value, String> {
    Ok(match kind {
        0 => Value::U8(u8::from_le_bytes(c.array(what)?)),
        1 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        2 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        4 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        5 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        7 => Value::Bool(bool_of(c.array::<1>(what)?[0], what)?),
        8 => Value::String(c.string(what)?),
        9 => Value::Array(array(c, 1, what)?),
        10 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        11 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        _ => return Err(unknown_type(kind, what)),
    })
}

fn array(c: &mut Cursor<'_>, depth: usize, what: &dyn Fn() -> String) -> Result<Array, String> {
    if depth > MAX_NESTING {
        return Err(format!("{} nests arrays deeper than {MAX_NESTING} levels", what()));
    }
    let kind = c.u32(&|| format!("the element type of {}", what()))?;
    let count = c.u64(&|| format!("the length of {}", what()))?;
    let least = least_bytes(kind).ok_or_else(|| unknown_type(kind, what))?;
    if count > c.left() as u64 / least {
        return Err(format!(
            "{} claims {count} elements of at least {least} bytes, the file has {} left",
            what(),
            c.left()
        ));
    }
    let n = count as usize;
    let element = |i: usize| format!("{}[{i}]", what());
    Ok(match kind {
        0 => Array::U8(c.numbers(count, u8::from_le_bytes, what)?),
        1 => Array::I8(c.numbers(count, i8::from_le_bytes, what)?),
        2 => Array::U16(c.numbers(count, u16::from_le_bytes, what)?),
        3 => Array::I16(c.numbers(count, i16::from_le_bytes, what)?),
        4 => Array::U32(c.numbers(count, u32::from_le_bytes, what)?),
        5 => Array::I32(c.numbers(count, i32::from_le_bytes, what)?),
        6 => Array::F32(c.numbers(count, f32::from_le_bytes, what)?),
        7 => Array::Bool(
            c.numbers(count, |[b]: [u8; 1]| b, what)?
                .into_iter()
                .enumerate()
                .map(|(i, b)| bool_of(b, &|| element(i)))
                .collect::<Result<_, _>>()?,
        ),
        8 => Array::String((0..n).map(|i| c.string(&|| element(i))).collect::<Result<_, _>>()?),
        9 => Array::Array(
            (0..n).map(|i| array(c, depth + 1, &|| element(i))).collect::<Result<_, _>>()?,
        ),
        10 => Array::U64(c.numbers(count, u64::from_le_bytes, what)?),
        11 => Array::I64(c.numbers(count, i64::from_le_bytes, what)?),
        12 => Array::F64(c.numbers(count, f64::from_le_bytes, what)?),
        _ => return Err(unknown_type(kind, what)),
    })
}

/// Reads the header of a GGUF file (versions 2 and 3, little-endian) and checks every
/// tensor's data against the file.
pub(super) fn header(bytes: &[u8]) -> Result<Header, String> {
    let mut c = Cursor { bytes, at: 0 };
    let magic = c.array::<4>(&|| "the magic number".into())?;
    if &magic != b"GGUF" {
        return Err(format!("not a GGUF file (it starts with {magic:?}, not \"GGUF\")"));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() <= 3 => {
            return Err("a big-endian GGUF file: kiln reads little-endian ones".into());
        }
        v => return Err(format!("GGUF version {v}: kiln reads versions 2 and 3")),
    }
    let tensor_count = c.u64(&|| "the tensor count".into())?;
    let key_count = c.u64(&|| "the metadata count".into())?;
    // A key is at least its length, a type and one byte; a tensor at least its name's
    // length, its dimension count, one dimension, its type and its offset.
    for (count, least, what) in [(key_count, 13, "metadata entries"), (tensor_count, 32, "tensors")]
    {
        if count > c.left() as u64 / least {
            return Err(format!(
                "the header claims {count} {what}, which need at least {least} bytes each; the file has {} left",
                c.left()
            ));
        }
    }
    let mut metadata = BTreeMap::new();
    for i in 0..key_count {
        let key = c.string(&|| format!("the key of metadata entry {i}"))?;
        let what = || format!("the value of {key:?}");
        let kind = c.u32(&|| format!("the type of {key:?}"))?;
        let v = value(&mut c, kind, &what)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(format!("the metadata key {key:?} appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a as usize,
        Some(v) => {
            return Err(format!("general.alignment is {v:?}: it should be a uint32 power of two"));
        }
    };
    let mut tensors = Vec::new();
    let mut offsets = Vec::new();
    for i in 0..tensor_count {
        let (t, offset) = tensor_info(&mut c, i)?;
        tensors.push(t);
        offsets.push(offset);
    }
    let data_start = c.at.div_ceil(alignment).saturating_mul(alignment);
    place(&mut tensors, &offsets, data_start, alignment, bytes.len())?;
    Ok(Header { version, metadata, tensors, alignment })
}

/// One tensor's name, shape and type (its `bytes` are `0..size` until [`place`]d) and its
/// offset in the data section; its size is checked to be a whole number of blocks.
fn tensor_info(c: &mut Cursor<'_>, i: u64) -> Result<(TensorInfo, u64), String> {
    let name = c.string(&|| format!("the name of tensor {i}"))?;
    let dims = c.u32(&|| format!("the dimension count of {name:?}"))?;
    if !(1..=MAX_DIMS).contains(&dims) {
        return Err(format!("{name:?} has {dims} dimensions: GGUF tensors have 1 to {MAX_DIMS}"));
    }
    let mut ne = Vec::new();
    for d in 0..dims {
        ne.push(c.u64(&|| format!("dimension {d} of {name:?}"))?);
    }
    let kind = GgmlType(c.u32(&|| format!("the type of {name:?}"))?);
    let offset = c.u64(&|| format!("the offset of {name:?}"))?;
    let Some((block, _)) = kind.block() else {
        return Err(format!("{name:?} has tensor type {}, which GGML does not define", kind.0));
    };
    let shape: Vec<usize> =
        ne.iter().rev().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
    let values = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let size = values.and_then(|n| kind.bytes_of(n));
    let (Some(size), true) = (size, ne[0] % block as u64 == 0) else {
        return Err(format!(
            "{name:?} of shape {shape:?} cannot be stored as {kind}: rows of {} values are not whole blocks of {block}, or its size overflows",
            ne[0]
        ));
    };
    Ok((TensorInfo { name, kind, shape, bytes: 0..size }, offset))
}

/// Turns the tensors' offsets into byte ranges of the file and checks them: aligned, inside
/// the file, not overlapping, names unique.
fn place(
    tensors: &mut [TensorInfo],
    offsets: &[u64],
    data_start: usize,
    alignment: usize,
    file_len: usize,
) -> Result<(), String> {
    for (t, &offset) in tensors.iter_mut().zip(offsets) {
        if !offset.is_multiple_of(alignment as u64) {
            return Err(format!(
                "{:?} starts at offset {offset}, which is not a multiple of the alignment {alignment}",
                t.name
            ));
        }
        let start = usize::try_from(offset).ok().and_then(|o| data_start.checked_add(o));
        let end = start.and_then(|s| s.checked_add(t.bytes.len()));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.bytes = start..end,
            _ => {
                return Err(format!(
                    "truncated: {:?} ({} bytes at offset {offset} of the data, which starts at byte {data_start}) ends past the file's {file_len} bytes",
                    t.name,
                    t.bytes.len()
                ));
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.bytes.start, t.bytes.end));
    for pair in order.windows(2) {
        if pair[1].bytes.start < pair[0].bytes.end {
            return Err(format!(
                "{:?} (bytes {:?}) overlaps {:?} (bytes {:?})",
                pair[1].name, pair[1].bytes, pair[0].name, pair[0].bytes
            ));
        }
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|p| p[0] == p[1]) {
        return Err(format!("the tensor {:?} appears twice", pair[0]));
    }
    Ok(())
}
