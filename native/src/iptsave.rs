//! `iptables-save [-c]` output (legacy and nft print the same format): the
//! agent's own chains and rules, with their counters.
//!
//! ```text
//! *mangle
//! :NODE-HEALTH-INTERNET-OUT - [0:0]
//! [12:3456] -A OUTPUT -m comment --comment "node-health-agent:internet-out:jump" -j NODE-HEALTH-INTERNET-OUT
//! ```
//!
//! Lines are split into tokens exactly as `iptables-restore` reads them
//! (`add_param_to_argv` in iptables' xshared.c): spaces and tabs separate
//! tokens; a `"` opens a quoted part in which `\` escapes the next byte and
//! separators are literal; the closing `"` ends the token (even an empty one);
//! a quote left open at the end of the line drops its token. `iptables-save`
//! quotes a comment with anything but `[A-Za-z0-9_-]` in it and escapes `"`,
//! `\` and `'` (`xtables_save_string`).
//!
//! Selected lines, one record each: a chain declaration (`:NAME POLICY [p:b]`)
//! whose name starts with `CHAIN_PREFIX`, and a rule (`[p:b] -A CHAIN ...`,
//! counters optional) whose chain starts with `CHAIN_PREFIX` or whose comment
//! (the token after the first `--comment` token after the chain) starts with
//! `COMMENT_PREFIX`. A rule whose first token starts with `[` but is not
//! `[u64:u64]`, or whose next token is not `-A`, is skipped.
//!
//! Record: 4 numbers (kind: 0 chain declaration, 1 rule with counters, 2 rule
//! without; position: the rule's 1-based position in its chain, counted over the
//! run of consecutive rules of that chain since the last `*table` line, as
//! `iptables -L --line-numbers` numbers them, 0 for a declaration; packets;
//! bytes) and 4 strings (table; chain; comment, unquoted; and the rule's text
//! after the chain token with leading separators removed, as printed: for a
//! declaration, its policy).

use crate::ffi::Out;
use crate::text::{lines, parse_u64};

pub const CHAIN_PREFIX: &[u8] = b"NODE-HEALTH-";
pub const COMMENT_PREFIX: &[u8] = b"node-health-agent:";

const KIND_CHAIN: u64 = 0;
const KIND_RULE: u64 = 1;
const KIND_RULE_NO_COUNTERS: u64 = 2;

/// Tokens of one line, decoded into a caller's buffer (no allocation per token).
struct Tokens<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Tokens<'a> {
    fn new(line: &'a [u8]) -> Self {
        Tokens { line, pos: 0 }
    }

    /// Decodes the next token into `buf`; false at the end of the line.
    /// Afterwards `self.pos` is just past the byte that ended the token.
    /// Runs of plain bytes are copied whole: this is the inner loop.
    fn next_into(&mut self, buf: &mut Vec<u8>) -> bool {
        buf.clear();
        let s = self.line;
        let mut i = self.pos;
        let mut quoted = false;
        while i < s.len() {
            let stop = |c: u8| if quoted { c == b'"' || c == b'\\' } else { c == b' ' || c == b'\t' || c == b'"' };
            let j = s[i..].iter().position(|&c| stop(c)).map_or(s.len(), |k| i + k);
            buf.extend_from_slice(&s[i..j]);
            if j == s.len() {
                break;
            }
            match (quoted, s[j]) {
                (true, b'"') => {
                    self.pos = j + 1;
                    return true;
                }
                (true, _) => {
                    // a backslash: the next byte is taken as it is (a quote that
                    // never closes drops it all at the end anyway)
                    if let Some(&c) = s.get(j + 1) {
                        buf.push(c);
                    }
                    i = j + 2;
                }
                (false, b'"') => {
                    quoted = true;
                    i = j + 1;
                }
                (false, _) if !buf.is_empty() => {
                    self.pos = j + 1;
                    return true;
                }
                (false, _) => i = j + 1,
            }
        }
        self.pos = s.len();
        if quoted || buf.is_empty() {
            buf.clear();
            return false;
        }
        true
    }

    /// The rest of the line after the last token, leading separators removed.
    fn rest(&self) -> &'a [u8] {
        let s = &self.line[self.pos..];
        let skip = s.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(s.len());
        &s[skip..]
    }
}

/// `[packets:bytes]`.
fn counters(tok: &[u8]) -> Option<(u64, u64)> {
    if tok.len() < 2 || tok[0] != b'[' || tok[tok.len() - 1] != b']' {
        return None;
    }
    let inner = &tok[1..tok.len() - 1];
    let colon = inner.iter().position(|&b| b == b':')?;
    Some((parse_u64(&inner[..colon])?, parse_u64(&inner[colon + 1..])?))
}

struct State {
    table: Vec<u8>,
    prev_chain: Option<Vec<u8>>,
    position: u64,
    tok: Vec<u8>,
    chain: Vec<u8>,
    comment: Vec<u8>,
}

pub fn parse(input: &[u8], out: &mut Out) {
    let mut st = State {
        table: Vec::new(),
        prev_chain: None,
        position: 0,
        tok: Vec::with_capacity(64),
        chain: Vec::with_capacity(64),
        comment: Vec::with_capacity(256),
    };
    for line in lines(input) {
        let mut toks = Tokens::new(line);
        if !toks.next_into(&mut st.tok) {
            continue;
        }
        match st.tok.first() {
            Some(b'*') => {
                st.table.clear();
                st.table.extend_from_slice(&st.tok[1..]);
                st.prev_chain = None;
            }
            Some(b':') => declaration(&mut st, &mut toks, out),
            _ => rule(&mut st, &mut toks, out),
        }
    }
}

