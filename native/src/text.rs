//! Byte-level helpers with exactly the semantics of the Python twins
//! (`bytes.split(b"\n")`, `bytes.split()`, ASCII-digit integers).

/// ASCII whitespace as Python's `bytes.split()` sees it (note: includes \x0b,
/// which `u8::is_ascii_whitespace` does not).
#[inline(always)]
pub fn is_ws(b: u8) -> bool {
    b == b' ' || b.wrapping_sub(b'\t') < 5 // \t \n \x0b \x0c \r
}

/// Splits on runs of whitespace, like Python's `bytes.split()`.
#[inline]
pub fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| is_ws(b)).filter(|f| !f.is_empty())
}

/// Strips leading and trailing whitespace, like Python's `bytes.strip()`.
#[inline]
pub fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_ws(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|&b| !is_ws(b)).map_or(start, |i| i + 1);
    &s[start..end]
}

/// A non-empty run of ASCII digits that fits in a u64; anything else is `None`.
#[inline]
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Parses up to `out.len()` whitespace-separated unsigned integers from `s`.
/// Returns how many were parsed before the end of `s`; `None` as soon as a
/// token among them is not a u64 (same rule as `parse_u64`).
#[inline]
pub fn scan_u64s(s: &[u8], out: &mut [u64]) -> Option<usize> {
    let mut n = 0;
    for token in fields(s).take(out.len()) {
        out[n] = parse_u64(token)?;
        n += 1;
    }
    Some(n)
}

