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
use crate::scan::{find_byte, find_either, line_end};

/// How rare a byte is in kernel messages (higher: rarer), roughly: lower-case
/// letters by their frequency (`v` is common: device, veth, nvidia, driver),
/// then punctuation, the upper-case letters of a GPU node's usual words (NVRM,
/// PCI, GPU, SXid, ...), then the rest. A needle is looked for by its rarest
/// byte, 16 bytes at a time (`scan::find_byte`), so that the search seldom stops (a needle of
/// lower-case words stops at every `e` or `a` when looked for by its first byte).
fn rarity(b: u8) -> u8 {
    const LOWER: &[u8] = b"etaoinsrclduhmpvgfbxwykjqz"; // most common first
    const UPPER: &[u8] = b"NVRMPCIGUSEADXOTL"; // common in a GPU node's log
    match b {
        b' ' => 0,
        b'0'..=b'9' => 4,
        b':' | b'.' | b',' | b'_' => 6,
        b'a'..=b'z' => 1 + LOWER.iter().position(|&c| c == b).unwrap_or(0) as u8,
        b'(' | b')' | b'-' | b'/' | b'[' | b']' | b'=' => 27,
        _ if UPPER.contains(&b) => 28,
        _ => 30,
    }
}

/// The indices of `needle`'s two rarest bytes (the first of equals; both 0 for one byte).
fn rarest(needle: &[u8]) -> (usize, usize) {
    let mut order: Vec<usize> = (0..needle.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(rarity(needle[i])), i));
    (order.first().copied().unwrap_or(0), order.get(1).or(order.first()).copied().unwrap_or(0))
}

/// The first eight bytes of `prefix` (fewer: zero-padded) as a little-endian word, and the mask of those present.
fn head_word(prefix: &[u8]) -> (u64, u64) {
    let n = prefix.len().min(8);
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(&prefix[..n]);
    (u64::from_le_bytes(b), if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 })
}

/// Whether `hay` holds `needle`, found by its byte at `k` (its rarest).
#[inline]
fn holds(hay: &[u8], needle: &[u8], k: usize) -> bool {
    if needle.is_empty() {
        return true;
    }
    let Some(last) = hay.len().checked_sub(needle.len()) else { return false };
    let (b, end) = (needle[k], last + k + 1); // the rare byte of a match lies before `end`
    let mut from = k;
    while from < end {
        let Some(i) = find_byte(b, &hay[from..end]) else { return false };
        let start = from + i - k;
        if &hay[start..start + needle.len()] == needle {
            return true;
        }
        from += i + 1;
    }
    false
}

/// One entry of the screen: its prefix, its needle, the indices of the needle's two rarest bytes.
type Entry<'a> = (&'a [u8], &'a [u8], (usize, usize));

/// The screen's entries, by the first byte of their prefix; those without a prefix apart.
pub struct Screen<'a> {
    entries: Vec<Entry<'a>>,
    /// Per entry, its prefix's first eight bytes (fewer: zero-padded) as a word, and the mask of those bytes.
    heads: Vec<(u64, u64)>,
    /// Per first byte, the entries whose prefix starts with it, in screen order, each with whether its
    /// prefix is the previous one's in the list (many share `mlx5_core `, `nvme nvme`: compared once).
    by_first: Vec<Vec<(usize, bool)>>,
    anywhere: Vec<usize>,
    /// The rarest bytes of the entries without a prefix, when there are one or two
    /// distinct ones: a message that holds neither skips them all in one pass.
    rare: Option<(u8, u8)>,
}

impl<'a> Screen<'a> {
    /// The screen written as `spec` (entries separated by 0x1e, `prefix` or `prefix 0x1f needle`).
    pub fn new(spec: &'a [u8]) -> Self {
        let mut entries: Vec<Entry<'a>> = Vec::new();
        if !spec.is_empty() {
            for e in spec.split(|&b| b == 0x1e) {
                let (prefix, needle) = match e.iter().position(|&b| b == 0x1f) {
                    Some(k) => (&e[..k], &e[k + 1..]),
                    None => (e, &b""[..]),
                };
                entries.push((prefix, needle, rarest(needle)));
            }
        }
        let mut by_first: Vec<Vec<(usize, bool)>> = vec![Vec::new(); 256];
        let mut anywhere = Vec::new();
        for (k, (prefix, needle, _)) in entries.iter().enumerate() {
            match prefix.first() {
                Some(&b) => {
                    let list = &mut by_first[b as usize];
                    let same = list.last().is_some_and(|&(j, _)| entries[j].0 == *prefix);
                    list.push((k, same));
                }
                None if !needle.is_empty() => anywhere.push(k),
                None => {}
            }
        }
        let mut bytes: Vec<u8> = anywhere.iter().map(|&k| { let (_, n, (r, _)) = entries[k]; n[r] }).collect();
        bytes.sort_unstable();
        bytes.dedup();
        let rare = match bytes[..] {
            [a] => Some((a, a)),
            [a, b] => Some((a, b)),
            _ => None,
        };
        let heads = entries.iter().map(|&(prefix, _, _)| head_word(prefix)).collect();
        Screen { entries, heads, by_first, anywhere, rare }
    }

    /// The index of the first entry that accepts `msg`, if one does.
    #[inline]
    pub fn entry(&self, msg: &[u8]) -> Option<usize> {
        let &b = msg.first()?;
        let word = msg.get(..8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        let mut starts = false; // whether `msg` starts with the prefix of the entry before in the list
        let mut head = None;
        for &(k, same) in &self.by_first[b as usize] {
            let (prefix, needle, (r1, _)) = self.entries[k];
            if !same {
                // one compare of a word refuses almost every prefix; a longer one is compared past it
                starts = match word {
                    Some(w) => {
                        let (v, m) = self.heads[k];
                        w & m == v && (prefix.len() <= 8 || msg[8..].starts_with(&prefix[8..]))
                    }
                    None => msg.starts_with(prefix),
                };
            }
            if !starts {
                continue;
            }
            if needle.is_empty() {
                head = Some(k);
                break;
            }
            if holds(&msg[prefix.len()..], needle, r1) {
                head = Some(k);
                break;
            }
        }
        let before = head.unwrap_or(usize::MAX); // an entry without a prefix wins only from before it
        if let Some((a, b)) = self.rare {
            if find_either(a, b, msg).is_none() {
                return head;
            }
        }
        let any = self.anywhere.iter().copied().take_while(|&k| k < before).find(|&k| {
            let (_, needle, (r1, _)) = self.entries[k];
            holds(msg, needle, r1)
        });
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
    fn a_needle_is_found_by_its_rarest_byte_anywhere_in_the_message() {
        for (hay, needle, found) in [
            (&b"abc Will x"[..], &b"Will"[..], true),
            (b"Will", b"Will", true),
            (b"Wil", b"Will", false),
            (b"xxWilWill", b"Will", true),
            (b"device's health", b"device's", true),
            (b"devices's", b"device's", false),
            (b"aaaa", b"aa", true),
            (b"", b"a", false),
            (b"abc", b"", true),
        ] {
            assert_eq!(super::holds(hay, needle, super::rarest(needle).0), found, "{:?} {:?}", hay, needle);
            assert_eq!(super::holds(hay, needle, super::rarest(needle).1), found, "{:?} {:?}", hay, needle);
        }
        assert_eq!(super::rarest(b"a timeout. Will"), (11, 4));
        assert_eq!(super::rarest(b"x"), (0, 0));
        assert_eq!(super::rarest(b""), (0, 0));
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
