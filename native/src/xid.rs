//! NVIDIA kernel log lines: Xid, SXid, "fallen off the bus", RmInitAdapter
//! failures. Formats and the exact semantics are documented in the Python twin
//! `agent/parsers/xid.py`; this module mirrors it byte for byte.
//!
//! Record: 5 numbers (line index, kind, xid, caused-by xid, facility) and 6
//! strings (pci as printed, pid as printed, name, MIG suffix, message, time).

use crate::ffi::Out;
use crate::scan::find_byte;
use crate::text::{fields, is_ws, parse_u64, trim};

pub const KIND_XID: u64 = 1;
pub const KIND_SXID: u64 = 2;
pub const KIND_FALLEN_OFF_BUS: u64 = 3;
pub const KIND_RMINIT_FAILED: u64 = 4;
pub const KIND_DRIVER_LOADED: u64 = 5;
const MULTILINE_SPAN: i64 = 3;
/// The line states no syslog facility (dmesg, journal text); stated ones are 0..=255.
pub const NO_FACILITY: u64 = 256;

struct Rec<'a> {
    kind: u64,
    xid: u64,
    caused: u64,
    pci: &'a [u8],
    pid: &'a [u8],
    name: &'a [u8],
    mig: &'a [u8],
    msg: &'a [u8],
}

#[derive(Clone, Copy, PartialEq)]
enum Marker {
    Nvrm,
    NvSwitch,
}

pub fn parse(input: &[u8], out: &mut Out) {
    let mut pending: &[u8] = b"";
    let mut pending_line: i64 = -MULTILINE_SPAN;
    let mut pending_facility = NO_FACILITY;
    let mut time = Vec::with_capacity(32);
    for (i, raw) in (Lines { rest: Some(input) }).enumerate() {
        let line = rtrim(raw);
        let Some((marker, rest)) = locate(line, &mut time) else { continue };
        let facility = facility(line);
        let rec = if marker == Marker::NvSwitch {
            sxid(rest)
        } else if let Some(s) = rest.strip_prefix(b"Xid (") {
            paren_head(s, true).and_then(xid)
        } else if let Some(s) = rest.strip_prefix(b"Xid: ") {
            number_head(s, b"", b"").and_then(xid)
        } else if let (Some(s), false) = (rest.strip_prefix(b"The NVIDIA GPU "), contains(rest, b"fallen off the bus")) {
            pending = pci_token(s);
            pending_line = i as i64;
            pending_facility = facility;
            continue;
        } else if contains(rest, b"fallen off the bus") {
            let mut pci = fallen_pci(rest);
            if pci.is_empty() && (i as i64) - pending_line < MULTILINE_SPAN && pending_facility == facility {
                pci = pending;
            }
            pending = b"";
            pending_line = -MULTILINE_SPAN;
            Some(simple(KIND_FALLEN_OFF_BUS, pci, rest))
        } else if contains(rest, b"RmInitAdapter failed") || rest.starts_with(b"rm_init_adapter failed") {
            let pci = match rest.strip_prefix(b"GPU ") {
                Some(s) => pci_token(s),
                None => b"",
            };
            Some(simple(KIND_RMINIT_FAILED, pci, rest))
        } else if rest.starts_with(b"loading NVIDIA UNIX") {
            Some(simple(KIND_DRIVER_LOADED, b"", rest))
        } else {
            continue;
        };
        if let Some(r) = rec {
            out.num(i as u64);
            out.num(r.kind);
            out.num(r.xid);
            out.num(r.caused);
            out.num(facility);
            out.str(r.pci);
            out.str(r.pid);
            out.str(r.name);
            out.str(r.mig);
            out.str(r.msg);
            out.str(&time);
            out.end_record();
        }
    }
}

/// Lines split on `\n` exactly like Python's `bytes.split(b"\n")`, found with `find`.
struct Lines<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let r = self.rest?;
        match find(r, b"\n") {
            Some(e) => {
                self.rest = Some(&r[e + 1..]);
                Some(&r[..e])
            }
            None => {
                self.rest = None;
                Some(r)
            }
        }
    }
}

