//! A process dying of a fault says where first: on SIGSEGV, SIGBUS, SIGILL or SIGFPE, the
//! signal, address, thread and stack go to stderr (a rank's job log: nobody keeps its core
//! file), then it dies of the same signal. Nothing is allocated until every frame's address is
//! written; naming frames runs under an alarm. A handler installed before ours runs after.

use super::raw_stderr::RawStderr;
use super::signals::name;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// A `sigaction`, kept across threads (it holds a function's address and flags).
#[derive(Clone, Copy)]
struct Action(libc::sigaction);

// SAFETY: a plain value of addresses and integers, never mutated once kept.
unsafe impl Send for Action {}
unsafe impl Sync for Action {}

/// The faults handled.
const FATAL: [i32; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
/// Frames written at most.
const MAX_FRAMES: usize = 64;
/// Seconds the frames' names may take before the process dies without them.
pub const NAMING_LIMIT_S: u32 = 20;
/// The alternate signal stack of sweep's threads: naming needs more than Rust's few kilobytes.
const ALT_STACK_BYTES: usize = 1 << 20;

/// The handlers installed before ours, by index in [`FATAL`]: set once by [`install`].
static PREVIOUS: OnceLock<[Option<Action>; 4]> = OnceLock::new();
/// The thread reporting a fault (0: none). Another thread's fault waits for the process to end;
/// the reporter's own fault ends it.
static REPORTER: AtomicI32 = AtomicI32::new(0);
/// The signal being reported, for the alarm's handler.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Reports faults from now on, in every thread. Call once, before other threads start.
pub fn install() {
    let mut previous = [None; 4];
    for (old, &sig) in previous.iter_mut().zip(&FATAL) {
        // SAFETY: reading a signal's action into a zeroed sigaction.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut action) == 0 {
                *old = Some(Action(action));
            }
        }
    }
    if PREVIOUS.set(previous).is_err() {
        // Installed already: the "previous" handlers would be ours.
        return;
    }
    // The first walk must not bind the unwinder lazily on a small signal stack: walk once now.
    // SAFETY: no other thread walks stacks yet.
    unsafe { backtrace::trace_unsynchronized(|_| false) };
    roomy_signal_stack();
    for &sig in &FATAL {
        // SAFETY: a zeroed sigaction filled field by field, installed after
        // the previous one was kept.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fault as *const () as usize;
            // On the alternate stack where there is one: a stack overflow is a SIGSEGV too.
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Gives the calling thread an alternate signal stack roomy enough for a report (the compute
/// pool's start handler calls it).
pub fn roomy_signal_stack() {
    // SAFETY: a fresh anonymous mapping becomes this thread's alternate stack, never unmapped.
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return;
        }
        let ss = libc::stack_t {
            ss_sp: stack,
            ss_flags: 0,
            ss_size: ALT_STACK_BYTES,
        };
        if libc::sigaltstack(&ss, std::ptr::null_mut()) != 0 {
            libc::munmap(stack, ALT_STACK_BYTES);
        }
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let me = gettid();
    if let Err(reporter) = REPORTER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        if reporter == me {
            let mut out = RawStderr::default();
            let _ = writeln!(out, "sweep: the report faulted in turn; it ends here");
            out.flush();
            // SAFETY: the default action; returning faults again, under it.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
            return;
        }
        // Another thread is reporting: this one waits for the end that report brings.
        loop {
            // SAFETY: pause has no preconditions.
            unsafe { libc::pause() };
        }
    }
    SIGNAL.store(sig, Ordering::Release);
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let (address, sent) = unsafe { ((*info).si_addr() as usize, (*info).si_code <= 0) };
    let mut out = RawStderr::default();
    let _ = write!(out, "\nsweep: fatal signal {} (", name(sig));
    match sent {
        true => {
            let _ = write!(out, "sent by a process");
        }
        false => {
            let _ = write!(out, "address {address:#x}");
        }
    }
    let _ = write!(out, ") in thread {} (", gettid());
    thread_name(&mut out);
    let _ = writeln!(out, "); its stack (the report's own frames first):");
    out.flush();
    let mut frames = [0usize; MAX_FRAMES];
    let mut n = 0;
    // SAFETY: the unsynchronized trace is meant for signal handlers; one thread gets here.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            frames[n] = frame.ip() as usize;
            n += 1;
            n < MAX_FRAMES
        });
    }
    for (i, &ip) in frames[..n].iter().enumerate() {
        let _ = write!(out, "    #{i:<2} {ip:#x}");
        library(&mut out, ip);
        let _ = writeln!(out);
        out.flush();
    }
    name_frames(&frames[..n], &mut out);
    let _ = writeln!(
        out,
        "sweep: the process dies of {} (the report above is what it left)",
        name(sig)
    );
    out.flush();
    hand_on(sig, info, context, sent);
}

