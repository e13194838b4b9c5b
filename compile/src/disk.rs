//! Tiers 2 and 3 on disk: the entry file format, atomic writes, validated reads and per-key
//! file locks.
//!
//! An entry is `<dir>/<key>.pjrt`: a fixed header (magic, format version, the key, the payload
//! length and its xxh3 checksum) followed by the serialized executable. A read that finds
//! anything else — a short file, a flipped bit, another key's entry, a directory — reports it as
//! invalid, so the caller treats it as a miss and rewrites it; a corrupt payload never reaches
//! the plugin's deserializer. Writers go through a temp file in the same directory and a rename,
//! so readers see either the old entry or the new one, whole. Files are not fsync'ed: after a
//! power loss the checksum turns a torn entry into a miss.

use crate::key::CacheKey;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"TPJRTEXE";
const FORMAT_VERSION: u32 = 1;
/// magic, version, reserved, three key words, payload length, payload checksum.
pub const HEADER_BYTES: usize = 8 + 4 + 4 + 3 * 8 + 8 + 8;

/// Why an entry file was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("the entry is {0} bytes, shorter than its {HEADER_BYTES}-byte header")]
    Short(usize),
    #[error("the entry does not start with the cache magic")]
    BadMagic,
    #[error("the entry has format version {0}, expected {FORMAT_VERSION}")]
    BadVersion(u32),
    #[error("the entry belongs to key {0}")]
    ForeignKey(CacheKey),
    #[error("the entry's payload is {got} bytes, its header says {expected}")]
    BadLength { expected: u64, got: u64 },
    #[error("the entry's payload checksum does not match")]
    BadChecksum,
}

/// The bytes of an entry file holding `payload` (a serialized executable) for `key`.
pub fn encode_entry(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for word in [key.shapeless, key.dims, key.options] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of an entry file, after checking its header against `key`.
pub fn decode_entry<'a>(key: &CacheKey, bytes: &'a [u8]) -> Result<&'a [u8], EntryError> {
    if bytes.len() < HEADER_BYTES {
        return Err(EntryError::Short(bytes.len()));
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    if &bytes[..8] != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(EntryError::BadVersion(version));
    }
    let stored = CacheKey::new(u64_at(16), u64_at(24), u64_at(32));
    if stored != *key {
        return Err(EntryError::ForeignKey(stored));
    }
    let expected = u64_at(40);
    let payload = &bytes[HEADER_BYTES..];
    if payload.len() as u64 != expected {
        return Err(EntryError::BadLength {
            expected,
            got: payload.len() as u64,
        });
    }
    if xxh3_64(payload) != u64_at(48) {
        return Err(EntryError::BadChecksum);
    }
    Ok(payload)
}

/// What a tier read found.
pub(crate) enum EntryRead {
    Missing,
    Found(Vec<u8>),
    /// Unreadable or rejected: a miss whose entry should be rewritten.
    Invalid(String),
}

/// One cache directory (tier 2 or tier 3), already versioned by its name.
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
}

impl DiskTier {
    pub(crate) fn open(dir: PathBuf) -> io::Result<DiskTier> {
        std::fs::create_dir_all(&dir)?;
        Ok(DiskTier { dir })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{key}.pjrt"))
    }

    pub(crate) fn read(&self, key: &CacheKey) -> EntryRead {
        let path = self.entry_path(key);
        match std::fs::read(&path) {
            Ok(bytes) => match decode_entry(key, &bytes) {
                Ok(payload) => EntryRead::Found(payload.to_vec()),
                Err(e) => EntryRead::Invalid(format!("{}: {e}", path.display())),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => EntryRead::Missing,
            Err(e) => EntryRead::Invalid(format!("{}: {e}", path.display())),
        }
    }

    /// Writes the entry atomically; returns the bytes written.
    pub(crate) fn write(&self, key: &CacheKey, payload: &[u8]) -> io::Result<u64> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let bytes = encode_entry(key, payload);
        let temp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = File::create(&temp)?;
            file.write_all(&bytes)?;
            drop(file);
            std::fs::rename(&temp, self.entry_path(key))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map(|()| bytes.len() as u64)
    }

    /// Removes the least recently written entries until the entries' bytes are at most
    /// `max_bytes`; returns how many went. Other processes may be writing: a file that is gone
    /// by the time it is removed is skipped.
    pub(crate) fn trim_to(&self, max_bytes: u64) -> io::Result<u64> {
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "pjrt") {
                continue;
            }
            if let Ok(meta) = entry.metadata() {
                let written = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                entries.push((written, meta.len(), path));
            }
        }
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        entries.sort();
        let mut removed = 0;
        for (_, len, path) in entries {
            if total <= max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
            total = total.saturating_sub(len);
        }
        Ok(removed)
    }

    /// Blocks until this process holds the key's exclusive lock (`flock` on `<key>.lock`). The
    /// lock files stay: removing one would race with a process about to lock it.
    pub(crate) fn lock(&self, key: &CacheKey) -> io::Result<KeyLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(format!("{key}.lock")))?;
        flock(&file, libc::LOCK_EX)?;
        Ok(KeyLock { file })
    }
}

fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor this function borrows for the call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// A held per-key lock; released on drop (and by the kernel if the process dies).
pub(crate) struct KeyLock {
    file: File,
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let _ = flock(&self.file, libc::LOCK_UN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reject_damage() {
        let key = CacheKey::new(1, 2, 3);
        let bytes = encode_entry(&key, b"payload");
        assert_eq!(decode_entry(&key, &bytes), Ok(&b"payload"[..]));
        assert_eq!(decode_entry(&key, &bytes[..10]), Err(EntryError::Short(10)));
        assert!(matches!(
            decode_entry(&key, &bytes[..bytes.len() - 1]),
            Err(EntryError::BadLength { .. })
        ));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_entry(&key, &flipped), Err(EntryError::BadChecksum));
        let other = CacheKey::new(1, 2, 4);
        assert_eq!(
            decode_entry(&other, &bytes),
            Err(EntryError::ForeignKey(key))
        );
        let mut magic = bytes.clone();
        magic[0] = b'x';
        assert_eq!(decode_entry(&key, &magic), Err(EntryError::BadMagic));
    }

    #[test]
    fn a_directory_reads_back_what_it_wrote() {
        let root = tempfile::tempdir().unwrap();
        let tier = DiskTier::open(root.path().join("tier")).unwrap();
        let key = CacheKey::new(7, 8, 9);
        assert!(matches!(tier.read(&key), EntryRead::Missing));
        tier.write(&key, b"abc").unwrap();
        assert!(matches!(tier.read(&key), EntryRead::Found(p) if p == b"abc"));
        let _lock = tier.lock(&key).unwrap();
        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(tier.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }
}
