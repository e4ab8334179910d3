//! Compiled plugins kept on disk by content hash, so a restart (or a reload
//! that did not change a plugin) does not compile it again.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where compiled components live; files are named by the hash of the
/// `.wasm` bytes and of the engine settings they were compiled for.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
}

/// How a component was obtained, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cached,
}

impl ComponentCache {
    pub fn new(dir: PathBuf) -> ComponentCache {
        ComponentCache { dir }
    }

    /// The compiled form of `wasm`, from the cache when it holds one for this
    /// engine, else compiled now and stored. A cache that cannot be written
    /// only costs a compile at the next start.
    // SAFETY: the one unsafe call, `Component::deserialize_file`, is explained
    // where it is made.
    #[allow(
        unsafe_code,
        reason = "deserializing a component we compiled and cached ourselves"
    )]
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<(Component, Origin)> {
        let file = self.dir.join(format!(
            "{}-{:016x}.cwasm",
            hex::encode(Sha256::digest(wasm)),
            engine_hash(engine)
        ));
        if file.exists() {
            // SAFETY: the cache directory is the hub's own; files in it were
            // written by `Component::serialize` of an engine with the same
            // compatibility hash (it is part of the name). Anything else that
            // fails to load is recompiled below.
            match unsafe { Component::deserialize_file(engine, &file) } {
                Ok(component) => return Ok((component, Origin::Cached)),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "ignoring an unusable cached plugin")
                }
            }
        }
        let component = Component::new(engine, wasm)?;
        if let Err(e) = store(&file, &component) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot cache a compiled plugin");
            return Ok((component, Origin::Compiled));
        }
        // The stored copy, not the one just compiled: its code is then
        // pages of the file, as after a restart, instead of heap the
        // process keeps (a first start with the six example plugins held
        // ~20 MB more than the next; docs/performance.md, item 28).
        // SAFETY: as above; the file was written by this engine just now.
        match unsafe { Component::deserialize_file(engine, &file) } {
            Ok(stored) => Ok((stored, Origin::Compiled)),
            Err(_) => Ok((component, Origin::Compiled)),
        }
    }
}

/// Gives the memory compiling used back to the system. Cranelift's work
/// is freed when a compile ends, but glibc's allocator keeps freed heap
/// for later allocations, and a hub that compiled its plugins at start
/// would hold it for good.
pub fn release_compile_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only returns free pages of glibc's heaps to
        // the kernel; it touches no memory in use.
        #[allow(unsafe_code, reason = "malloc_trim after compiling")]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

fn store(file: &Path, component: &Component) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = component.serialize()?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written aside and renamed so a concurrent start never reads half a file.
    let partial = file.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, file)?;
    Ok(())
}

fn engine_hash(engine: &Engine) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    h.finish()
}
