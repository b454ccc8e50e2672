//! The trainer's CUDA kernels run on a CPU: the `.cu` text compiled as
//! C++20 behind a host emulation of CUDA (`emulate.hpp`), with a
//! dispatcher generated from the kernels' table, into a program that
//! executes launches given as data and returns its buffers. Built plain,
//! with AddressSanitizer and UndefinedBehaviorSanitizer, or with
//! ThreadSanitizer; any sanitizer report fails the run.
//!
//! Needs only `g++` (12 or later): the tests say they are skipped without
//! it, and fail where `SWEEP_REQUIRE_GPU_OFFLINE` is set.

use super::{program, Arg, Launch, LaunchPlan, Mem, Ty, Value, KERNELS, SOURCES};
use std::path::PathBuf;
use std::sync::OnceLock;

/// How the emulator is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    Plain,
    /// AddressSanitizer and UndefinedBehaviorSanitizer.
    Address,
    /// ThreadSanitizer: the barriers and shuffles of a block.
    Thread,
}

impl Flavor {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Flavor::Plain => &["-O2"],
            Flavor::Address => &[
                "-O1",
                "-fsanitize=address,undefined",
                "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer",
            ],
            Flavor::Thread => &["-O1", "-fsanitize=thread"],
        }
    }
}

/// A buffer a launch reads or writes: its storage type and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    pub ty: Ty,
    pub bytes: Vec<u8>,
}

impl Buffer {
    pub fn f32(values: &[f32]) -> Buffer {
        Buffer {
            ty: Ty::F32,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    pub fn bf16(values: &[half::bf16]) -> Buffer {
        Buffer {
            ty: Ty::Bf16,
            bytes: values
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect(),
        }
    }

    pub fn u32(values: &[u32]) -> Buffer {
        Buffer {
            ty: Ty::U32,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// `n` values of `ty`, every byte 0xff (a NaN for floats): what a kernel
    /// must overwrite.
    pub fn poisoned(ty: Ty, n: usize) -> Buffer {
        Buffer {
            ty,
            bytes: vec![0xff; n * ty.size()],
        }
    }

    /// Its values as f32 (bf16 widened; u32 not).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.ty {
            Ty::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect(),
            Ty::Bf16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Ty::U32 => panic!("a u32 buffer is not f32"),
        }
    }
}

/// The emulator program of one flavor, built once per test process.
pub struct Emulator {
    exe: PathBuf,
    _dir: tempfile::TempDir,
}

/// g++, where there is one.
fn compiler() -> Option<PathBuf> {
    let cxx = std::env::var_os("CXX").map_or_else(|| PathBuf::from("g++"), PathBuf::from);
    let ok = std::process::Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(cxx)
}

/// The C++ that calls entry point `entry` with the arguments `a[..]` as
/// its parameters `args` declare them.
fn call_line(entry: &str, args: &[Arg]) -> String {
    let params: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::Ptr(Ty::F32) => format!("(float*)ptr(a[{i}])"),
            Arg::Ptr(Ty::Bf16) => format!("(bf16*)ptr(a[{i}])"),
            Arg::Ptr(Ty::U32) => format!("(u32*)ptr(a[{i}])"),
            Arg::U32 => format!("a[{i}].u32"),
            Arg::U64 => format!("a[{i}].u64"),
            Arg::F32 => format!("a[{i}].f32"),
        })
        .collect();
    format!(
        "    if (name == \"{entry}\") {{ emulate_launch(g, b, [&] {{ {entry}({}); }}); return true; }}\n",
        params.join(", ")
    )
}

/// The program's text: the emulation, every source as the trainer compiles
/// it (`common.cuh` once), the dispatcher and `main`.
fn source() -> String {
    let mut text = String::from(include_str!("emulate.hpp"));
    text.push_str(super::COMMON);
    for s in SOURCES {
        text.push_str(&program(s)[super::COMMON.len()..]);
    }
    text.push_str(
        r#"
#include <cstdio>
#include <string>
struct Val { unsigned tag, buf; unsigned long long off; unsigned u32; unsigned long long u64; float f32; };
static std::vector<std::vector<unsigned char>> bufs;
static void* ptr(const Val& v) { return bufs[v.buf].data() + v.off; }
static bool call(const std::string& name, const std::vector<Val>& a, dim3 g, dim3 b) {
"#,
    );
    for k in KERNELS {
        for (entry, ty) in k.entry_points() {
            text.push_str(&call_line(&entry, &k.args(ty)));
        }
    }
    text.push_str(
        r#"    return false;
}
template <typename T> static T get(FILE* f) { T v; if (fread(&v, sizeof v, 1, f) != 1) { fprintf(stderr, "short input\n"); exit(3); } return v; }
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in) return 2;
    const unsigned nbufs = get<unsigned>(in);
    bufs.resize(nbufs);
    for (auto& buf : bufs) {
        buf.resize(get<unsigned long long>(in));
        if (!buf.empty() && fread(buf.data(), 1, buf.size(), in) != buf.size()) return 3;
    }
    const unsigned ncalls = get<unsigned>(in);
    for (unsigned c = 0; c < ncalls; ++c) {
        std::string name(get<unsigned>(in), '\0');
        if (fread(name.data(), 1, name.size(), in) != name.size()) return 3;
        dim3 g{get<unsigned>(in), get<unsigned>(in), get<unsigned>(in)};
        dim3 b{get<unsigned>(in), get<unsigned>(in), get<unsigned>(in)};
        std::vector<Val> a(get<unsigned>(in));
        for (auto& v : a) {
            v.tag = get<unsigned>(in);
            v.buf = get<unsigned>(in);
            v.off = get<unsigned long long>(in);
            v.u32 = get<unsigned>(in);
            v.u64 = get<unsigned long long>(in);
            v.f32 = get<float>(in);
        }
        if (!call(name, a, g, b)) { fprintf(stderr, "no entry point %s\n", name.c_str()); return 4; }
    }
    fclose(in);
    FILE* out = fopen(argv[2], "wb");
    for (auto& buf : bufs)
        if (!buf.empty()) fwrite(buf.data(), 1, buf.size(), out);
    fclose(out);
    return 0;
}
"#,
    );
    text
}

