//! The C boundary shared by every parser.
//!
//! Every exported parser has the same shape:
//!
//! ```c
//! int32_t nha_parse_X(const uint8_t *input, size_t input_len,
//!                     uint64_t *nums, size_t nums_cap,
//!                     uint8_t *strs, size_t strs_cap,
//!                     size_t *counts /* [records, nums_used, strs_used] */);
//! ```
//!
//! A record is a fixed number of numbers (into `nums`) and a fixed number of
//! strings (into `strs`, each one terminated by a NUL byte). The caller owns
//! every buffer. Return codes: `NHA_OK`; `NHA_ERR_BUFFER` when a buffer was too
//! small (then `counts[1]` and `counts[2]` hold the sizes needed and the caller
//! retries); `NHA_ERR_PANIC` when the parser panicked (the panic never unwinds
//! into C: it is caught here and its message kept for `nha_last_error`);
//! `NHA_ERR_ARGS` for null pointers.
//!
//! Each parser module writes its exported function out in full (cbindgen,
//! which maturin runs to make the cffi header, does not expand macros):
//!
//! ```ignore
//! #[no_mangle]
//! pub unsafe extern "C" fn nha_parse_x(input: *const u8, input_len: usize, nums: *mut u64,
//!     nums_cap: usize, strs: *mut u8, strs_cap: usize, counts: *mut usize) -> i32 {
//!     run_parser(input, input_len, nums, nums_cap, strs, strs_cap, counts, parse)
//! }
//! ```

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

pub const NHA_OK: i32 = 0;
pub const NHA_ERR_BUFFER: i32 = 1;
pub const NHA_ERR_ARGS: i32 = 2;
pub const NHA_ERR_PANIC: i32 = -1;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(msg: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// Copies the last error message of this thread into `buf` (truncated to `cap`)
/// and returns its full length in bytes.
///
/// # Safety
/// `buf` must be null or point to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nha_last_error(buf: *mut u8, cap: usize) -> usize {
    LAST_ERROR.with(|e| {
        let msg = e.borrow();
        let bytes = msg.as_bytes();
        if !buf.is_null() && cap > 0 {
            let n = bytes.len().min(cap);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, n);
        }
        bytes.len()
    })
}

/// Version of this C ABI; the Python wrapper refuses a library whose version differs.
#[no_mangle]
pub extern "C" fn nha_abi_version() -> u32 {
    5 // 2: Xid records carry the syslog facility (5 numbers); 3: nha_parse_kscreen; 4: nha_parse_kbatch;
      // 5: a screen entry without a prefix accepts its needle anywhere (kscreen, kbatch)
}

/// Test hook: panics inside the guarded region, to prove panics never cross the boundary.
#[no_mangle]
pub extern "C" fn nha_selftest_panic() -> i32 {
    guarded(|| panic!("deliberate panic from nha_selftest_panic"))
}

static QUIET_PANICS: Once = Once::new();

/// Runs `f` so that a panic becomes `NHA_ERR_PANIC` with its message kept.
/// The default hook (a backtrace on stderr) is replaced by a silent one: the
/// message reaches the agent's own log through the Python wrapper instead.
pub fn guarded<F: FnOnce() -> i32>(f: F) -> i32 {
    QUIET_PANICS.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(payload) => {
            let msg = if let Some(s) = payload.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = payload.downcast_ref::<String>() {
                s.clone()
            } else {
                "panic with a non-string payload".to_string()
            };
            set_last_error(msg);
            NHA_ERR_PANIC
        }
    }
}

/// Flat-record writer over the caller's buffers. Keeps counting past the end of
/// a buffer so that the caller learns the size it needs.
pub struct Out<'a> {
    nums: &'a mut [u64],
    strs: &'a mut [u8],
    n_nums: usize,
    n_strs: usize,
    records: usize,
}

impl<'a> Out<'a> {
    #[inline]
    pub fn num(&mut self, v: u64) {
        if self.n_nums < self.nums.len() {
            self.nums[self.n_nums] = v;
        }
        self.n_nums += 1;
    }

    /// Writes several numbers at once (one bounds check, one copy).
    #[inline]
    pub fn nums(&mut self, vs: &[u64]) {
        let end = self.n_nums + vs.len();
        if let Some(slot) = self.nums.get_mut(self.n_nums..end) {
            slot.copy_from_slice(vs);
        }
        self.n_nums = end;
    }

    /// Writes `s` followed by a NUL terminator.
    #[inline]
    pub fn str(&mut self, s: &[u8]) {
        let end = self.n_strs + s.len();
        if end < self.strs.len() {
            self.strs[self.n_strs..end].copy_from_slice(s);
            self.strs[end] = 0;
        }
        self.n_strs = end + 1;
    }

    /// Writes `s` with the kernel's `\ooo` octal escapes decoded (see `unescape_octal`).
    #[inline]
    pub fn str_unescaped(&mut self, s: &[u8]) {
        if crate::scan::find_byte(b'\\', s).is_none() {
            return self.str(s);
        }
        for b in crate::text::unescape_octal(s) {
            self.byte(b);
        }
        self.byte(0);
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        if let Some(slot) = self.strs.get_mut(self.n_strs) {
            *slot = b;
        }
        self.n_strs += 1;
    }

    #[inline]
    pub fn end_record(&mut self) {
        self.records += 1;
    }

    /// Position to roll back to if a record turns out invalid half-way.
    pub fn mark(&self) -> (usize, usize) {
        (self.n_nums, self.n_strs)
    }