fn simple<'a>(kind: u64, pci: &'a [u8], msg: &'a [u8]) -> Rec<'a> {
    Rec { kind, xid: 0, caused: 0, pci, pid: b"", name: b"", mig: b"", msg }
}

fn rtrim(s: &[u8]) -> &[u8] {
    let end = s.iter().rposition(|&b| !is_ws(b)).map_or(0, |i| i + 1);
    &s[..end]
}

/// First occurrence of `n` in `h`: its first byte found by `scan::find_byte`
/// (16 bytes at a time on x86_64), then a compare. This runs over every byte of every line, and the markers
/// start with upper-case letters that are rare in kernel text.
pub(crate) fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    let (&first, rest) = n.split_first()?;
    let end = h.len().checked_sub(n.len())? + 1; // candidate starts are < end
    let mut i = 0;
    while i < end {
        i += find_byte(first, &h[i..end])?;
        if &h[i + 1..i + n.len()] == rest {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn rfind(h: &[u8], n: &[u8]) -> Option<usize> {
    if n.len() > h.len() {
        return None;
    }
    h.windows(n.len()).rposition(|w| w == n)
}

fn contains(h: &[u8], n: &[u8]) -> bool {
    find(h, n).is_some()
}

/// Finds the marker and checks what precedes it; fills `time`.
fn locate<'a>(line: &'a [u8], time: &mut Vec<u8>) -> Option<(Marker, &'a [u8])> {
    let (p, marker, skip) = match find(line, b"NVRM: ") {
        Some(p) => (p, Marker::Nvrm, 6),
        None => {
            find(line, b"SXid")?; // every NVSwitch event has it: a cheap filter first
            (find(line, b"nvidia-nvswitch")?, Marker::NvSwitch, 15)
        }
    };
    let head = &line[..p];
    time.clear();
    if trim(head).is_empty() || head.ends_with(b"kernel: ") || head.ends_with(b">") {
    } else if head.ends_with(b"] ") {
        let lb = head.iter().rposition(|&b| b == b'[')?;
        time.extend_from_slice(trim(&head[lb + 1..head.len() - 2]));
    } else if let Some(prefix) = head.strip_suffix(b";") {
        kmsg_time(prefix, time);
    } else if head.ends_with(b" ") && fields(head).last().is_some_and(is_iso) {
        time.extend_from_slice(fields(head).last().unwrap_or(b""));
    } else if head.starts_with(b"kern ") && head.ends_with(b": ") {
    } else {
        return None;
    }
    Some((marker, &line[p + skip..]))
}

/// The syslog facility a line states: `<prio>` at its start, or the first field
/// of a `prio,seq,usec[,…];` kmsg prefix (the first `;` of the line); else `NO_FACILITY`.
fn facility(line: &[u8]) -> u64 {
    let prio = if let Some(rest) = line.strip_prefix(b"<") {
        match rest.iter().position(|&b| b == b'>') {
            Some(end) if end > 0 => parse_u64(&rest[..end]),
            _ => None,
        }
    } else {
        match line.iter().position(|&b| b == b';') {
            Some(semi) => {
                let mut f = line[..semi].splitn(4, |&b| b == b',');
                match (f.next(), f.next(), f.next()) {
                    (Some(p), Some(seq), Some(_)) if parse_u64(seq).is_some() => parse_u64(p),
                    _ => None,
                }
            }
            None => None,
        }
    };
    prio.map_or(NO_FACILITY, |p| (p >> 3).min(255))
}

/// `2025-01-25T10:34:54,859532+00:00` (dmesg --time-format iso): four digits, a dash, a T.
fn is_iso(tok: &[u8]) -> bool {
    tok.len() > 10 && tok[..4].iter().all(u8::is_ascii_digit) && tok[4] == b'-' && tok.contains(&b'T')
}

fn kmsg_time(prefix: &[u8], time: &mut Vec<u8>) {
    let mut f = prefix.split(|&b| b == b',');
    let (Some(_), Some(_), Some(usec)) = (f.next(), f.next(), f.next()) else { return };
    let Some(usec) = parse_u64(usec) else { return };
    time.extend_from_slice(format!("{}.{:06}", usec / 1_000_000, usec % 1_000_000).as_bytes());
}

fn is_pci(s: &[u8]) -> bool {
    !s.is_empty() && s.contains(&b':') && s.iter().all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
}

fn pci_token(s: &[u8]) -> &[u8] {
    let mut tok = fields(s).next().unwrap_or(b"");
    if let Some(bs) = tok.iter().position(|&b| b == b'\\') {
        tok = &tok[..bs]; // /dev/kmsg escapes a newline as \x0a
    }
    if let Some(t) = tok.strip_prefix(b"PCI:") {
        tok = t;
    }
    while let Some(t) = tok.strip_suffix(b":") {
        tok = t;
    }
    if is_pci(tok) {
        tok
    } else {
        b""
    }
}

fn fallen_pci(rest: &[u8]) -> &[u8] {
    if let Some(s) = rest.strip_prefix(b"The NVIDIA GPU ") {
        pci_token(s)
    } else if let Some(s) = rest.strip_prefix(b"GPU at ") {
        pci_token(s)
    } else if let Some(s) = rest.strip_prefix(b"GPU ") {
        pci_token(s)
    } else {
        b""
    }
}

fn digits(s: &[u8]) -> usize {
    s.iter().position(|b| !b.is_ascii_digit()).unwrap_or(s.len())
}

fn trim_spaces_left(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    &s[start..]
}

/// What `paren_head` reads from `PCI:0000:3b:00 GPU-I:05): 79, tail`.
struct Head<'a> {
    pci: &'a [u8],
    mig: &'a [u8],
    number: u64,
    /// The tail after the number and its comma.
    body: &'a [u8],
}

