//! Byte classes of 16 and 64 bytes at a time as bit masks (bit `k` for byte
//! `k`): SSE2 on x86_64 (part of every x86_64 target), plain 64-bit integer
//! arithmetic elsewhere (SWAR); unit tests hold the two equal.

use crate::text::is_ws;

pub(crate) const LO: u64 = 0x0101_0101_0101_0101;
pub(crate) const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of the first zero byte of `x`, and maybe of bytes above it
/// (a borrow can flag those): only the lowest flag is exact.
#[inline(always)]
pub(crate) fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(LO) & !x & HI
}

/// The high bit of every byte of `x` that is not zero (exact: no carry between bytes).
#[inline(always)]
pub(crate) fn nonzero_bytes(x: u64) -> u64 {
    (((x & !HI) + !HI) | x) & HI
}

/// The high bit of every byte of `d` (a chunk xor b'0') that is not 0..=9.
#[inline(always)]
fn nondigit_bytes(d: u64) -> u64 {
    (((d & !HI) + LO * (0x80 - 10)) | d) & HI
}

/// Masks of the 64 bytes at `buf[i..]`: blanks (whitespace other than `\n`,
/// as `is_ws` counts it), `\n`, and ASCII digits; and how many bytes they
/// cover (fewer than 64 only at the end of `buf`).
#[inline(always)]
pub fn class_masks64(buf: &[u8], i: usize) -> ([u64; 3], usize) {
    let mut masks = [0u64; 3];
    match buf.get(i..i + 64) {
        Some(block) => {
            for (q, chunk) in block.chunks_exact(16).enumerate() {
                for (acc, m) in masks.iter_mut().zip(classify16(chunk.try_into().unwrap())) {
                    *acc |= u64::from(m) << (16 * q);
                }
            }
            (masks, 64)
        }
        None => {
            let rest = &buf[i.min(buf.len())..];
            for (k, &b) in rest.iter().enumerate() {
                let classes = [b != b'\n' && is_ws(b), b == b'\n', b.is_ascii_digit()];
                for (acc, c) in masks.iter_mut().zip(classes) {
                    *acc |= u64::from(c) << k;
                }
            }
            (masks, rest.len())
        }
    }
}

/// `[blank, newline, digit]` masks of 16 bytes (see `class_masks64`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify16(block: &[u8; 16]) -> [u32; 3] {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of every x86_64 target; the load is unaligned and reads `block` only.
    unsafe {
        let x = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
        let in_range = |lo: u8, span: u8| {
            let d = _mm_sub_epi8(x, _mm_set1_epi8(lo as i8));
            _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(span as i8)), d) // lo <= x <= lo + span, unsigned
        };
        let newline = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\n' as i8));
        let space = _mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8));
        let blank = _mm_or_si128(space, _mm_andnot_si128(newline, in_range(b'\t', 4)));
        [blank, newline, in_range(b'0', 9)].map(|m| _mm_movemask_epi8(m) as u32)
    }
}

/// `[blank, newline, digit]` masks of 16 bytes (see `class_masks64`).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn classify16(block: &[u8; 16]) -> [u32; 3] {
    classify16_swar(block)
}

/// `classify16` eight bytes at a time, for targets without SSE2 (and to test it against).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
fn classify16_swar(block: &[u8; 16]) -> [u32; 3] {
    let half = |x: u64| {
        let low7 = x & !HI;
        let at_least = |v: u8| low7 + LO * u64::from(0x80 - v); // high bit set where the byte (< 0x80) is >= v
        let control = at_least(b'\t') & !at_least(b'\r' + 1) & !x & HI; // \t \n \x0b \x0c \r
        let newline = !nonzero_bytes(x ^ (LO * u64::from(b'\n'))) & HI;
        let space = !nonzero_bytes(x ^ (LO * u64::from(b' '))) & HI;
        let digit = !nondigit_bytes(x ^ (LO * u64::from(b'0'))) & HI;
        [(control & !newline) | space, newline, digit].map(gather)
    };
    let lo = half(u64::from_le_bytes(block[..8].try_into().unwrap()));
    let hi = half(u64::from_le_bytes(block[8..].try_into().unwrap()));
    [0, 1, 2].map(|k| lo[k] | hi[k] << 8)
}

