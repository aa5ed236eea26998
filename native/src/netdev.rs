//! `/proc/net/dev`: one record per interface.
//!
//! Record: 16 numbers (rx bytes, packets, errs, drop, fifo, frame, compressed,
//! multicast; tx bytes, packets, errs, drop, fifo, colls, carrier, compressed)
//! and 1 string (the interface name). Header lines (no `:`) and lines whose
//! first 16 fields are not all unsigned integers are skipped.

use crate::ffi::Out;
use crate::scan::{find_either, line_end, scan_u64s_line};
use crate::text::trim;

pub const NUMS: usize = 16;

pub fn parse(input: &[u8], out: &mut Out) {
    let mut vals = [0u64; NUMS];
    let mut start = 0;
    while start <= input.len() {
        // One pass per line: the name up to the first ':', the counters after
        // it (`"%6s:%8llu %7llu ..."`, net/core/net-procfs.c), then the rest.
        let rest = &input[start..];
        let mut next = start;
        if let Some(colon) = find_either(b':', b'\n', rest).filter(|&c| rest[c] == b':') {
            let name = trim(&rest[..colon]);
            if let Some((NUMS, after)) = scan_u64s_line(input, start + colon + 1, &mut vals) {
                if !name.is_empty() {
                    out.nums(&vals);
                    out.str(name);
                    out.end_record();
                }
                next = after;
            }
        }
        start = line_end(input, next) + 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::collect;

    fn names_and_ends(input: &[u8]) -> Vec<(Vec<u8>, u64, u64)> {
        collect(parse, input, NUMS).into_iter().map(|(n, s)| (s[0].clone(), n[0], n[15])).collect()
    }

    #[test]
    fn kernel_format() {
        let input = b"Inter-|   Receive                                                |  Transmit\n \
face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:  220675     940    0    0    0     0          0         0   220675     940    0    0    0     0       0          0\n\
enp65s0f1np1:4113554843466978 647090584154    0    0    0     0          0 38866712348 381773903637386 307634088346  669    0    0     0    2207          7\n";
        let recs = collect(parse, input, NUMS);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].1, vec![b"lo".to_vec()]);
        assert_eq!(recs[0].0, [220675, 940, 0, 0, 0, 0, 0, 0, 220675, 940, 0, 0, 0, 0, 0, 0]);
        assert_eq!(recs[1].1, vec![b"enp65s0f1np1".to_vec()]);
        assert_eq!(recs[1].0[0], 4113554843466978);
        assert_eq!(recs[1].0[14..], [2207, 7]);
    }

    #[test]
    fn near_misses() {
        let c16 = b" 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16";
        let line = |pre: &[u8], post: &[u8]| [pre, &c16[..], post].concat();
        assert_eq!(names_and_ends(&line(b"eth0:", b"")), [(b"eth0".to_vec(), 1, 16)]);
        assert_eq!(names_and_ends(&line(b"eth0:", b" 17 x\r\n")), [(b"eth0".to_vec(), 1, 16)]);
        assert!(names_and_ends(&line(b"eth0", b"\n")).is_empty(), "no colon");
        assert!(names_and_ends(&line(b" :", b"\n")).is_empty(), "empty name");
        assert!(names_and_ends(&line(b"eth0:", b"x\n")).is_empty(), "junk glued to the 16th counter");
        assert!(names_and_ends(b"eth0: 1 2 3\n").is_empty(), "truncated");
        assert!(names_and_ends(&line(b"eth0: +", b"\n")).is_empty(), "plus sign");
        assert!(names_and_ends(&line(b"eth0: 18446744073709551616", b"\n")).is_empty(), "overflow");
        assert_eq!(names_and_ends(&line(b"eth0:\x0b", b"\n")), [(b"eth0".to_vec(), 1, 16)], "vertical tab");
        assert_eq!(names_and_ends(&line(b"\n\n a b :", b"\n\n")), [(b"a b".to_vec(), 1, 16)], "blank lines, inner space");
        // a colon found on a later line must not be taken for this line's
        assert!(names_and_ends(&[&b"eth0 1 2\n"[..], b"x"].concat()).is_empty());
    }
}