/// `PCI:0000:3b:00 GPU-I:05): 79, tail` → its `Head`. With `redacted`, an
/// address that is not one (`PCI:XXXX:XX:XX`, `<redacted>`: a log scrubbed
/// before it was shared) is an unknown device (`pci` empty), not a non-event.
fn paren_head(s: &[u8], redacted: bool) -> Option<Head<'_>> {
    let close = s.iter().position(|&b| b == b')')?;
    let mut inner = &s[..close];
    if let Some(t) = inner.strip_prefix(b"PCI:") {
        inner = t;
    }
    let (mut pci, mut mig) = match inner.iter().position(|&b| b == b' ') {
        Some(sp) => (&inner[..sp], &inner[sp + 1..]),
        None => (inner, &b""[..]),
    };
    let after = s[close + 1..].strip_prefix(b": ")?;
    if !is_pci(pci) {
        if !redacted {
            return None;
        }
        pci = b"";
        if !trim(mig).starts_with(b"GPU-I:") {
            mig = b"";
        }
    }
    number_head(after, pci, trim(mig))
}

/// `79, tail` → its `Head` (the number, then nothing or a comma).
fn number_head<'a>(after: &'a [u8], pci: &'a [u8], mig: &'a [u8]) -> Option<Head<'a>> {
    let n = digits(after);
    let number = parse_u64(&after[..n])?;
    let tail = &after[n..];
    let body = if tail.is_empty() {
        tail
    } else {
        trim_spaces_left(tail.strip_prefix(b",")?)
    };
    Some(Head { pci, mig, number, body })
}

