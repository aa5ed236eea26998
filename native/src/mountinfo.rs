//! `/proc/<pid>/mountinfo` (proc(5)): one record per mount.
//!
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
//!
//! Record: 4 numbers (mount id, parent id, major, minor) and 7 strings (root,
//! mount point, mount options, optional fields joined by one space, filesystem
//! type, mount source, super options), each with the kernel's `\ooo` escapes
//! decoded. Lines without the ` - ` separator after the six fixed fields, or
//! with non-integer ids, are skipped.

use crate::ffi::Out;
use crate::text::{fields, lines, parse_u64};

pub fn parse(input: &[u8], out: &mut Out) {
    let mut f: Vec<&[u8]> = Vec::with_capacity(16);
    for line in lines(input) {
        f.clear();
        f.extend(fields(line));
        if f.len() < 10 {
            continue;
        }
        let Some(sep) = f[6..].iter().position(|x| *x == b"-").map(|i| i + 6) else { continue };
        if sep + 3 >= f.len() {
            continue;
        }
        let (Some(id), Some(parent)) = (parse_u64(f[0]), parse_u64(f[1])) else { continue };
        let Some(colon) = f[2].iter().position(|&b| b == b':') else { continue };
        let (Some(major), Some(minor)) = (parse_u64(&f[2][..colon]), parse_u64(&f[2][colon + 1..])) else { continue };
        out.num(id);
        out.num(parent);
        out.num(major);
        out.num(minor);
        out.str_unescaped(f[3]);
        out.str_unescaped(f[4]);
        out.str_unescaped(f[5]);
        out.str_unescaped(&f[6..sep].join(&b' '));
        out.str_unescaped(f[sep + 1]);
        out.str_unescaped(f[sep + 2]);
        out.str_unescaped(f[sep + 3]);
        out.end_record();
    }
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_mountinfo(
    input: *const u8,
    input_len: usize,
    nums: *mut u64,
    nums_cap: usize,
    strs: *mut u8,
    strs_cap: usize,
    counts: *mut usize,
) -> i32 {
    crate::ffi::run_parser(input, input_len, nums, nums_cap, strs, strs_cap, counts, parse)
}