/// Each frame's function and source line, under an alarm (naming allocates).
fn name_frames(frames: &[usize], out: &mut RawStderr) {
    // SAFETY: a plain handler for SIGALRM, then the alarm.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_alarm as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut());
        libc::alarm(NAMING_LIMIT_S);
    }
    let _ = writeln!(out, "  named:");
    out.flush();
    for (i, &ip) in frames.iter().enumerate() {
        let mut named = 0;
        // SAFETY: only this thread resolves symbols now, and the process ends right after.
        unsafe {
            backtrace::resolve_unsynchronized(ip as *mut c_void, |sym| {
                // An address's functions, innermost first.
                let _ = match named {
                    0 => write!(out, "    #{i:<2} "),
                    _ => write!(out, "        in "),
                };
                named += 1;
                match sym.name() {
                    Some(n) => {
                        let _ = write!(out, "{n:#}");
                    }
                    None => {
                        let _ = write!(out, "?");
                    }
                }
                if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
                    let _ = write!(out, " at {}:{line}", file.display());
                }
                let _ = writeln!(out);
            });
        }
        if named == 0 {
            let _ = writeln!(out, "    #{i:<2} ?");
        }
        out.flush();
    }
    // SAFETY: cancelling the alarm.
    unsafe { libc::alarm(0) };
}

/// Naming the frames hung: the process dies of its fault now, unnamed.
extern "C" fn on_alarm(_: libc::c_int) {
    let sig = SIGNAL.load(Ordering::Acquire);
    let mut out = RawStderr::default();
    let _ = writeln!(
        out,
        "sweep: naming the frames took over {NAMING_LIMIT_S} s; the addresses above are the stack"
    );
    out.flush();
    // SAFETY: the default action, then the signal to the whole process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
    }
}

/// Passes the fault on: to the previous handler, else the default action.
fn hand_on(sig: i32, info: *mut libc::siginfo_t, context: *mut c_void, sent: bool) {
    let i = FATAL.iter().position(|&s| s == sig).unwrap_or(0);
    let previous = PREVIOUS.get().and_then(|p| p[i]).map(|a| a.0);
    match previous {
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: the old handler, called as the kernel would call it.
            unsafe {
                libc::sigaction(sig, &old, std::ptr::null_mut());
                if old.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                        std::mem::transmute(old.sa_sigaction);
                    f(sig, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
                    f(sig);
                }
            }
        }
        _ => {
            // SAFETY: restoring the default action.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    if sent {
        // A sent signal does not come back on return as a fault does: send it again.
        // SAFETY: as above; it is delivered once the handler returns.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    // A fault: returning reruns the instruction, which faults again under the default action.
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The calling thread's name, as the kernel keeps it.
fn thread_name(out: &mut RawStderr) {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included.
    let ok = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0;
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    match (ok, std::str::from_utf8(&name[..len])) {
        (true, Ok(n)) => {
            let _ = out.write_str(n);
        }
        _ => {
            let _ = out.write_str("?");
        }
    }
}

/// ` in LIBRARY+0xOFFSET`, where the loader knows the address.
fn library(out: &mut RawStderr, ip: usize) {
    // SAFETY: dladdr fills `info`; its strings stay valid while the library is loaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(ip as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return;
        }
        let path = std::ffi::CStr::from_ptr(info.dli_fname).to_bytes();
        let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        let _ = out.write_str(" in ");
        let _ = out.write_str(std::str::from_utf8(file).unwrap_or("?"));
        let _ = write!(out, "+{:#x}", ip.wrapping_sub(info.dli_fbase as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    /// What a child process that installs the reporter and then faults in
    /// `fault` writes to stderr, and the signal it dies of.
    fn child_faulting(fault: fn()) -> (String, i32) {
        let mut fds = [0; 2];
        // SAFETY: pipe fills two descriptors; fork's child only calls
        // async-signal-safe functions before it faults (the handler's
        // naming allocates, as after any fault, under its alarm).
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::close(fds[0]);
                libc::dup2(fds[1], 2);
                install();
                fault();
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut text = String::new();
            std::fs::File::from_raw_fd(fds[0])
                .read_to_string(&mut text)
                .unwrap();
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            let sig = match libc::WIFSIGNALED(status) {
                true => libc::WTERMSIG(status),
                false => -libc::WEXITSTATUS(status),
            };
            (text, sig)
        }
    }

    #[inline(never)]
    fn write_through_a_bad_pointer() {
        let p = std::hint::black_box(16usize) as *mut u64;
        // SAFETY: not safe: the fault under test.
        unsafe { p.write_volatile(7) };
    }

    #[test]
    fn a_fault_is_reported_with_its_address_and_stack_and_still_kills() {
        let (text, sig) = child_faulting(write_through_a_bad_pointer);
        // The report, for `--nocapture` (docs/running.md shows one).
        eprintln!("{text}");
        assert_eq!(sig, libc::SIGSEGV, "{text}");
        assert!(
            text.contains("sweep: fatal signal SIGSEGV (address 0x10)"),
            "{text}"
        );
        assert!(text.contains("    #0  0x"), "{text}");
        let named = text
            .split("  named:")
            .nth(1)
            .unwrap_or_else(|| panic!("{text}"));
        assert!(named.contains("write_through_a_bad_pointer"), "{text}");
        assert!(text.contains("the process dies of SIGSEGV"), "{text}");
    }

    #[inline(never)]
    fn sent_a_bus_error() {
        // SAFETY: raising a signal at ourselves.
        unsafe { libc::raise(libc::SIGBUS) };
    }

    #[test]
    fn a_fault_signal_sent_by_a_process_is_reported_and_still_kills() {
        let (text, sig) = child_faulting(sent_a_bus_error);
        assert_eq!(sig, libc::SIGBUS, "{text}");
        assert!(
            text.contains("fatal signal SIGBUS (sent by a process)"),
            "{text}"
        );
    }
}
