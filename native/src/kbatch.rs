//! One pass over a batch of kernel-log records (`agent.kmsg.Kmsg` reads
//! them): each record's header fields and where its message is, the records
//! whose message names the NVIDIA driver (the Xid follower's candidates), and
//! those that the fault table's screen accepts (the kernel-fault source's
//! candidates), so that Python touches only the few records that matter.
//!
//! Input: the fault table's screen (as `kscreen` takes it: entries separated
//! by 0x1e, each `prefix` or `prefix 0x1f needle`; may be empty), a NUL byte,
//! then the records' text: lines separated by `\n`, as a file of `/dev/kmsg`
//! records holds them. An empty line and a line that starts with a space (a
//! record's ` KEY=value` continuation) is no record. Without a NUL byte there
//! is no text and no record.
//!
//! A record is parsed as `agent.kmsg.parse_record` does: `prio,seq,usec[,…];message`
//! (prio and seq u64 digits, usec too or absent); any other line is a record
//! without a header whose message is the whole line.
//!
//! Output (numbers only; one record per line kept, for the counts):
//! per record 6 numbers `flags` (1: it has a header, prio and seq; 2: and a
//! usec), `prio`, `seq`, `usec` (0 when absent), `start`, `end` (the message
//! is `input[start..end]`, offsets into the whole input); then the indices of
//! the records whose message contains `NVRM` or `SXid`; then, for each record
//! the screen accepts, its index and the index of the first entry (in screen
//! order) that accepts it; then 7 numbers: records, `sequential` (1 when every
//! record has a header and each sequence number is the previous one plus one,
//! and there is at least one record), `complete` (1 when every record has a
//! header and a usec), the first and the last sequence number (0 unless
//! sequential), how many NVIDIA indices, how many screen pairs.
//! Twin: `agent/parsers/kbatch.py`.

use crate::ffi::Out;
use crate::kscreen::Screen;
use crate::scan::{find_byte, line_end};
use crate::text::parse_u64;
use crate::xid::find;

pub const HEADER: u64 = 1;
pub const USEC: u64 = 2;

/// `flags, prio, seq, usec, start, end` of the line at `input[at..at + line.len()]`.
#[inline]
fn record(line: &[u8], at: usize) -> [u64; 6] {
    let whole = [0, 0, 0, 0, at as u64, (at + line.len()) as u64];
    let Some(semi) = find_byte(b';', line) else { return whole };
    let mut f = line[..semi].splitn(4, |&b| b == b',');
    let (Some(p), Some(q), Some(u)) = (f.next(), f.next(), f.next()) else { return whole };
    let (Some(prio), Some(seq)) = (parse_u64(p), parse_u64(q)) else { return whole };
    let (flags, usec) = parse_u64(u).map_or((HEADER, 0), |u| (HEADER | USEC, u));
    [flags, prio, seq, usec, (at + semi + 1) as u64, (at + line.len()) as u64]
}

pub fn parse(input: &[u8], out: &mut Out) {
    let Some(z) = find_byte(0, input) else {
        return out.nums(&[0; 7]);
    };
    let screen = Screen::new(&input[..z]);
    let (mut nvidia, mut screened) = (Vec::new(), Vec::new());
    let (mut records, mut sequential, mut complete, mut first, mut last) = (0u64, true, true, 0u64, 0u64);
    let mut start = z + 1;
    while start <= input.len() {
        let end = line_end(input, start);
        let line = &input[start..end];
        if !line.is_empty() && line[0] != b' ' {
            let r = record(line, start);
            let msg = &input[r[4] as usize..r[5] as usize];
            out.nums(&r);
            out.end_record();
            if find(msg, b"NVRM").is_some() || find(msg, b"SXid").is_some() {
                nvidia.push(records);
            }
            if let Some(k) = screen.entry(msg) {
                screened.extend([records, k as u64]);
            }
            complete = complete && r[0] == HEADER | USEC;
            if r[0] & HEADER == 0 || (records > 0 && last.checked_add(1) != Some(r[2])) {
                sequential = false;
            }
            if records == 0 {
                first = r[2];
            }
            last = r[2];
            records += 1;
        }
        start = end + 1;
    }
    sequential = sequential && records > 0;
    out.nums(&nvidia);
    out.nums(&screened);
    let (first, last) = if sequential { (first, last) } else { (0, 0) };
    let complete = u64::from(complete && records > 0);
    out.nums(&[records, u64::from(sequential), complete, first, last, nvidia.len() as u64, screened.len() as u64 / 2]);
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_kbatch(
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
    use crate::ffi::run_parser;

    fn run(input: &[u8]) -> Vec<u64> {
        let mut nums = vec![0u64; input.len() * 8 + 16];
        let mut counts = [0usize; 3];
        let rc = unsafe {
            run_parser(input.as_ptr(), input.len(), nums.as_mut_ptr(), nums.len(), std::ptr::null_mut(), 0, counts.as_mut_ptr(), super::parse)
        };
        assert_eq!(rc, 0);
        nums.truncate(counts[1]);
        nums
    }

    #[test]
    fn records_candidates_and_the_tail() {
        let input = b"BUG: \x1eINFO: task \x1fblocked\0\
6,7,100,-;BUG: soft lockup\n SUBSYSTEM=x\n\n4,8,200;NVRM: Xid (PCI:0000:3b:00): 79\nhello SXid\n";
        let at = |s: &[u8]| input.windows(s.len()).position(|w| w == s).unwrap() as u64;
        let (a, b, c) = (at(b"BUG: soft"), at(b"NVRM:"), at(b"hello"));
        assert_eq!(
            run(input),
            vec![
                3, 6, 7, 100, a, a + 16, // header and usec
                3, 4, 8, 200, b, b + 30,
                0, 0, 0, 0, c, c + 10, // no header: the whole line
                1, 2, // NVIDIA
                0, 0, // screened: record 0, entry 0
                3, 0, 0, 0, 0, 2, 1,
            ]
        );
    }

    #[test]
    fn sequential_and_odd_headers() {
        let tail = |v: Vec<u64>| v[v.len() - 7..].to_vec();
        assert_eq!(tail(run(b"\x006,7,1,-;a\n6,8,x;b\n6,9,3;c")), vec![3, 1, 0, 7, 9, 0, 0]);
        assert_eq!(tail(run(b"\x006,7,1,-;a\n6,8,2;b")), vec![2, 1, 1, 7, 8, 0, 0]);
        assert_eq!(run(b"\x006,7,x,-;a")[..4], [1, 6, 7, 0]); // usec absent
        assert_eq!(tail(run(b"\x006,7,1;a\n6,9,1;b")), vec![2, 0, 1, 0, 0, 0, 0]); // a gap
        assert_eq!(tail(run(b"\x006,18446744073709551615,1;a\n6,0,1;b")), vec![2, 0, 1, 0, 0, 0, 0]); // no wrap
        assert_eq!(run(b"\x006,a,1;m")[..4], [0, 0, 0, 0]); // seq not a number
        assert_eq!(run(b"\x006,7;m")[..4], [0, 0, 0, 0]); // two fields
        assert_eq!(run(b"no nul"), vec![0; 7]);
        assert_eq!(run(b"\0"), vec![0; 7]);
    }
}
