//! What the examples do with arguments they cannot use: `--help` prints the usage, and an
//! unknown flag or a bad value says what was wrong and the usage, then exits with status 2
//! (no panic, no backtrace).

/// Prints `usage` and exits 0 when `flag` asks for help (`--help`, `-h`).
pub(crate) fn help(flag: &str, usage: &str) {
    if flag == "--help" || flag == "-h" {
        println!("{usage}");
        std::process::exit(0);
    }
}

/// `value`, given to `flag`, as a number (a word that is not one fails as [`fail`] does).
pub(crate) fn number<T: std::str::FromStr>(flag: &str, value: &str, usage: &str) -> T {
    value.parse().unwrap_or_else(|_| fail(&format!("{flag} {value:?}: not a number"), usage))
}

/// Says what was wrong with the arguments and how to call the example, then exits with 2.
pub(crate) fn fail(message: &str, usage: &str) -> ! {
    eprintln!("error: {message}\n{usage}");
    std::process::exit(2)
}
