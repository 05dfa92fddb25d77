//! How the operator's programs end: an error is one line naming what failed and why (the causes
//! joined with `: `), without a backtrace unless `RUST_BACKTRACE`/`RUST_LIB_BACKTRACE` asks for one.

use std::process::ExitCode;

/// Exit status for `result`; prints `error: <cause chain>` to stderr on failure.
pub fn exit_code<E>(program: &str, result: Result<(), E>) -> ExitCode
where
    E: std::fmt::Display + std::fmt::Debug,
{
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", error_line(program, &e));
            let wanted = |v: &str| std::env::var(v).is_ok_and(|v| v != "0");
            if wanted("RUST_BACKTRACE") || wanted("RUST_LIB_BACKTRACE") {
                eprintln!("{e:?}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `<program>: error: <e>` with the alternate (cause-chain) form where the error has one.
pub fn error_line(program: &str, e: &dyn std::fmt::Display) -> String {
    format!("{program}: error: {e:#}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_with_causes() {
        #[derive(Debug)]
        struct E;
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                if f.alternate() {
                    write!(f, "reading x: no such file")
                } else {
                    write!(f, "reading x")
                }
            }
        }
        assert_eq!(error_line("p", &E), "p: error: reading x: no such file");
        assert_eq!(exit_code::<E>("p", Ok(())), ExitCode::SUCCESS);
    }
}
