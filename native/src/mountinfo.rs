//! `/proc/<pid>/mountinfo` (proc(5)): one record per mount.
//!
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
//!
//! Record: 4 numbers (mount id, parent id, major, minor) and 7 strings (root,
//! mount point, mount options, optional fields, filesystem type, mount source,
//! super options), each with the kernel's `\ooo` escapes decoded.
//!
//! Fields are separated by exactly one space, as `show_mountinfo`
//! (fs/proc_namespace.c) prints them: the kernel escapes only space, tab,
//! newline and backslash, so other whitespace (`\r`, `\v`, `\f`) is part of a
//! name, and an empty mount source shows as two spaces in a row (`tmpfs  rw`).
//! The optional fields are the text between the mount options and the first
//! ` - ` field; the super options are the rest of the line after the source.
//! Lines without that separator after the six fixed fields, without three
//! fields after it, or with non-integer ids, are skipped.

use crate::ffi::Out;
use crate::masks::eq_masks64;
use crate::scan::find_byte;
use crate::text::parse_u64;

pub fn parse(input: &[u8], out: &mut Out) {
    let mut start = 0;
    while start <= input.len() {
        let line = scan_line(input, start);
        if let Some(fields) = line.fields {
            write(&input[start..line.end], &fields, line.escaped, out);
        }
        start = line.end + 1;
    }
}

/// Byte ranges (within the line) of the fields a record is made of: the six
/// fixed ones, the optional fields, then filesystem type, source and super options.
struct Fields {
    fixed: [(usize, usize); 6],
    optional: (usize, usize),
    tail: [(usize, usize); 3],
}

struct Line {
    end: usize, // index of the `\n` (or the input's end)
    escaped: bool,
    fields: Option<Fields>,
}

/// Finds a line's end, its backslashes and the spaces that delimit its fields
/// in one pass, 64 bytes at a time.
fn scan_line(input: &[u8], start: usize) -> Line {
    let mut split = Splitter::default();
    let mut escaped = false;
    let mut i = start;
    let end = loop {
        let ([mut spaces, newline, backslash], covered) = eq_masks64(input, i, [b' ', b'\n', b'\\']);
        let before = match (newline, covered) {
            (0, 64) => u64::MAX,
            (0, n) => (1 << n) - 1,
            (nl, _) => (nl & nl.wrapping_neg()) - 1,
        };
        escaped |= backslash & before != 0;
        spaces &= before;
        while spaces != 0 {
            split.space(&input[start..], i + spaces.trailing_zeros() as usize - start);
            spaces &= spaces - 1;
        }
        if newline != 0 {
            break i + newline.trailing_zeros() as usize;
        }
        if covered < 64 {
            break input.len();
        }
        i += 64;
    };
    Line { end, escaped, fields: split.finish(end - start) }
}

/// Splits a line at single spaces as they are found, left to right: the first
/// six fields, then the first field (from the seventh on) that is exactly "-",
/// then the filesystem type and the source; what follows is the super options.
#[derive(Default)]
struct Splitter {
    fixed: [(usize, usize); 6],
    nfixed: usize,
    field_start: usize,
    sep: Option<usize>,
    tail_ends: [usize; 2],
    ntail: usize,
}

impl Splitter {
    #[inline]
    fn space(&mut self, line: &[u8], at: usize) {
        let start = self.field_start;
        self.field_start = at + 1;
        if self.nfixed < 6 {
            self.fixed[self.nfixed] = (start, at);
            self.nfixed += 1;
        } else if self.sep.is_none() {
            if at == start + 1 && line[start] == b'-' {
                self.sep = Some(start);
            }
        } else if self.ntail < 2 {
            self.tail_ends[self.ntail] = at;
            self.ntail += 1;
        }
    }