fn xid(head: Head<'_>) -> Option<Rec<'_>> {
    let Head { pci, mig, number: xid, mut body } = head;
    let (mut pid, mut name): (&[u8], &[u8]) = (b"", b"");
    if body.starts_with(b"pid=") {
        match find(body, b", ") {
            Some(k) if body[k..].starts_with(b", name=") => {
                pid = &body[4..k];
                let rest = &body[k + 7..];
                match find(rest, b", ") {
                    Some(e) => {
                        name = &rest[..e];
                        body = &rest[e + 2..];
                    }
                    None => {
                        name = rest;
                        body = b"";
                    }
                }
            }
            Some(k) => {
                pid = &body[4..k];
                body = &body[k + 2..];
            }
            None => {
                pid = &body[4..];
                body = b"";
            }
        }
    }
    let msg = trim(body);
    let mut caused = 0;
    if let Some(c) = rfind(msg, b"caused by previous Xid ") {
        let tail = &msg[c + 23..];
        let n = digits(tail);
        if n > 0 && n == tail.len() {
            caused = parse_u64(tail).unwrap_or(0);
        }
    }
    Some(Rec { kind: KIND_XID, xid, caused, pci, pid, name, mig, msg })
}

fn sxid(rest: &[u8]) -> Option<Rec<'_>> {
    let s = find(rest, b": SXid (")?;
    if digits(rest) != s {
        return None;
    }
    let Head { pci, mig, number, body } = paren_head(&rest[s + 8..], false)?;
    Some(Rec { kind: KIND_SXID, xid: number, caused: 0, pci, pid: b"", name: b"", mig, msg: trim(body) })
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_xid(
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

    fn run(input: &[u8]) -> (Vec<u64>, Vec<u8>) {
        let mut nums = vec![0u64; 64];
        let mut strs = vec![0u8; 4096];
        let mut counts = [0usize; 3];
        let rc = unsafe {
            nha_parse_xid(input.as_ptr(), input.len(), nums.as_mut_ptr(), 64, strs.as_mut_ptr(), 4096, counts.as_mut_ptr())
        };
        assert_eq!(rc, 0);
        nums.truncate(counts[1]);
        strs.truncate(counts[2]);
        (nums, strs)
    }

    #[test]
    fn xid_with_pid_and_name() {
        let (n, s) = run(b"[  123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.");
        assert_eq!(n, vec![0, KIND_XID, 79, 0, NO_FACILITY]);
        assert_eq!(s, b"0000:3b:00\x001234\x00python3\x00\x00GPU has fallen off the bus.\x00123.456789\x00");
    }

    #[test]
    fn facility_of_kmsg_records_and_level_prefixes() {
        assert_eq!(run(b"3,2045,191045112,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE").0[4], 0);
        assert_eq!(run(b"12,351,1009035642,-;NVRM: Xid (PCI:0000:3b:00): 79, forged").0[4], 1);
        assert_eq!(run(b"<30>NVRM: Xid (PCI:0000:3b:00): 79, x").0[4], 3);
        assert_eq!(run(b"99999,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x").0[4], 255);
        assert_eq!(run(b"<4x>NVRM: Xid (PCI:0000:3b:00): 79, x").0[4], NO_FACILITY);
    }

    #[test]
    fn redacted_or_missing_address_is_an_unknown_device() {
        for line in [
            &b"NVRM: Xid (PCI:XXXX:XX:XX): 79, pid=1, name=x, GPU has fallen off the bus."[..],
            b"NVRM: Xid (<redacted>): 79, GPU has fallen off the bus.",
            b"NVRM: Xid: 79, pid=1, name=x, GPU has fallen off the bus.",
        ] {
            let (n, s) = run(line);
            assert_eq!((n[1], n[2]), (KIND_XID, 79), "{}", String::from_utf8_lossy(line));
            assert_eq!(s[0], 0, "no address: the unknown device");
        }
        let (n, _) = run(b"nvidia-nvswitch3: SXid (PCI:XXXX:XX:XX.X): 12028, Non-fatal");
        assert!(n.is_empty(), "SXids keep their strict address");
    }

    #[test]
    fn garbage_is_skipped() {
        assert_eq!(run(b"NVRM: Xid (PCI:0000:3b:00): abc").0, Vec::<u64>::new());
        assert_eq!(run(b"user: NVRM: Xid (PCI:0000:3b:00): 79").0, Vec::<u64>::new());
    }
}
