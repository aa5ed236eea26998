//! `/proc/diskstats`: one record per block device.
//!
//! Record: major, minor, the number of statistics fields present (11 to 17,
//! kernels before 4.18 print 11, 4.18 adds discards, 5.5 adds flushes), then
//! 17 statistics (absent ones are 0); 1 string (the device name). Lines with
//! fewer than 11 statistics or a non-integer among the fields used are skipped.

use crate::ffi::Out;
use crate::scan::{line_end, scan_u64s_line, skip_blanks, token_end};

pub const STATS: usize = 17;
pub const MIN_STATS: usize = 11;

pub fn parse(input: &[u8], out: &mut Out) {
    let mut start = 0;
    while start <= input.len() {
        let next = record(input, start, out).unwrap_or(start);
        start = line_end(input, next) + 1;
    }
}

/// Parses the line at `start` (`"%4d %7d %pg %lu ..."`, block/genhd.c,
/// diskstats_show); returns where it stopped reading, `None` if it is skipped.
fn record(input: &[u8], start: usize, out: &mut Out) -> Option<usize> {
    let mut ids = [0u64; 2];
    let mut stats = [0u64; STATS];
    let Some((2, after_ids)) = scan_u64s_line(input, start, &mut ids) else { return None };
    let name_start = skip_blanks(input, after_ids);
    let name_end = token_end(input, name_start);
    if name_end == name_start {
        return None;
    }
    let (n, after) = scan_u64s_line(input, name_end, &mut stats)?;
    if n < MIN_STATS {
        return None;
    }
    out.nums(&[ids[0], ids[1], n as u64]);
    out.nums(&stats);
    out.str(&input[name_start..name_end]);
    out.end_record();
    Some(after)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::collect;

    const NNUMS: usize = 3 + STATS;

    #[test]
    fn kernel_versions() {
        let input = b" 259       0 nvme0n1 1 2 3 4 5 6 7 8 9 10 11\n\
   8       0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n\
 253       3 dm-3 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n";
        let recs = collect(parse, input, NNUMS);
        let heads: Vec<(Vec<u8>, &[u64])> = recs.iter().map(|(n, s)| (s[0].clone(), &n[..3])).collect();
        assert_eq!(heads, [(b"nvme0n1".to_vec(), &[259, 0, 11][..]), (b"sda".to_vec(), &[8, 0, 15]), (b"dm-3".to_vec(), &[253, 3, 17])]);
        assert_eq!(recs[0].0[3..], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0], "absent stats are 0");
        assert_eq!(recs[1].0[3..], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0]);
        assert_eq!(recs[2].0[19], 17);
    }

    #[test]
    fn near_misses() {
        let count = |input: &[u8]| collect(parse, input, NNUMS).len();
        assert_eq!(count(b"8 0 sda 1 2 3 4 5 6 7 8 9 10\n"), 0, "10 stats");
        assert_eq!(count(b"8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x\n"), 1, "past 17 ignored");
        assert_eq!(count(b"8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 x\n"), 0, "bad 17th");
        assert_eq!(count(b"8 x sda 1 2 3 4 5 6 7 8 9 10 11\n"), 0, "bad minor");
        assert_eq!(count(b"8 0\n8\n\n"), 0, "no name");
        assert_eq!(count(b"8\x0b0\tsda\x0c1 2 3 4 5 6 7 8 9 10 11\r\n"), 1, "other whitespace");
        assert_eq!(count(b"8 0 sda 1 2 3 4 5 6 7 8 9 10 11"), 1, "no trailing newline");
    }
}
