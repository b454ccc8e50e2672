// mimalloc: glibc malloc spends a large share of the train step in page faults
// (`sweep::cli` tunes it for training).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sweep::cli::main()
}
