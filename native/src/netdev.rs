//! `/proc/net/dev`: one record per interface.
//!
//! Record: 16 numbers (rx bytes, packets, errs, drop, fifo, frame, compressed,
//! multicast; tx bytes, packets, errs, drop, fifo, colls, carrier, compressed)
//! and 1 string (the interface name). Header lines (no `:`) and lines whose
//! first 16 fields are not all unsigned integers are skipped.

use crate::ffi::Out;
use crate::text::{lines, scan_u64s, trim};

pub const NUMS: usize = 16;

pub fn parse(input: &[u8], out: &mut Out) {
    let mut vals = [0u64; NUMS];
    for line in lines(input) {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let name = trim(&line[..colon]);
        if name.is_empty() || scan_u64s(&line[colon + 1..], &mut vals) != Some(NUMS) {
            continue;
        }
        for v in vals {
            out.num(v);
        }
        out.str(name);
        out.end_record();
    }
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_net_dev(
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
