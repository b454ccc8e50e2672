//! Every kernel checked without a GPU (`scripts/check-gpu-offline.sh` runs
//! this with NVRTC and `cuobjdump` from NVIDIA's PyPI wheels): each source
//! compiled by NVRTC exactly as the trainer compiles it at run time (the
//! same program text, the same options), for every architecture the
//! trainer meets; in each CUBIN, exactly the table's entry points, each with
//! parameters of the table's sizes at the offsets a launch fills; no
//! register spills, no stack, and static shared memory within a block's.
//!
//! `SWEEP_NVRTC` names `libnvrtc.so` and `SWEEP_CUOBJDUMP` the `cuobjdump`
//! binary; without them the test says it is skipped, and fails where
//! `SWEEP_REQUIRE_GPU_OFFLINE` is set (as the script sets it).

use super::{nvrtc_options, program, Arg, KERNELS, SOURCES};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// The architectures checked: A100 and H100/GH200 (what the trainer is
/// built for), and Blackwell where the NVRTC has it.
const ARCHS: [(i32, i32); 3] = [(8, 0), (9, 0), (10, 0)];

/// The most static shared memory a block may hold without opting in (48 KiB).
const MAX_STATIC_SHARED: u64 = 48 << 10;

/// The most registers a thread of a 256-thread block may use (64K per SM).
const MAX_REGISTERS: u64 = 255;

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;

/// NVRTC's C API (nvrtc.h), from its shared library.
struct Nvrtc {
    create: CreateFn,
    compile: CompileFn,
    log_size: SizeFn,
    log: BytesFn,
    cubin_size: SizeFn,
    cubin: BytesFn,
    destroy: DestroyFn,
    archs: Vec<i32>,
}

/// `dlopen` (its builtins library first, from the same folder: NVRTC opens
/// it by name at its first compile) and `dlsym` of every function used.
fn load(path: &Path) -> Result<Nvrtc, String> {
    let open = |p: &Path| -> Result<*mut c_void, String> {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated path; the handle is kept for the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            // SAFETY: dlerror's string is valid until the next dl* call.
            let why = unsafe { CStr::from_ptr(libc::dlerror()) };
            return Err(format!("dlopen {}: {}", p.display(), why.to_string_lossy()));
        }
        Ok(h)
    };
    if let Some(dir) = path.parent() {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.") {
                open(&e.path())?;
            }
        }
    }
    let h = open(path)?;
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).expect("no NUL in a symbol name");
        // SAFETY: a handle from dlopen and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        match p.is_null() {
            true => Err(format!("{} has no {name}", path.display())),
            false => Ok(p),
        }
    };
    // SAFETY: each symbol is the NVRTC function of that name, whose C
    // signature is the type it is transmuted to (nvrtc.h).
    unsafe {
        let mut nvrtc = Nvrtc {
            create: std::mem::transmute::<*mut c_void, CreateFn>(sym("nvrtcCreateProgram")?),
            compile: std::mem::transmute::<*mut c_void, CompileFn>(sym("nvrtcCompileProgram")?),
            log_size: std::mem::transmute::<*mut c_void, SizeFn>(sym("nvrtcGetProgramLogSize")?),
            log: std::mem::transmute::<*mut c_void, BytesFn>(sym("nvrtcGetProgramLog")?),
            cubin_size: std::mem::transmute::<*mut c_void, SizeFn>(sym("nvrtcGetCUBINSize")?),
            cubin: std::mem::transmute::<*mut c_void, BytesFn>(sym("nvrtcGetCUBIN")?),
            destroy: std::mem::transmute::<*mut c_void, DestroyFn>(sym("nvrtcDestroyProgram")?),
            archs: Vec::new(),
        };
        let num = std::mem::transmute::<*mut c_void, CountFn>(sym("nvrtcGetNumSupportedArchs")?);
        let list = std::mem::transmute::<*mut c_void, CountFn>(sym("nvrtcGetSupportedArchs")?);
        let mut n: c_int = 0;
        if num(&mut n) == 0 && n > 0 {
            let mut archs = vec![0 as c_int; n as usize];
            if list(archs.as_mut_ptr()) == 0 {
                nvrtc.archs = archs;
            }
        }
        Ok(nvrtc)
    }
}

