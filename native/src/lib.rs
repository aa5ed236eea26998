//! Hot-path parsers for node-health-agent, exported over a C ABI for cffi.
//!
//! std only (no crates.io). Every parser is `fn(&[u8], &mut Out)` in its own
//! module, exported as `nha_parse_<name>` (written out in full: cbindgen does not
//! expand macros); `scan.rs` and `masks.rs` hold the hot loops (64 bytes at a
//! time); `ffi.rs` holds the shared boundary (buffers, error codes, panic
//! capture). Each parser has a pure-Python twin in `agent/parsers/` that the
//! tests hold it equal to.

pub mod ffi;
pub mod masks;
pub mod scan;
pub mod text;

pub mod diskstats;
pub mod iptsave;
pub mod kbatch;
pub mod kscreen;
pub mod mountinfo;
pub mod netdev;
pub mod xid;