impl Emulator {
    /// The emulator of `flavor`, built on first use; None (and a note)
    /// where there is no g++, or a panic where the check is required.
    pub fn get(flavor: Flavor) -> Option<&'static Emulator> {
        static BUILT: [OnceLock<Result<Emulator, String>>; 3] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let slot = &BUILT[flavor as usize];
        match slot.get_or_init(|| Emulator::build(flavor)) {
            Ok(e) => Some(e),
            Err(why) => {
                assert!(
                    std::env::var_os("SWEEP_REQUIRE_GPU_OFFLINE").is_none(),
                    "the kernels' emulator: {why}"
                );
                eprintln!("skipped: the kernels' emulator: {why}");
                None
            }
        }
    }

    fn build(flavor: Flavor) -> Result<Emulator, String> {
        let cxx = compiler().ok_or("no g++ (set CXX)")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let src = dir.path().join("emulate.cpp");
        std::fs::write(&src, source()).map_err(|e| e.to_string())?;
        let exe = dir.path().join("emulate");
        let out = std::process::Command::new(&cxx)
            // The kernels read bf16 and f32 arrays 16 bytes at a time (as
            // CUDA allows): no aliasing assumptions the GPU does not make.
            .args(["-std=c++20", "-g", "-pthread", "-w", "-fno-strict-aliasing"])
            .args(flavor.flags())
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .map_err(|e| format!("{}: {e}", cxx.display()))?;
        if !out.status.success() {
            return Err(format!(
                "the kernels do not compile under the host emulation ({flavor:?}):\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Emulator { exe, _dir: dir })
    }

    /// Runs a plan on `operands` (updated in place where it writes them);
    /// returns its outputs. Outputs and scratch buffers start as NaN (every
    /// byte 0xff): an output value no launch writes shows. Each launch's
    /// arguments are first held to its kernel's signature.
    pub fn run(&self, plan: &LaunchPlan, operands: &mut [Buffer]) -> Result<Vec<Buffer>, String> {
        let mut buffers: Vec<Buffer> = operands.to_vec();
        let first_output = buffers.len();
        buffers.extend(plan.outputs.iter().map(|&(ty, n)| Buffer::poisoned(ty, n)));
        let first_scratch = buffers.len();
        buffers.extend(plan.scratch.iter().map(|&(ty, n)| Buffer::poisoned(ty, n)));
        let index = |m: Mem| match m {
            Mem::Operand(i) => i,
            Mem::Output(i) => first_output + i,
            Mem::Scratch(i) => first_scratch + i,
        };
        for l in &plan.launches {
            check(l, &buffers, &index)?;
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (input, output) = (dir.path().join("in"), dir.path().join("out"));
        std::fs::write(&input, encode(&buffers, &plan.launches, &index))
            .map_err(|e| e.to_string())?;
        let out = std::process::Command::new(&self.exe)
            .arg(&input)
            .arg(&output)
            .env("ASAN_OPTIONS", "detect_leaks=0:exitcode=66")
            .env(
                "UBSAN_OPTIONS",
                "halt_on_error=1:exitcode=66:print_stacktrace=1",
            )
            .env("TSAN_OPTIONS", "halt_on_error=1:exitcode=66")
            .output()
            .map_err(|e| e.to_string())?;
        let said = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || said.contains("Sanitizer") || said.contains("runtime error") {
            // The report's head: what, where, the first frames.
            let said: String = said.lines().take(12).collect::<Vec<_>>().join("\n");
            return Err(format!(
                "the emulated launches failed ({}):\n{said}",
                out.status
            ));
        }
        let bytes = std::fs::read(&output).map_err(|e| e.to_string())?;
        let mut at = 0;
        for b in buffers.iter_mut() {
            let n = b.bytes.len();
            b.bytes.copy_from_slice(&bytes[at..at + n]);
            at += n;
        }
        let outputs = buffers.split_off(first_output);
        operands.clone_from_slice(&buffers);
        Ok(outputs.into_iter().take(plan.outputs.len()).collect())
    }
}

/// A launch's arguments against its kernel's signature: as many, each of
/// its type, every pointer inside its buffer.
fn check(l: &Launch, buffers: &[Buffer], index: &dyn Fn(Mem) -> usize) -> Result<(), String> {
    let want = l.kernel.args(l.own);
    let got: Vec<Arg> = l
        .args
        .iter()
        .map(|v| match *v {
            Value::Ptr(m, _) => Arg::Ptr(buffers[index(m)].ty),
            Value::U32(_) => Arg::U32,
            Value::U64(_) => Arg::U64,
            Value::F32(_) => Arg::F32,
        })
        .collect();
    if got != want {
        return Err(format!(
            "{}: takes {want:?}, the launch passes {got:?}",
            l.entry()
        ));
    }
    for v in &l.args {
        if let Value::Ptr(m, offset) = *v {
            let b = &buffers[index(m)];
            if offset * b.ty.size() > b.bytes.len() {
                return Err(format!("{}: an offset past its buffer", l.entry()));
            }
        }
    }
    Ok(())
}

/// The program's input: the buffers, then the launches.
fn encode(buffers: &[Buffer], launches: &[Launch], index: &dyn Fn(Mem) -> usize) -> Vec<u8> {
    let mut out = Vec::new();
    let u32le = |out: &mut Vec<u8>, v: u32| out.extend(v.to_le_bytes());
    let u64le = |out: &mut Vec<u8>, v: u64| out.extend(v.to_le_bytes());
    u32le(&mut out, buffers.len() as u32);
    for b in buffers {
        u64le(&mut out, b.bytes.len() as u64);
        out.extend(&b.bytes);
    }
    u32le(&mut out, launches.len() as u32);
    for l in launches {
        let entry = l.entry();
        u32le(&mut out, entry.len() as u32);
        out.extend(entry.as_bytes());
        for v in [l.grid.0, l.grid.1, 1, super::THREADS, 1, 1] {
            u32le(&mut out, v);
        }
        u32le(&mut out, l.args.len() as u32);
        for v in &l.args {
            let (tag, buf, off, u, w, f) = match *v {
                Value::Ptr(m, offset) => {
                    let i = index(m);
                    (
                        0,
                        i as u32,
                        (offset * buffers[i].ty.size()) as u64,
                        0,
                        0,
                        0.0,
                    )
                }
                Value::U32(x) => (1, 0, 0, x, 0, 0.0),
                Value::U64(x) => (2, 0, 0, 0, x, 0.0),
                Value::F32(x) => (3, 0, 0, 0, 0, x),
            };
            u32le(&mut out, tag);
            u32le(&mut out, buf);
            u64le(&mut out, off);
            u32le(&mut out, u);
            u64le(&mut out, w);
            out.extend(f.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::kernels::{warp_per_row, RMS_NORM};

    /// One launch, by hand: RMSNorm's forward over 5 rows of 40 (a warp per
    /// row, 8 per block: a partial block and a partial last pass over a
    /// row), against the formula, under every flavor; arguments of another
    /// type are refused before anything runs.
    #[test]
    fn a_launch_runs_under_every_flavor() {
        let (rows, d) = (5usize, 40usize);
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 4.0)
            .collect();
        let w: Vec<f32> = (0..d).map(|i| 1.0 + i as f32 / 100.0).collect();
        let mut want = vec![0f32; rows * d];
        for r in 0..rows {
            let row = &x[r * d..(r + 1) * d];
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-5).sqrt();
            for i in 0..d {
                want[r * d + i] = row[i] * inv * w[i];
            }
        }
        let mut plan = LaunchPlan::default();
        let y = plan.output(Ty::F32, rows * d);
        let args = vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(y, 0),
            Value::U32(rows as u32),
            Value::U32(d as u32),
            Value::F32(1e-5),
        ];
        plan.launch(&RMS_NORM, "rms_norm_fwd", Ty::F32, warp_per_row(rows), args)
            .unwrap();
        for flavor in [Flavor::Plain, Flavor::Address, Flavor::Thread] {
            let Some(emu) = Emulator::get(flavor) else {
                return;
            };
            let mut operands = vec![Buffer::f32(&x), Buffer::f32(&w)];
            let got = emu.run(&plan, &mut operands).unwrap()[0].to_f32();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{flavor:?}: {worst}");
            let mut swapped = plan.clone();
            swapped.launches[0].args.swap(4, 5);
            let e = emu.run(&swapped, &mut operands).unwrap_err();
            assert!(e.contains("takes"), "{e}");
        }
    }
}
