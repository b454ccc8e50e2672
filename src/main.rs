// mimalloc: glibc malloc spends a large share of the train step in page faults.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (mimalloc.h).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // Never hand freed memory back to the OS: every train step frees and
    // allocates the same large activations and gradients again, and purged
    // pages come back through page faults the kernel must zero (~10% of the
    // step on the speed-goal model). The peak RSS is the same either way.
    // SAFETY: setting an option is thread-safe and valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    sweep::cli::main()
}
