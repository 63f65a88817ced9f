//! The command line itself: flags, environment variables, refusals. (Also
//! makes `cargo test` build the `fathom` binary that `integration/` runs.)

use std::process::Command;

fn fathom() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fathom"))
}

#[test]
fn help_lists_flags_with_env_vars() {
    let out = fathom().args(["all", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--data-dir",
        "--flush-interval",
        "--max-body-size",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("FATHOM_LISTEN") && help.contains("FATHOM_DATA_DIR"));
    assert!(help.contains("0.0.0.0:7400") && help.contains("./data"));
}

#[test]
fn bad_flag_values_are_refused_with_a_reason() {
    let out = fathom()
        .args(["all", "--max-body-size", "lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("not a size"), "{err}");
    let out = fathom()
        .args(["all", "--flush-interval", "soon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("not a duration")
    );
}

#[test]
fn env_vars_set_flags() {
    // An unparseable env value is reported under the env var's flag.
    let out = fathom()
        .arg("all")
        .env("FATHOM_LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("--listen"));
}
