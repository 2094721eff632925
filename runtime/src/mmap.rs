//! Read-only memory maps of files, for checkpoint loaders: the one `unsafe` call a loader
//! needs lives here, so the crates above stay free of `unsafe`.

use std::fs::File;
use std::path::Path;

/// A file mapped read-only into memory: its bytes are read from the page cache on first
/// touch, with no copy into the process first.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps the file at `path`.
    ///
    /// # Errors
    /// The operating system's, when the file cannot be opened or mapped.
    pub fn open(path: &Path) -> std::io::Result<MappedFile> {
        let file = File::open(path)?;
        // SAFETY: the map is read-only. Another process truncating or rewriting the file
        // while it is mapped would change or fault these bytes, as with every loader that
        // maps checkpoints (safetensors' own, candle's); callers check each range they read
        // against the length mapped here, so a file that is simply too short is an error.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(MappedFile { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedFile({} bytes)", self.map.len())
    }
}
