//! The kernel-fault table's screen: which kernel messages start with one of
//! the table's literal prefixes (and, where an entry names one, contain its
//! needle after the prefix). Only those lines go on to the table's regular
//! expressions in Python (`agent.kernel.patterns.Table.scan`); a kernel log is
//! almost all lines that no pattern matches, and this rejects them at the cost
//! of one look at their first byte.
//!
//! Input: the screen, a NUL byte, then the messages separated by `\n`. The
//! screen is its entries separated by 0x1e, each `prefix` or `prefix 0x1f
//! needle`; an entry with an empty prefix and a needle accepts a message that
//! holds the needle anywhere (a message whose head varies, such as a driver's
//! `<driver> <bus id>: <ifname>: NETDEV WATCHDOG: …`: it costs a search of
//! every message, so the table keeps such entries few); an entry with neither
//! is ignored. Without a NUL byte there is no screen and nothing matches.
//!
//! Record: 2 numbers (the message's 0-based line, the index of the first entry
//! in screen order that accepts it), no strings. Twin: `agent/parsers/kscreen.py`.

use crate::ffi::Out;
use crate::scan::{find_byte, line_end};
use crate::xid::find;

/// The screen's entries, by the first byte of their prefix; those without a prefix apart.
pub struct Screen<'a> {
    entries: Vec<(&'a [u8], &'a [u8])>,
    by_first: Vec<Vec<usize>>,
    anywhere: Vec<usize>,
}

impl<'a> Screen<'a> {
    /// The screen written as `spec` (entries separated by 0x1e, `prefix` or `prefix 0x1f needle`).
    pub fn new(spec: &'a [u8]) -> Self {
        let mut entries: Vec<(&[u8], &[u8])> = Vec::new();
        if !spec.is_empty() {
            for e in spec.split(|&b| b == 0x1e) {
                entries.push(match e.iter().position(|&b| b == 0x1f) {
                    Some(k) => (&e[..k], &e[k + 1..]),
                    None => (e, &b""[..]),
                });
            }
        }
        let mut by_first: Vec<Vec<usize>> = vec![Vec::new(); 256];
        let mut anywhere = Vec::new();
        for (k, (prefix, needle)) in entries.iter().enumerate() {
            match prefix.first() {
                Some(&b) => by_first[b as usize].push(k),
                None if !needle.is_empty() => anywhere.push(k),
                None => {}
            }
        }
        Screen { entries, by_first, anywhere }
    }

    /// The index of the first entry that accepts `msg`, if one does.
    #[inline]
    pub fn entry(&self, msg: &[u8]) -> Option<usize> {
        let &b = msg.first()?;
        let head = self.by_first[b as usize].iter().copied().find(|&k| {
            let (prefix, needle) = self.entries[k];
            msg.starts_with(prefix) && (needle.is_empty() || find(&msg[prefix.len()..], needle).is_some())
        });
        let before = head.unwrap_or(usize::MAX); // an entry without a prefix wins only from before it
        let any = self.anywhere.iter().copied().take_while(|&k| k < before).find(|&k| find(msg, self.entries[k].1).is_some());
        any.or(head)
    }
}

pub fn parse(input: &[u8], out: &mut Out) {
    let Some(z) = find_byte(0, input) else { return };
    let (screen, text) = (Screen::new(&input[..z]), &input[z + 1..]);
    let (mut start, mut line) = (0usize, 0u64);
    while start <= text.len() {
        let end = line_end(text, start);
        if let Some(k) = screen.entry(&text[start..end]) {
            out.num(line);
            out.num(k as u64);
            out.end_record();
        }
        start = end + 1;
        line += 1;
    }
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_kscreen(
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
    use crate::ffi::collect;

    fn run(input: &[u8]) -> Vec<(u64, u64)> {
        collect(super::parse, input, 2).into_iter().map(|(n, _)| (n[0], n[1])).collect()
    }

    #[test]
    fn first_entry_that_accepts_each_line() {
        let input = b"BUG: \x1eINFO: task \x1emlx5_core \x1ftimeout. Will\x1emlx5_core \x1fFatal error\0\
INFO: task x:1 blocked\nhello\nBUG: soft lockup\n\nmlx5_core 0000:41:00.0: Fatal error 1 detected\nmlx5_core 0: E-Switch";
        assert_eq!(run(input), vec![(0, 1), (2, 0), (4, 3)]);
    }

    #[test]
    fn the_first_entry_in_screen_order_wins_with_or_without_a_prefix() {
        let input = b"a\x1fz\x1e\x1fWATCHDOG\x1eb\0a WATCHDOG z\nb WATCHDOG\nWATCHDOG\nb";
        assert_eq!(run(input), vec![(0, 0), (1, 1), (2, 1), (3, 2)]);
    }

    #[test]
    fn no_screen_or_empty_prefixes_match_nothing() {
        assert_eq!(run(b"BUG: x\nOops"), vec![]);
        assert_eq!(run(b"\0BUG: x"), vec![]);
        assert_eq!(run(b"\x1f\0BUG: x"), vec![]); // neither prefix nor needle
        assert_eq!(run(b"\x1fBUG\0BUG: x\nan xBUG\nBU"), vec![(0, 0), (1, 0)]); // a needle anywhere
        assert_eq!(run(b"BUG\0"), vec![]);
        assert_eq!(run(b"BUG\0BUG"), vec![(0, 0)]);
        assert_eq!(run(b"mlx5 \x1fabc\0mlx5 ab\nmlx5 xabc\nmlx5abc"), vec![(1, 0)]);
    }
}
