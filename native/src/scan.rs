//! The parsers' hot loops: finding bytes and classifying input 64 bytes at a
//! time (SSE2 on x86_64, eight bytes at a time in plain integers elsewhere),
//! and reading counters from those masks; with the exact semantics of the
//! byte-by-byte helpers in `text`, which the tests hold them to.

use crate::masks::{class_masks64, nonzero_bytes, zero_bytes, LO};
use crate::text::{is_ws, parse_u64};

/// `scan_u64s` over the line that goes on at `buf[i..]`: stops at its `\n`
/// (or the end of `buf`) and also returns the index after the last number.
///
/// This is the inner loop of every counter file. It classifies 64 bytes at a
/// time (blank, newline, digit) and takes the numbers from those masks: a
/// token is a run of non-blank bytes, valid when all of them are digits, and
/// up to 16 digits are converted eight bytes at a time. No first pass to find
/// where the line ends, no branch on each byte.
#[inline]
pub fn scan_u64s_line(buf: &[u8], mut i: usize, out: &mut [u64]) -> Option<(usize, usize)> {
    let mut n = 0;
    loop {
        let ([blank, newline, digit], covered) = class_masks64(buf, i);
        let in_line = match (newline, covered) {
            (0, 64) => u64::MAX,
            (0, c) => (1 << c) - 1,
            (nl, _) => (nl & nl.wrapping_neg()) - 1,
        };
        let token = !blank & in_line;
        let junk = token & !digit; // bytes that make their token invalid
        let mut starts = token & !(token << 1);
        let mut ends = token & !(token >> 1); // the last byte of each token
        let mut next = i + 64;
        if in_line == u64::MAX && token >> 63 == 1 {
            // the last token may run on: read it again in the next window, from its start
            let last = 63 - starts.leading_zeros();
            if last == 0 {
                let (v, end) = long_token(buf, i)?;
                out[n] = v;
                n += 1;
                if n == out.len() {
                    return Some((n, end));
                }
                i = end;
                continue;
            }
            starts &= !(1 << last);
            ends &= !(1 << 63);
            next = i + last as usize;
        }
        while starts != 0 {
            let (s, e) = (starts.trailing_zeros(), ends.trailing_zeros() + 1);
            starts &= starts - 1;
            ends &= ends - 1;
            if junk != 0 && junk & ((u64::MAX >> (64 - (e - s))) << s) != 0 {
                return None;
            }
            out[n] = digits_at(buf, i + s as usize, (e - s) as usize)?;
            n += 1;
            if n == out.len() {
                return Some((n, i + e as usize));
            }
        }
        if in_line != u64::MAX {
            return Some((n, i + in_line.count_ones() as usize)); // the line ended
        }
        i = next;
    }
}

/// The u64 written by the `k` ASCII digits at `buf[at..]`; `None` if it overflows.
#[inline(always)]
fn digits_at(buf: &[u8], at: usize, k: usize) -> Option<u64> {
    let (Some(a), Some(b), true) = (load8(buf, at), load8(buf, at + 8), k <= 16) else {
        return parse_u64(&buf[at..at + k]); // near the end of the input, or 17 digits and more
    };
    let (da, db) = (a ^ (LO * u64::from(b'0')), b ^ (LO * u64::from(b'0'))); // digits become 0..=9
    if k <= 8 {
        // `x << (64 - 8k)` keeps the k leading digits as the low-order ones
        return Some(eight_digits(da << (64 - 8 * k)));
    }
    Some(eight_digits(da) * POW10[k - 8] + eight_digits(db << (128 - 8 * k)))
}

/// The index of the first byte at or after `i` that is not a blank (whitespace
/// other than `\n`), or `buf.len()`.
#[inline(always)]
pub fn skip_blanks(buf: &[u8], mut i: usize) -> usize {
    loop {
        if let Some(x) = load8(buf, i) {
            let other = nonzero_bytes(x ^ (LO * u64::from(b' ')));
            if other == 0 {
                i += 8;
                continue;
            }
            i += (other.trailing_zeros() / 8) as usize;
        }
        match buf.get(i) {
            Some(&b) if b != b'\n' && is_ws(b) => i += 1,
            _ => return i,
        }
    }
}

/// The index of the first whitespace byte (`\n` included) at or after `i`, or `buf.len()`.
#[inline]
pub fn token_end(buf: &[u8], i: usize) -> usize {
    buf[i..].iter().position(|&b| is_ws(b)).map_or(buf.len(), |n| i + n)
}

/// The index of the `\n` that ends the line going on at `i`, or `buf.len()`.
#[inline]
pub fn line_end(buf: &[u8], i: usize) -> usize {
    find_byte(b'\n', &buf[i..]).map_or(buf.len(), |n| i + n)
}

