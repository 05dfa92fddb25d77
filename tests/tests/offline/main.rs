//! Tests that need no API server, no root and no release build (`make check` runs them): what ships
//! (`packaging`), the release path (`release`), and a clone standing alone (`standalone`).
#![forbid(unsafe_code)]

mod packaging;
mod release;
mod standalone;