    pub fn rollback(&mut self, mark: (usize, usize)) {
        self.n_nums = mark.0;
        self.n_strs = mark.1;
    }
}

/// The body of every exported parser: checks the pointers, builds slices and the
/// writer, runs `parse` under `guarded`, and reports counts.
///
/// # Safety
/// Pointers must be valid for the given lengths (null is allowed when the length is 0).
// The arguments are the C ABI every exported parser has (agent/native.py calls it), passed through as they are.
#[allow(clippy::too_many_arguments)]
pub unsafe fn run_parser(
    input: *const u8,
    input_len: usize,
    nums: *mut u64,
    nums_cap: usize,
    strs: *mut u8,
    strs_cap: usize,
    counts: *mut usize,
    parse: fn(&[u8], &mut Out),
) -> i32 {
    if counts.is_null()
        || (input.is_null() && input_len > 0)
        || (nums.is_null() && nums_cap > 0)
        || (strs.is_null() && strs_cap > 0)
    {
        set_last_error("null pointer passed with a non-zero length".to_string());
        return NHA_ERR_ARGS;
    }
    let input: &[u8] = if input_len == 0 { &[] } else { std::slice::from_raw_parts(input, input_len) };
    let nums: &mut [u64] = if nums_cap == 0 { &mut [] } else { std::slice::from_raw_parts_mut(nums, nums_cap) };
    let strs: &mut [u8] = if strs_cap == 0 { &mut [] } else { std::slice::from_raw_parts_mut(strs, strs_cap) };
    let counts = std::slice::from_raw_parts_mut(counts, 3);
    guarded(|| {
        let mut out = Out { nums, strs, n_nums: 0, n_strs: 0, records: 0 };
        parse(input, &mut out);
        counts[0] = out.records;
        counts[1] = out.n_nums;
        counts[2] = out.n_strs;
        if out.n_nums > out.nums.len() || out.n_strs > out.strs.len() {
            NHA_ERR_BUFFER
        } else {
            NHA_OK
        }
    })
}

/// Runs `parse` through the C boundary with room to spare; returns the records
/// as (numbers, strings) pairs. For the parsers' unit tests.
#[cfg(test)]
pub(crate) fn collect(parse: fn(&[u8], &mut Out), input: &[u8], nnums: usize) -> Vec<(Vec<u64>, Vec<Vec<u8>>)> {
    let mut nums = vec![0u64; input.len() * nnums + 1];
    let mut strs = vec![0u8; input.len() * 2 + 64];
    let mut counts = [0usize; 3];
    let rc = unsafe {
        run_parser(input.as_ptr(), input.len(), nums.as_mut_ptr(), nums.len(), strs.as_mut_ptr(), strs.len(), counts.as_mut_ptr(), parse)
    };
    assert_eq!(rc, NHA_OK);
    let strings: Vec<Vec<u8>> = strs[..counts[2]].split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    let nstrs = (strings.len() - 1).checked_div(counts[0]).unwrap_or(0);
    (0..counts[0])
        .map(|r| (nums[r * nnums..(r + 1) * nnums].to_vec(), strings[r * nstrs..(r + 1) * nstrs].to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_records(_: &[u8], out: &mut Out) {
        for (n, s) in [(7u64, &b"seven"[..]), (8, b"a\\040b")] {
            out.num(n);
            out.str_unescaped(s);
            out.end_record();
        }
    }

    fn call(nums_cap: usize, strs_cap: usize) -> (i32, [usize; 3], Vec<u64>, Vec<u8>) {
        let mut nums = vec![0u64; nums_cap];
        let mut strs = vec![0u8; strs_cap];
        let mut counts = [0usize; 3];
        let rc = unsafe {
            run_parser(b"".as_ptr(), 0, nums.as_mut_ptr(), nums_cap, strs.as_mut_ptr(), strs_cap, counts.as_mut_ptr(), two_records)
        };
        (rc, counts, nums, strs)
    }

    #[test]
    fn writes_records_and_counts() {
        let (rc, counts, nums, strs) = call(2, 10);
        assert_eq!((rc, counts), (NHA_OK, [2, 2, 10]));
        assert_eq!(nums, [7, 8]);
        assert_eq!(strs, b"seven\0a b\0");
    }

    #[test]
    fn too_small_reports_the_sizes_needed() {
        for (nums_cap, strs_cap) in [(1, 10), (2, 9), (0, 0), (2, 5)] {
            let (rc, counts, _, _) = call(nums_cap, strs_cap);
            assert_eq!((rc, counts), (NHA_ERR_BUFFER, [2, 2, 10]), "caps {nums_cap} {strs_cap}");
        }
    }

    #[test]
    fn null_pointers_with_a_length_are_refused() {
        let mut counts = [0usize; 3];
        let rc = unsafe {
            run_parser(std::ptr::null(), 3, std::ptr::null_mut(), 0, std::ptr::null_mut(), 0, counts.as_mut_ptr(), two_records)
        };
        assert_eq!(rc, NHA_ERR_ARGS);
    }

    #[test]
    fn a_panic_becomes_an_error_code_with_its_message() {
        assert_eq!(nha_selftest_panic(), NHA_ERR_PANIC);
        let mut buf = [0u8; 64];
        let len = unsafe { nha_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(&buf[..len], b"deliberate panic from nha_selftest_panic");
        assert_eq!(guarded(|| panic!("with {}", "format")), NHA_ERR_PANIC);
        assert_eq!(unsafe { nha_last_error(std::ptr::null_mut(), 0) }, "with format".len());
    }
}
