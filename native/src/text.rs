//! Byte-level helpers with exactly the semantics of the Python twins
//! (`bytes.split(b"\n")`, `bytes.split()`, ASCII-digit integers).

/// ASCII whitespace as Python's `bytes.split()` sees it (note: includes \x0b,
/// which `u8::is_ascii_whitespace` does not).
#[inline]
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
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
/// token among them is not a u64 (same rule as `parse_u64`). One pass, no
/// iterator adapters: this is the inner loop of every counter file.
#[inline]
pub fn scan_u64s(s: &[u8], out: &mut [u64]) -> Option<usize> {
    let mut i = 0;
    let mut n = 0;
    while n < out.len() {
        while i < s.len() && is_ws(s[i]) {
            i += 1;
        }
        if i == s.len() {
            break;
        }
        let mut v: u64 = 0;
        let start = i;
        while i < s.len() && !is_ws(s[i]) {
            let d = s[i].wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            v = v.checked_mul(10)?.checked_add(u64::from(d))?;
            i += 1;
        }
        debug_assert!(i > start);
        out[n] = v;
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
pub fn unescape_octal(s: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && i + 3 < s.len() && is_oct(s[i + 1]) && is_oct(s[i + 2]) && is_oct(s[i + 3]) {
            let v = u32::from(s[i + 1] - b'0') * 64 + u32::from(s[i + 2] - b'0') * 8 + u32::from(s[i + 3] - b'0');
            if v <= 0xff {
                out.push(v as u8);
                i += 4;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
}

#[inline]
fn is_oct(b: u8) -> bool {
    (b'0'..=b'7').contains(&b)
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
        let mut v = Vec::new();
        unescape_octal(b"/mnt/a\\040b\\134c\\777\\12", &mut v);
        assert_eq!(v, b"/mnt/a b\\c\\777\\12");
    }

    #[test]
    fn whitespace() {
        let f: Vec<&[u8]> = fields(b" a\x0bb\tc  ").collect();
        assert_eq!(f, vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(trim(b" \x0c x \r"), b"x");
    }
}
