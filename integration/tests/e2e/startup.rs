//! What a person sees when `fathom all` starts.

use fathom_integration::Fathom;

/// `fathom all` at the default log level: Fathom's own lines only (no
/// Raft, cache or HTTP internals), and a ready line that says what to open,
/// where the data is and that nobody has to authenticate.
#[test]
fn default_start_up_log_is_fathoms_own_and_says_what_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start_logging(dir.path(), &[], None).unwrap();
    let log = f.log();
    f.stop().unwrap();
    let lines: Vec<String> = log.lines().map(strip_ansi).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        // `<time> <LEVEL> <target>: <message>`
        let mut words = l.split_whitespace();
        let (_time, level, target) = (words.next(), words.next(), words.next());
        let target = target.unwrap_or_default();
        assert!(
            matches!(level, Some("INFO" | "WARN" | "ERROR")),
            "a line at another level: {l}\nwhole log:\n{log}"
        );
        assert!(
            target.starts_with("fathom"),
            "a dependency's line at the default level: {l}\nwhole log:\n{log}"
        );
    }
    let ready = lines
        .iter()
        .find(|l| l.contains("fathom is ready"))
        .unwrap_or_else(|| panic!("no ready line:\n{log}"));
    assert!(
        ready.contains(&format!("http://localhost:{}", f.port)),
        "{ready}"
    );
    assert!(ready.contains(&dir.path().display().to_string()), "{ready}");
    assert!(ready.contains("authentication off"), "{ready}");
    assert!(ready.contains("for the UI"), "{ready}");
    // Start-up fits on a screen.
    let before_ready = lines.iter().position(|l| l == ready).unwrap() + 1;
    assert!(
        before_ready <= 12,
        "{before_ready} lines before ready:\n{log}"
    );
}

/// A log line without its colour escapes.
fn strip_ansi(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut chars = l.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
