"""Pure-Python twins of the native parsers (bytes in, flat records out).

Each module here has the exact semantics of its Rust twin in `native/src/`;
`agent.native` picks one of the two and is the only surface the rest of the
agent calls. The tests hold both equal on real and generated inputs.
"""