/// The high bit of each byte of `m` gathered into bit k (the multiplication
/// collects one bit per byte into the top byte, without carries).
#[inline(always)]
fn gather(m: u64) -> u32 {
    (((m >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56) as u32
}

/// For each needle, a mask with bit `k` set where `buf[i + k]` is that needle,
/// over the next 64 bytes; also how many bytes that covers (fewer than 64 only
/// at the end of `buf`).
#[inline(always)]
pub fn eq_masks64<const N: usize>(buf: &[u8], i: usize, needles: [u8; N]) -> ([u64; N], usize) {
    let mut masks = [0u64; N];
    match buf.get(i..i + 64) {
        Some(block) => {
            for (q, chunk) in block.chunks_exact(16).enumerate() {
                let m = eq_masks16(chunk.try_into().unwrap(), needles);
                for (acc, m) in masks.iter_mut().zip(m) {
                    *acc |= u64::from(m) << (16 * q);
                }
            }
            (masks, 64)
        }
        None => {
            let rest = &buf[i.min(buf.len())..];
            for (k, b) in rest.iter().enumerate() {
                for (acc, n) in masks.iter_mut().zip(needles) {
                    *acc |= u64::from(*b == n) << k;
                }
            }
            (masks, rest.len())
        }
    }
}

/// For each needle, a mask with bit `k` set where `block[k]` is that needle.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn eq_masks16<const N: usize>(block: &[u8; 16], needles: [u8; N]) -> [u32; N] {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
    // SAFETY: SSE2 is part of every x86_64 target; the load is unaligned and reads `block` only.
    unsafe {
        let x = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
        needles.map(|n| _mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(n as i8))) as u32)
    }
}

/// For each needle, a mask with bit `k` set where `block[k]` is that needle.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn eq_masks16<const N: usize>(block: &[u8; 16], needles: [u8; N]) -> [u32; N] {
    eq_masks16_swar(block, needles)
}

/// `eq_masks16` eight bytes at a time, for targets without SSE2 (and to test it against).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
fn eq_masks16_swar<const N: usize>(block: &[u8; 16], needles: [u8; N]) -> [u32; N] {
    let lo = u64::from_le_bytes(block[..8].try_into().unwrap());
    let hi = u64::from_le_bytes(block[8..].try_into().unwrap());
    let eq = |x: u64| gather(!nonzero_bytes(x) & HI);
    needles.map(|n| eq(lo ^ (LO * u64::from(n))) | eq(hi ^ (LO * u64::from(n))) << 8)
}

/// A xorshift step: the unit tests' source of varied input (no crates here).
#[cfg(test)]
pub(crate) fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_match_the_portable_version() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..5_000 {
            let mut block = [0u8; 16];
            for b in &mut block {
                *b = [b' ', b'\n', b'\\', b'a', 0x80 | b' ', 0, 0xff][(xorshift(&mut seed) % 7) as usize];
            }
            let needles = [b' ', b'\n', b'\\'];
            let expected = needles.map(|n| block.iter().enumerate().filter(|(_, &b)| b == n).map(|(k, _)| 1u32 << k).sum::<u32>());
            assert_eq!(eq_masks16(&block, needles), expected);
            assert_eq!(eq_masks16_swar(&block, needles), expected);
        }
    }

    #[test]
    fn classes_match_the_portable_version() {
        let mut seed: u64 = 0x1234_5678_9abc_def1;
        for _ in 0..20_000 {
            let mut block = [0u8; 16];
            for b in &mut block {
                *b = (xorshift(&mut seed) >> 24) as u8;
                if seed & 1 == 0 {
                    *b = [b' ', b'\n', b'\t', 0x0b, 0x0c, b'\r', b'0', b'9', b'/', b':', 0x08, 0x0e, 0x89, 0xb0][(seed % 14) as usize];
                }
            }
            let bits = |f: &dyn Fn(u8) -> bool| block.iter().enumerate().filter(|(_, &b)| f(b)).map(|(k, _)| 1u32 << k).sum::<u32>();
            let expected = [bits(&|b| b != b'\n' && is_ws(b)), bits(&|b| b == b'\n'), bits(&|b: u8| b.is_ascii_digit())];
            assert_eq!(classify16(&block), expected, "{block:?}");
            assert_eq!(classify16_swar(&block), expected, "{block:?}");
        }
    }
}