/// `scan_u64s` over the line that goes on at `buf[i..]`: stops at its `\n`
/// (or the end of `buf`) and also returns the index after the last number.
///
/// This is the inner loop of every counter file. Counters are right-aligned
/// in runs of spaces: blanks are skipped and up to 16 digits converted eight
/// bytes at a time, without a branch on each number's length, and without a
/// first pass to find where the line ends.
#[inline]
pub fn scan_u64s_line(buf: &[u8], mut i: usize, out: &mut [u64]) -> Option<(usize, usize)> {
    let mut n = 0;
    while n < out.len() {
        i = skip_blanks(buf, i);
        match buf.get(i) {
            None | Some(b'\n') => break,
            Some(_) => {}
        }
        let fast = match (load8(buf, i), load8(buf, i + 8)) {
            (Some(a), Some(b)) => digits16(a, b, i),
            _ => None,
        };
        let (v, next) = match fast {
            Some(found) => found,
            None => slow_digits(buf, i)?,
        };
        if buf.get(next).is_some_and(|&b| !is_ws(b)) {
            return None;
        }
        out[n] = v;
        n += 1;
        i = next;
    }
    Some((n, i))
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

/// The number written by the leading digits of the 16 bytes `a`, `b` read at
/// `i`, and the index after its last digit; `None` (ask `slow_digits`) when
/// there is no digit or 16 digits and more. The caller checks what follows.
#[inline(always)]
fn digits16(a: u64, b: u64, i: usize) -> Option<(u64, usize)> {
    let (da, db) = (a ^ (LO * u64::from(b'0')), b ^ (LO * u64::from(b'0'))); // digits become 0..=9
    let ka = nondigit_bytes(da).trailing_zeros() / 8; // 8 when all eight are digits
    let kb = nondigit_bytes(db).trailing_zeros() / 8;
    if ka == 0 || kb == 8 {
        return None;
    }
    let lb = if ka == 8 { kb } else { 0 };
    // `x << (64 - 8k)` keeps the k leading digits as the low-order ones; split
    // in two shifts so that k = 0 gives 0 instead of overflowing the shift.
    let hi = eight_digits(da << (64 - 8 * ka));
    let lo = eight_digits((db << (32 - 4 * lb)) << (32 - 4 * lb));
    Some((hi * POW10[lb as usize] + lo, i + (ka + lb) as usize))
}

/// The number at `buf[i..]` one byte at a time (near the end of the input, or
/// 16 digits and more); `None` when there is no digit or it overflows a u64.
#[cold]
fn slow_digits(buf: &[u8], i: usize) -> Option<(u64, usize)> {
    let len = buf[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    Some((parse_u64(&buf[i..i + len])?, i + len))
}

const POW10: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

#[inline(always)]
fn load8(s: &[u8], i: usize) -> Option<u64> {
    s.get(i..i + 8).map(|c| u64::from_le_bytes(c.try_into().unwrap()))
}

/// The high bit of the first zero byte of `x`, and maybe of bytes above it
/// (a borrow can flag those): only the lowest flag is exact.
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(LO) & !x & HI
}

/// The high bit of every byte of `x` that is not zero (exact: no carry between bytes).
#[inline(always)]
fn nonzero_bytes(x: u64) -> u64 {
    (((x & !HI) + !HI) | x) & HI
}

/// The high bit of every byte of `d` (a chunk xor b'0') that is not 0..=9.
#[inline(always)]
fn nondigit_bytes(d: u64) -> u64 {
    (((d & !HI) + LO * (0x80 - 10)) | d) & HI
}

/// Eight digit values (0..=9, first digit in the lowest byte) as one number.
#[inline(always)]
fn eight_digits(d: u64) -> u64 {
    let d = (d.wrapping_mul(10) + (d >> 8)) & 0x00FF_00FF_00FF_00FF;
    let d = (d.wrapping_mul(100) + (d >> 16)) & 0x0000_FFFF_0000_FFFF;
    (d.wrapping_mul(10_000) + (d >> 32)) & 0xFFFF_FFFF
}

/// Splits `input` into lines on `\n` only, like Python's `bytes.split(b"\n")`.
#[inline]
pub fn lines(input: &[u8]) -> impl Iterator<Item = &[u8]> {
    input.split(|&b| b == b'\n')
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Index of the first `needle` in `hay`, eight bytes at a time (std has no
/// public memchr).
#[inline]
pub fn find_byte(needle: u8, hay: &[u8]) -> Option<usize> {
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

/// Index of the first byte of `hay` that is `a` or `b`, eight bytes at a time.
#[inline]
pub fn find_either(a: u8, b: u8, hay: &[u8]) -> Option<usize> {
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

/// Decodes the kernel's `\ooo` escapes (seq_file `mangle`): a backslash followed
/// by exactly three octal digits whose value fits a byte becomes that byte;
/// every other backslash is kept as it is.
pub fn unescape_octal(s: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *s.get(i)?;
        if let (b'\\', Some(v)) = (b, s.get(i + 1..i + 4).and_then(octal_byte)) {
            i += 4;
            return Some(v);
        }
        i += 1;
        Some(b)
    })
}

#[inline]
fn octal_byte(d: &[u8]) -> Option<u8> {
    let is_oct = |b: u8| (b'0'..=b'7').contains(&b);
    // The first digit is at most 3: \400 and up do not fit a byte.
    ((b'0'..=b'3').contains(&d[0]) && is_oct(d[1]) && is_oct(d[2])).then(|| (d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
    }

    #[test]
    fn scan() {
        let mut out = [0u64; 3];
        assert_eq!(scan_u64s(b" 1 22\t333 4", &mut out), Some(3));
        assert_eq!(out, [1, 22, 333]);
        assert_eq!(scan_u64s(b" 1 ", &mut out), Some(1));
        assert_eq!(scan_u64s(b"1 x2 3", &mut out), None);
        assert_eq!(scan_u64s(b"1 2 3 x", &mut out), Some(3));
    }

    #[test]
    fn octal() {
        let v: Vec<u8> = unescape_octal(b"/mnt/a\\040b\\134c\\777\\12\\\\101\\011\\").collect();
        assert_eq!(v, b"/mnt/a b\\c\\777\\12\\A\t\\");
    }

    #[test]
    fn whitespace() {
        let f: Vec<&[u8]> = fields(b" a\x0bb\tc  ").collect();
        assert_eq!(f, vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(trim(b" \x0c x \r"), b"x");
    }

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
    }

    #[test]
    fn generated_lines_match_the_reference() {
        let alphabet: &[&[u8]] = &[b" ", b"  ", b"\t", b"\x0b", b"\r", b"\n", b"0", b"7", b"42", b"123456789", b"18446744073709551615", b"18446744073709551616", b"00000000000000000000001", b"x", b"+", b"\xff", b":"];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
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