/// A token of 64 bytes or more at `buf[i..]` (leading zeros, or junk): its value
/// if it is all digits and fits a u64, and the index after it.
#[cold]
fn long_token(buf: &[u8], i: usize) -> Option<(u64, usize)> {
    let end = i + buf[i..].iter().take_while(|&&b| !is_ws(b)).count();
    Some((parse_u64(&buf[i..end])?, end))
}

const POW10: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

#[inline(always)]
fn load8(s: &[u8], i: usize) -> Option<u64> {
    s.get(i..i + 8).map(|c| u64::from_le_bytes(c.try_into().unwrap()))
}

/// Eight digit values (0..=9, first digit in the lowest byte) as one number.
#[inline(always)]
fn eight_digits(d: u64) -> u64 {
    let d = (d.wrapping_mul(10) + (d >> 8)) & 0x00FF_00FF_00FF_00FF;
    let d = (d.wrapping_mul(100) + (d >> 16)) & 0x0000_FFFF_0000_FFFF;
    (d.wrapping_mul(10_000) + (d >> 32)) & 0xFFFF_FFFF
}

/// Index of the first `needle` in `hay` (std has no public memchr): 16 bytes at
/// a time with SSE2 on x86_64 (`find_in`), else eight at a time.
#[inline]
pub fn find_byte(needle: u8, hay: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if hay.len() >= 16 {
        return find_in([needle], hay);
    }
    let pattern = LO * u64::from(needle);
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let found = zero_bytes(u64::from_le_bytes(chunk.try_into().unwrap()) ^ pattern);
        if found != 0 {
            return Some(base + (found.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks.remainder().iter().position(|&b| b == needle).map(|i| base + i)
}

/// Index of the first byte of `hay` that is `a` or `b`: 16 bytes at a time with
/// SSE2 on x86_64, else eight at a time.
#[inline]
pub fn find_either(a: u8, b: u8, hay: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if hay.len() >= 16 {
        return find_in([a, b], hay);
    }
    let (pa, pb) = (LO * u64::from(a), LO * u64::from(b));
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().unwrap());
        let found = zero_bytes(x ^ pa) | zero_bytes(x ^ pb);
        if found != 0 {
            return Some(base + (found.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks.remainder().iter().position(|&c| c == a || c == b).map(|i| base + i)
}

/// Index of the first byte of `hay` (16 bytes or more) that is one of `set`, 16
/// bytes at a time (SSE2 is part of every x86_64); the last 16 bytes are read
/// overlapping the ones before, with the bytes already looked at masked off.
#[cfg(target_arch = "x86_64")]
#[inline]
fn find_in<const N: usize>(set: [u8; N], hay: &[u8]) -> Option<usize> {
    debug_assert!(hay.len() >= 16 && N > 0);
    let mut i = 0;
    while i + 16 <= hay.len() {
        let bits = hits16(&set, hay, i);
        if bits != 0 {
            return Some(i + bits.trailing_zeros() as usize);
        }
        i += 16;
    }
    if i == hay.len() {
        return None;
    }
    let last = hay.len() - 16; // < i: bytes last..i were looked at
    let bits = hits16(&set, hay, last) & (u32::MAX << (i - last));
    (bits != 0).then(|| last + bits.trailing_zeros() as usize)
}

/// Bit k set: `hay[at + k]` is one of `set`, for the 16 bytes at `at`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn hits16<const N: usize>(set: &[u8; N], hay: &[u8], at: usize) -> u32 {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
    assert!(at + 16 <= hay.len());
    // SAFETY: SSE2 is in every x86_64 target's baseline, so these instructions always exist; the
    // unaligned load reads hay[at..at + 16], in bounds (asserted above).
    unsafe {
        let v = _mm_loadu_si128(hay.as_ptr().add(at).cast::<__m128i>());
        let mut m = _mm_cmpeq_epi8(v, _mm_set1_epi8(set[0] as i8));
        for &b in &set[1..] {
            m = _mm_or_si128(m, _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8)));
        }
        _mm_movemask_epi8(m) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_byte_and_either_agree_with_a_plain_search_at_every_length_and_position() {
        for len in 0..70usize {
            for at in 0..=len {
                let mut hay: Vec<u8> = (0..len).map(|k| b'a' + (k % 7) as u8).collect();
                if at < len {
                    hay[at] = b'X';
                }
                if at + 3 < len {
                    hay[at + 3] = b'Y'; // a later byte of the set must not win
                }
                let plain = |set: &[u8]| hay.iter().position(|c| set.contains(c));
                assert_eq!(find_byte(b'X', &hay), plain(b"X"), "len {len} at {at}");
                assert_eq!(find_either(b'Y', b'X', &hay), plain(b"XY"), "len {len} at {at}");
                assert_eq!(find_byte(b'Z', &hay), None);
            }
        }
    }
    use crate::text::fields;

    /// `scan_u64s_line` by the simplest reading of its contract.
    fn reference(line: &[u8], n: usize) -> Option<Vec<u64>> {
        let mut out = Vec::new();
        for token in fields(line).take(n) {
            out.push(parse_u64(token)?);
        }
        Some(out)
    }

    fn scan_line(buf: &[u8], i: usize, n: usize) -> Option<Vec<u64>> {
        let mut out = vec![0u64; n];
        let (got, _) = scan_u64s_line(buf, i, &mut out)?;
        out.truncate(got);
        Some(out)
    }

    #[test]
    fn every_number_length_at_every_offset() {
        for digits in 1..=25 {
            let number: Vec<u8> = (0..digits).map(|d| b'1' + (d % 9) as u8).collect();
            for pad in 0..20 {
                for tail in [&b""[..], b"\n", b" ", b"\t7\n", b"x", b"\n1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17"] {
                    let buf = [&b" ".repeat(pad)[..], &number, tail].concat();
                    let line = &buf[..buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len())];
                    assert_eq!(scan_line(&buf, 0, 3), reference(line, 3), "{:?}", String::from_utf8_lossy(&buf));
                }
            }
        }
    }

    #[test]
    fn limits() {
        assert_eq!(scan_line(b"18446744073709551615 0\n", 0, 2), Some(vec![u64::MAX, 0]));
        assert_eq!(scan_line(b"18446744073709551616 0\n", 0, 2), None);
        assert_eq!(scan_line(b"0000000000000000000000000000000000000042\n", 0, 2), Some(vec![42]));
        assert_eq!(scan_line(b"99999999999999999999\n", 0, 2), None);
        assert_eq!(scan_line(b"1 2\n3 4", 0, 4), Some(vec![1, 2]), "stops at the line's end");
        assert_eq!(scan_line(b"1 2\n3 4", 4, 4), Some(vec![3, 4]));
        assert_eq!(scan_line(b"\x0b1\x0c2\r3\t", 0, 4), Some(vec![1, 2, 3]));
        assert_eq!(scan_line(b"12345678\x0012345678 9", 0, 2), None, "NUL is not a separator");
        assert_eq!(scan_line(b"1 2 3 x", 0, 3), Some(vec![1, 2, 3]), "only the first n tokens count");
        let zeros = [&b"0".repeat(70)[..], b"42 7\n"].concat();
        assert_eq!(scan_line(&zeros, 0, 2), Some(vec![42, 7]), "a token longer than a window");
        assert_eq!(scan_line(&[&b"0".repeat(70)[..], b"x 7\n"].concat(), 0, 2), None);
        assert_eq!(scan_line(&b"9".repeat(70), 0, 2), None);
    }

    #[test]
    fn generated_lines_match_the_reference() {
        let alphabet: &[&[u8]] = &[b" ", b"  ", b"\t", b"\x0b", b"\r", b"\n", b"0", b"7", b"42", b"123456789", b"18446744073709551615", b"18446744073709551616", b"00000000000000000000001", b"x", b"+", b"\xff", b":"];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || crate::masks::xorshift(&mut seed);
        for _ in 0..20_000 {
            let len = (next() % 24) as usize;
            let buf: Vec<u8> = (0..len).flat_map(|_| alphabet[(next() % alphabet.len() as u64) as usize].iter().copied()).collect();
            let line = &buf[..buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len())];
            let n = 1 + (next() % 17) as usize;
            assert_eq!(scan_line(&buf, 0, n), reference(line, n), "{:?}", String::from_utf8_lossy(&buf));
        }
    }

    #[test]
    fn finding_bytes() {
        for len in 0..40 {
            for at in 0..len {
                let mut hay = vec![b'a'; len];
                hay[at] = b'\n';
                assert_eq!(find_byte(b'\n', &hay), Some(at));
                assert_eq!(find_either(b':', b'\n', &hay), Some(at));
                hay[at] = 0x8a; // a byte that differs from the needle only in its high bit
                assert_eq!(find_byte(b'\n', &hay), None);
            }
        }
        assert_eq!(find_either(b':', b'\n', b"abc\x00:\n"), Some(4));
        assert_eq!(skip_blanks(b"  \t\x0b\x0c\r        \nx", 0), 14);
        assert_eq!(token_end(b"abc\x0bd", 0), 3);
        assert_eq!(line_end(b"ab\ncd", 3), 5);
    }
}
