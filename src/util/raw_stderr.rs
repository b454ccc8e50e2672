//! Text for stderr written without allocating and without stderr's lock:
//! for a signal handler, or a thread that writes while others, stopped
//! where they were, may hold either.

/// Text gathered in a fixed buffer and written to descriptor 2 with
/// write(2) (a full buffer is written first). Nothing is written until
/// [`RawStderr::flush`].
pub struct RawStderr {
    buf: [u8; 512],
    len: usize,
}

impl Default for RawStderr {
    fn default() -> RawStderr {
        RawStderr {
            buf: [0; 512],
            len: 0,
        }
    }
}

impl RawStderr {
    /// Writes what was gathered; a failed write (stderr closed) is
    /// dropped: whoever writes here is ending the process anyway.
    pub fn flush(&mut self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: writing initialised bytes of our own buffer.
            let n = unsafe { libc::write(2, self.buf[done..].as_ptr().cast(), self.len - done) };
            if n <= 0 {
                break;
            }
            done += n as usize;
        }
        self.len = 0;
    }
}

impl std::fmt::Write for RawStderr {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for &b in s.as_bytes() {
            if self.len == self.buf.len() {
                self.flush();
            }
            self.buf[self.len] = b;
            self.len += 1;
        }
        Ok(())
    }
}
