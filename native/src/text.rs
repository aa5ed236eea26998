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

/// Splits `input` into lines on `\n` only, like Python's `bytes.split(b"\n")`.
#[inline]
pub fn lines(input: &[u8]) -> impl Iterator<Item = &[u8]> {
    input.split(|&b| b == b'\n')
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
}