fn declaration(st: &mut State, toks: &mut Tokens, out: &mut Out) {
    if !st.tok[1..].starts_with(CHAIN_PREFIX) {
        return;
    }
    st.chain.clear();
    st.chain.extend_from_slice(&st.tok[1..]);
    let mut policy = Vec::new();
    let mut ctr = (0, 0);
    if toks.next_into(&mut policy) && toks.next_into(&mut st.tok) {
        ctr = counters(&st.tok).unwrap_or((0, 0));
    }
    if has_nul(&[&st.table, &st.chain, &policy]) {
        return;
    }
    out.num(KIND_CHAIN);
    out.num(0);
    out.num(ctr.0);
    out.num(ctr.1);
    out.str(&st.table);
    out.str(&st.chain);
    out.str(b"");
    out.str(&policy);
    out.end_record();
}

fn rule(st: &mut State, toks: &mut Tokens, out: &mut Out) {
    let mut kind = KIND_RULE_NO_COUNTERS;
    let mut ctr = (0, 0);
    if st.tok.first() == Some(&b'[') {
        let Some(c) = counters(&st.tok) else { return };
        ctr = c;
        kind = KIND_RULE;
        if !toks.next_into(&mut st.tok) {
            return;
        }
    }
    if st.tok != b"-A" || !toks.next_into(&mut st.chain) {
        return;
    }
    st.position = if st.prev_chain.as_deref() == Some(&st.chain[..]) { st.position + 1 } else { 1 };
    if st.prev_chain.as_deref() != Some(&st.chain[..]) {
        st.prev_chain = Some(st.chain.clone());
    }
    let rest = toks.rest();
    let in_our_chain = st.chain.starts_with(CHAIN_PREFIX);
    if !in_our_chain && !may_hold_prefix(rest) {
        return;
    }
    find_comment(toks, &mut st.tok, &mut st.comment);
    if !in_our_chain && !st.comment.starts_with(COMMENT_PREFIX) {
        return;
    }
    if has_nul(&[&st.table, &st.chain, &st.comment, rest]) {
        return;
    }
    out.num(kind);
    out.num(st.position);
    out.num(ctr.0);
    out.num(ctr.1);
    out.str(&st.table);
    out.str(&st.chain);
    out.str(&st.comment);
    out.str(rest);
    out.end_record();
}

/// False only when no token of `s` can decode to something that contains
/// `COMMENT_PREFIX`: a token is its bytes minus quotes and escaping
/// backslashes, so look for the prefix with those skipped.
fn may_hold_prefix(s: &[u8]) -> bool {
    let p = COMMENT_PREFIX;
    let mut from = 0;
    while let Some(k) = s[from..].iter().position(|&c| c == p[0]) {
        let start = from + k;
        let (mut i, mut j) = (start + 1, 1);
        while j < p.len() && i < s.len() {
            match s[i] {
                b'"' | b'\\' => {}
                c if c == p[j] => j += 1,
                _ => break,
            }
            i += 1;
        }
        if j == p.len() {
            return true;
        }
        from = start + 1;
    }
    false
}

/// Strings travel NUL-terminated: a record with a NUL inside (never in real
/// `iptables-save` output, whose strings are C strings) is dropped.
fn has_nul(parts: &[&[u8]]) -> bool {
    parts.iter().any(|p| p.contains(&0))
}

/// The token after the first `--comment` token (empty when there is none).
fn find_comment(toks: &mut Tokens, tok: &mut Vec<u8>, comment: &mut Vec<u8>) {
    comment.clear();
    while toks.next_into(tok) {
        if tok == b"--comment" {
            toks.next_into(comment);
            return;
        }
    }
}

/// # Safety
/// See `ffi::run_parser`.
#[no_mangle]
pub unsafe extern "C" fn nha_parse_iptables_save(
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

    fn tokens(line: &[u8]) -> Vec<Vec<u8>> {
        let mut t = Tokens::new(line);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while t.next_into(&mut buf) {
            out.push(buf.clone());
        }
        out
    }

    #[test]
    fn tokenizer_follows_iptables_restore() {
        let t = tokens(br#"-A X --comment "a \"b\" \\ c" -j  RETURN"#);
        assert_eq!(t, vec![&b"-A"[..], b"X", b"--comment", br#"a "b" \ c"#, b"-j", b"RETURN"]);
        assert_eq!(tokens(br#"ab"c d"e"#), vec![&b"abc d"[..], b"e"]);
        assert_eq!(tokens(br#"x "" y"#), vec![&b"x"[..], b"", b"y"]);
        assert_eq!(tokens(br#"x "open"#), vec![&b"x"[..]]);
        assert_eq!(tokens(b"a\\b\t c"), vec![&b"a\\b"[..], b"c"]);
    }

    #[test]
    fn counters_token() {
        assert_eq!(counters(b"[1:2]"), Some((1, 2)));
        assert_eq!(counters(b"[1:2:3]"), None);
        assert_eq!(counters(b"[]"), None);
        assert_eq!(counters(b"[:]"), None);
    }
}