impl Nvrtc {
    /// The CUBIN of `text` compiled with `options`, or NVRTC's log.
    fn compile(&self, text: &str, name: &str, options: &[String]) -> Result<Vec<u8>, String> {
        let src = CString::new(text).map_err(|e| e.to_string())?;
        let name = CString::new(name).map_err(|e| e.to_string())?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("no NUL in an option"))
            .collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: NVRTC's API as documented: a program is created, compiled,
        // read and destroyed once; buffers are sized as NVRTC reports.
        unsafe {
            let r = (self.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if r != 0 {
                return Err(format!("nvrtcCreateProgram: error {r}"));
            }
            let r = (self.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let mut size = 0usize;
            let mut log = String::new();
            if (self.log_size)(prog, &mut size) == 0 && size > 1 {
                let mut buf = vec![0u8; size];
                if (self.log)(prog, buf.as_mut_ptr().cast()) == 0 {
                    log = String::from_utf8_lossy(&buf[..size - 1]).into_owned();
                }
            }
            let out = if r != 0 {
                Err(format!("nvrtcCompileProgram: error {r}\n{log}"))
            } else if !log.trim().is_empty() {
                // A warning is a failure: the trainer's kernels compile clean.
                Err(format!("NVRTC warned:\n{log}"))
            } else {
                let mut size = 0usize;
                if (self.cubin_size)(prog, &mut size) != 0 {
                    Err("nvrtcGetCUBINSize failed".to_string())
                } else {
                    let mut bin = vec![0u8; size];
                    match (self.cubin)(prog, bin.as_mut_ptr().cast()) {
                        0 => Ok(bin),
                        r => Err(format!("nvrtcGetCUBIN: error {r}")),
                    }
                }
            };
            (self.destroy)(&mut prog);
            out
        }
    }
}

/// One entry point of a CUBIN as `cuobjdump` lists it: its parameters'
/// (offset, size) by ordinal, and its resource usage.
#[derive(Debug, Default, Clone, PartialEq)]
struct Compiled {
    params: Vec<(u64, u64)>,
    registers: u64,
    stack: u64,
    shared: u64,
    local: u64,
}

/// Runs `cuobjdump` with `args` on a file; its standard output.
fn cuobjdump(tool: &Path, args: &[&str], file: &Path) -> Result<String, String> {
    let out = std::process::Command::new(tool)
        // Its disassembler (for -sass) lies beside it.
        .env("NVDISASM_PATH", tool.parent().unwrap_or(Path::new(".")))
        .args(args)
        .arg(file)
        .output()
        .map_err(|e| format!("{}: {e}", tool.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {args:?} failed: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A hex field `Name : 0x1f` of a line.
fn hex_field(line: &str, name: &str) -> Option<u64> {
    let rest = line.split(name).nth(1)?.trim_start().strip_prefix(':')?;
    let word = rest.split_whitespace().next()?;
    u64::from_str_radix(word.trim_start_matches("0x"), 16).ok()
}

/// The entry points of a CUBIN (by name), from `cuobjdump -elf` (each
/// `.nv.info.<name>` section's `EIATTR_KPARAM_INFO`: ordinal, offset, size)
/// and `--dump-resource-usage`.
fn read_cubin(tool: &Path, cubin: &Path) -> Result<Vec<(String, Compiled)>, String> {
    let elf = cuobjdump(tool, &["-elf"], cubin)?;
    let mut out: Vec<(String, Compiled)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in elf.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix(".nv.info.") {
            out.push((name.to_string(), Compiled::default()));
            current = Some(out.len() - 1);
        } else if t.starts_with('.') || t.is_empty() && current.is_none() {
            current = None;
        } else if let (Some(i), true) = (current, t.contains("Ordinal")) {
            let (Some(ord), Some(off), Some(size)) = (
                hex_field(t, "Ordinal"),
                hex_field(t, "Offset"),
                hex_field(t, "Size"),
            ) else {
                return Err(format!("cannot read `{t}`"));
            };
            let params = &mut out[i].1.params;
            if params.len() <= ord as usize {
                params.resize(ord as usize + 1, (u64::MAX, 0));
            }
            params[ord as usize] = (off, size);
        }
    }
    let usage = cuobjdump(tool, &["--dump-resource-usage"], cubin)?;
    let mut function: Option<String> = None;
    for line in usage.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("Function ") {
            function = Some(name.trim_end_matches(':').to_string());
        } else if let (Some(f), true) = (&function, t.starts_with("REG:")) {
            let field = |name: &str| -> u64 {
                t.split_whitespace()
                    .find_map(|w| w.strip_prefix(name)?.parse().ok())
                    .unwrap_or(u64::MAX)
            };
            if let Some((_, c)) = out.iter_mut().find(|(n, _)| n == f) {
                c.registers = field("REG:");
                c.stack = field("STACK:");
                c.shared = field("SHARED:");
                c.local = field("LOCAL:");
            }
        }
    }
    Ok(out)
}

/// What is wrong with one compiled entry point against the table's
/// parameters: parameters missing, of another size or where a launch does
/// not put them; spills, stack, too many registers or too much shared memory.
fn faults(name: &str, want: &[Arg], got: &Compiled) -> Vec<String> {
    let mut out = Vec::new();
    if got.params.len() != want.len() {
        out.push(format!(
            "{name}: {} parameters compiled, the table has {}",
            got.params.len(),
            want.len()
        ));
    }
    // A launch fills the parameter buffer in order, each value aligned to
    // its size.
    let mut offset = 0u64;
    for (i, (a, &(off, size))) in want.iter().zip(&got.params).enumerate() {
        let want_size = a.size() as u64;
        offset = offset.div_ceil(want_size) * want_size;
        if size != want_size || off != offset {
            out.push(format!(
                "{name}: parameter {i} is {size} bytes at offset {off}, the table's {a:?} is {want_size} bytes at {offset}"
            ));
        }
        offset += want_size;
    }
    for (what, value, most) in [
        ("local memory (spills)", got.local, 0),
        ("stack", got.stack, 0),
        ("registers", got.registers, MAX_REGISTERS),
        ("static shared memory", got.shared, MAX_STATIC_SHARED),
    ] {
        if value > most {
            out.push(format!("{name}: {what} {value}, at most {most}"));
        }
    }
    out
}

/// The wheels' tools, from the environment; None where they are not given
/// (and the check is not required).
fn tools() -> Option<(PathBuf, PathBuf)> {
    let nvrtc = std::env::var_os("SWEEP_NVRTC").map(PathBuf::from);
    let cuobjdump = std::env::var_os("SWEEP_CUOBJDUMP").map(PathBuf::from);
    match (nvrtc, cuobjdump) {
        (Some(n), Some(c)) => Some((n, c)),
        _ => {
            assert!(
                std::env::var_os("SWEEP_REQUIRE_GPU_OFFLINE").is_none(),
                "SWEEP_REQUIRE_GPU_OFFLINE is set, but SWEEP_NVRTC or SWEEP_CUOBJDUMP is not"
            );
            eprintln!(
                "skipped: SWEEP_NVRTC and SWEEP_CUOBJDUMP are not set (scripts/check-gpu-offline.sh sets them)"
            );
            None
        }
    }
}

#[test]
fn every_kernel_compiles_as_the_trainer_compiles_it_and_matches_its_signature() {
    let Some((nvrtc_path, tool)) = tools() else {
        return;
    };
    let nvrtc = load(&nvrtc_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut problems: Vec<String> = Vec::new();
    let mut checked = 0;
    for arch in ARCHS {
        let code = arch.0 * 10 + arch.1;
        if !nvrtc.archs.is_empty() && !nvrtc.archs.contains(&code) {
            eprintln!("sm_{code}: not supported by this NVRTC, skipped");
            continue;
        }
        for source in SOURCES {
            let bin = match nvrtc.compile(&program(source), source.module, &nvrtc_options(arch)) {
                Ok(b) => b,
                Err(e) => {
                    problems.push(format!("{} for sm_{code}: {e}", source.module));
                    continue;
                }
            };
            let file = dir.path().join(format!("{}-sm{code}.cubin", source.module));
            std::fs::write(&file, &bin).unwrap();
            let compiled = read_cubin(&tool, &file).unwrap();
            let mut want: Vec<(String, Vec<Arg>)> = KERNELS
                .iter()
                .filter(|k| k.source.module == source.module)
                .flat_map(|k| {
                    k.entry_points()
                        .into_iter()
                        .map(move |(entry, ty)| (entry, k.args(ty)))
                })
                .collect();
            want.sort_by(|a, b| a.0.cmp(&b.0));
            let mut names: Vec<&str> = compiled.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            let wanted: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
            if names != wanted {
                problems.push(format!(
                    "{} for sm_{code}: entry points {names:?}, the table has {wanted:?}",
                    source.module
                ));
            }
            // Tensor-core products and their loads (mma_bf16,
            // ldmatrix_x2_trans) compiled in, not left out.
            if source.module == super::ATTENTION.module {
                let sass = cuobjdump(&tool, &["-sass"], &file).unwrap();
                for function in sass.split("Function : ").skip(1) {
                    let name = function.lines().next().unwrap_or("");
                    for (op, what) in [("HMMA", "tensor-core product"), ("LDSM", "ldmatrix")] {
                        if !function.contains(op) {
                            problems.push(format!("{name} (sm_{code}): no {what} ({op})"));
                        }
                    }
                }
            }
            for (entry, args) in &want {
                if let Some((_, c)) = compiled.iter().find(|(n, _)| n == entry) {
                    let found = faults(&format!("{entry} (sm_{code})"), args, c);
                    problems.extend(found);
                    eprintln!(
                        "{entry} sm_{code}: {} parameters, {} registers, {} B shared",
                        c.params.len(),
                        c.registers,
                        c.shared
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 2 * 31, "only {checked} entry points checked");
}

#[test]
fn a_parameter_of_another_size_or_place_is_a_fault() {
    use super::Ty;
    let want = [Arg::Ptr(Ty::F32), Arg::U32, Arg::U64];
    let good = Compiled {
        params: vec![(0, 8), (8, 4), (16, 8)],
        registers: 30,
        ..Compiled::default()
    };
    assert!(faults("k", &want, &good).is_empty());
    let swapped = Compiled {
        params: vec![(0, 8), (8, 8), (16, 4)],
        ..good.clone()
    };
    assert_eq!(faults("k", &want, &swapped).len(), 2);
    let extra = Compiled {
        params: vec![(0, 8), (8, 4), (16, 8), (24, 4)],
        ..good.clone()
    };
    assert!(faults("k", &want, &extra)[0].contains("4 parameters compiled, the table has 3"));
    let spills = Compiled {
        local: 16,
        ..good.clone()
    };
    assert!(faults("k", &want, &spills)[0].contains("spills"));
    assert_eq!(
        hex_field(
            "Index : 0x0	Ordinal : 0x5	Offset  : 0x20	Size    : 0x4",
            "Offset"
        ),
        Some(32)
    );
}