    fn finish(&self, len: usize) -> Option<Fields> {
        let sep = self.sep.filter(|_| self.ntail == 2)?;
        let opt_start = self.fixed[5].1 + 1;
        let [fstype_end, source_end] = self.tail_ends;
        Some(Fields {
            fixed: self.fixed,
            // the fields between the mount options and "-", spaces included ("" when none)
            optional: (opt_start, sep.saturating_sub(1).max(opt_start)),
            tail: [(sep + 2, fstype_end), (fstype_end + 1, source_end), (source_end + 1, len)],
        })
    }
}

fn write(line: &[u8], f: &Fields, escaped: bool, out: &mut Out) {
    let field = |(a, b): (usize, usize)| &line[a..b];
    let (Some(id), Some(parent)) = (parse_u64(field(f.fixed[0])), parse_u64(field(f.fixed[1]))) else { return };
    let dev = field(f.fixed[2]);
    let Some(colon) = find_byte(b':', dev) else { return };
    let (Some(major), Some(minor)) = (parse_u64(&dev[..colon]), parse_u64(&dev[colon + 1..])) else { return };
    out.num(id);
    out.num(parent);
    out.num(major);
    out.num(minor);
    for range in [f.fixed[3], f.fixed[4], f.fixed[5], f.optional, f.tail[0], f.tail[1], f.tail[2]] {
        if escaped {
            out.str_unescaped(field(range));
        } else {
            out.str(field(range));
        }
    }
    out.end_record();
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_mountinfo(
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

    fn strings(input: &[u8]) -> Vec<Vec<Vec<u8>>> {
        collect(parse, input, 4).into_iter().map(|(_, s)| s).collect()
    }

    fn v(fields: &[&[u8]]) -> Vec<Vec<u8>> {
        fields.iter().map(|f| f.to_vec()).collect()
    }

    #[test]
    fn proc5_example() {
        let recs = collect(parse, b"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n", 4);
        assert_eq!(recs[0].0, [36, 35, 98, 0]);
        assert_eq!(recs[0].1, v(&[b"/mnt1", b"/mnt2", b"rw,noatime", b"master:1", b"ext3", b"/dev/root", b"rw,errors=continue"]));
    }

    #[test]
    fn what_the_kernel_prints() {
        let recs = strings(
            b"1 0 0:1 / /a\\040b rw shared:1 master:2 - tmpfs  rw\n\
              2 0 0:1 /\\134 /c\rd\x0b rw - tmpfs s\\011t rw,x=a b\n",
        );
        assert_eq!(recs[0], v(&[b"/", b"/a b", b"rw", b"shared:1 master:2", b"tmpfs", b"", b"rw"]), "empty source");
        assert_eq!(recs[1], v(&[b"/\\", b"/c\rd\x0b", b"rw", b"", b"tmpfs", b"s\tt", b"rw,x=a b"]), "raw CR and VT");
    }

    #[test]
    fn near_misses() {
        let count = |input: &[u8]| strings(input).len();
        assert_eq!(count(b"36 35 98:0 /a /b rw master:1 ext3 /dev/root rw\n"), 0, "no separator");
        assert_eq!(count(b"36 35 98:0 /a /b rw - ext3 /dev/root\n"), 0, "no super options");
        assert_eq!(count(b"36 35 98:0 /a /b rw - ext3 /dev/root \n"), 1, "empty super options");
        assert_eq!(count(b"36 35 98 /a /b rw - ext3 /dev/root rw\n"), 0, "no colon");
        assert_eq!(count(b"36  35 98:0 /a /b rw - ext3 /dev/root rw\n"), 0, "double space in ids");
        assert_eq!(count(b"36\t35\t98:0\t/a\t/b\trw\t-\text3\t/dev/root\trw\n"), 0, "tabs");
        assert_eq!(count(b"36 35 98:0 /a /b rw -"), 0, "separator last");
        assert_eq!(strings(b"1 0 0:1 / - - - t s o")[0], v(&[b"/", b"-", b"-", b"", b"t", b"s", b"o"]));
    }
}
