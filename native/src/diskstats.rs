//! `/proc/diskstats`: one record per block device.
//!
//! Record: major, minor, the number of statistics fields present (11 to 17,
//! kernels before 4.18 print 11, 4.18 adds discards, 5.5 adds flushes), then
//! 17 statistics (absent ones are 0); 1 string (the device name). Lines with
//! fewer than 11 statistics or a non-integer among the fields used are skipped.

use crate::ffi::Out;
use crate::text::{is_ws, lines, parse_u64, scan_u64s};

pub const STATS: usize = 17;
pub const MIN_STATS: usize = 11;

pub fn parse(input: &[u8], out: &mut Out) {
    let mut ids = [0u64; 2];
    for line in lines(input) {
        // major minor name: the name is the third token, then the statistics.
        let mut tok = [0usize; 6]; // start/end of the first three tokens
        let mut i = 0;
        for t in 0..3 {
            while i < line.len() && is_ws(line[i]) {
                i += 1;
            }
            tok[2 * t] = i;
            while i < line.len() && !is_ws(line[i]) {
                i += 1;
            }
            tok[2 * t + 1] = i;
        }
        if tok[4] == tok[5] {
            continue;
        }
        let (Some(major), Some(minor)) = (parse_u64(&line[tok[0]..tok[1]]), parse_u64(&line[tok[2]..tok[3]])) else {
            continue;
        };
        ids[0] = major;
        ids[1] = minor;
        let mut stats = [0u64; STATS];
        let n = match scan_u64s(&line[tok[5]..], &mut stats) {
            Some(n) if n >= MIN_STATS => n,
            _ => continue,
        };
        let name = &line[tok[4]..tok[5]];
        out.num(ids[0]);
        out.num(ids[1]);
        out.num(n as u64);
        for v in stats {
            out.num(v);
        }
        out.str(name);
        out.end_record();
    }
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_diskstats(
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
