// mimalloc: glibc malloc spends a large share of the train step in page faults.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (mimalloc.h).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // Training never hands freed memory back to the OS: every train step
    // frees and allocates the same large activations and gradients again,
    // and purged pages come back through page faults the kernel must zero
    // (~10% of the step on the speed-goal model); its peak RSS is the same
    // either way. Streaming commands (pretokenize) free buffers of many
    // sizes and keep mimalloc's default, which returns them.
    if matches!(subcommand().as_deref(), Some("train" | "bench")) {
        // SAFETY: setting an option is thread-safe and valid at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    sweep::cli::main()
}

/// The first word of the command line that is not an option (`-C DIR` and
/// `--root DIR` take the word after them).
fn subcommand() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-C" | "--root" => {
                args.next();
            }
            a if a.starts_with('-') => {}
            _ => return Some(a),
        }
    }
    None
}
