//! The process heap's settings when device buffers live in it (a host-memory plugin such as
//! XLA CPU): large buffers are reused from the heap instead of mapped, faulted in and unmapped
//! again on every allocation.
//!
//! XLA CPU allocates each execution's results and scratch with the C allocator, often on threads
//! of its own. glibc serves a request above its mmap threshold (128 KiB until a mapped block is
//! freed, 32 MiB at most) with a fresh mapping, and a thread arena that outgrows its heap gives the
//! new heap back as soon as it empties. Either way a 16 MiB result is page-faulted in (and zeroed
//! by the kernel) on every step: measured here, two thirds of an op-by-op chain's time over 4M
//! floats (RFC 0017).

/// Free space an arena keeps at its top instead of returning it, and below which a thread
/// arena keeps an emptied heap: a whole heap, so a heap that held a result is not given back
/// only to be mapped again by the next step.
const TOP_PAD: i32 = 64 << 20;

/// No block gets a mapping of its own (glibc maps blocks above a threshold of at most 32 MiB, and
/// unmaps them on free): results and an executable's scratch, which XLA allocates per run and
/// which can exceed any threshold, come from the heaps and are reused.
const MMAP_MAX: i32 = 0;

/// Whether the process heap has been set up for device buffers (at most once per process).
static CONFIGURED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether a plugin's device buffers are host heap memory: XLA's CPU client names its
/// platform "cpu"; device plugins allocate device memory with their own allocators.
pub fn buffers_live_in_host_heap(platform_name: &str) -> bool {
    platform_name.eq_ignore_ascii_case("cpu")
}

/// Sets the heap up for device-buffer-sized blocks, once per process; returns whether it is
/// set up (false where the C library has no such settings).
pub fn configure_for_device_buffers() -> bool {
    *CONFIGURED.get_or_init(apply)
}

/// Whether [`configure_for_device_buffers`] has set the heap up in this process.
pub fn configured() -> bool {
    CONFIGURED.get().copied().unwrap_or(false)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt takes plain integers and updates glibc's settings under the main
    // arena's lock; any thread may call it at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, MMAP_MAX) == 1
            && libc::mallopt(libc::M_TOP_PAD, TOP_PAD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    let _ = (MMAP_MAX, TOP_PAD);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_host_memory_platforms_qualify() {
        assert!(buffers_live_in_host_heap("cpu"));
        assert!(!buffers_live_in_host_heap("cuda"));
        assert!(!buffers_live_in_host_heap("tpu"));
    }
}
