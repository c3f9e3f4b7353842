//! The README's test command is the one CI runs, and the README names the demo command.

#[test]
fn ci_runs_the_readme_test_command() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let cmd = readme
        .lines()
        .find(|l| l.contains("cargo test"))
        .expect("README has a cargo test command")
        .trim();
    assert!(
        ci.lines().any(|l| l.trim() == cmd),
        ".ci/run does not run the README's test command '{cmd}'"
    );
    assert!(readme.contains("lab run demo"), "README lacks the main job");
}

/// The README's first command is `scripts/install-deps.sh && cargo …` in one shell: on a
/// machine whose Rust lives in ~/.cargo/bin (rustup's place, not on a login PATH), the
/// script must leave cargo reachable on Debian's default PATH in that same command.
#[test]
fn install_deps_leaves_cargo_on_the_default_path() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: install-deps.sh needs root");
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("bash")
        .args(["-c", "scripts/install-deps.sh && cargo --version"])
        .current_dir(&root)
        .env_clear()
        .env(
            "HOME",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into()),
        )
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install-deps.sh && cargo --version on Debian's default PATH: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cargo "));
}

/// The README's part table is one Markdown table (a blank line inside it renders the rest
/// as text) and names the default satellite controller.
#[test]
fn readme_part_table_is_one_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("| part | command |")
        .expect("README has the part table");
    let rest = &readme[start..];
    let table: Vec<&str> = rest.lines().take_while(|l| l.starts_with('|')).collect();
    let after = rest.lines().skip(table.len()).take(3).collect::<Vec<_>>();
    assert!(
        !after.iter().any(|l| l.starts_with('|')),
        "a blank line splits the README's part table: {after:?}"
    );
    let text = table.join("\n");
    for part in ["satpep_sat", "`satpep link`", "package"] {
        assert!(text.contains(part), "the part table lacks {part}");
    }
}

/// The man pages carry what clap does not write: every page its exit status and related
/// pages; satpep-proxy(1) its files and signals (reload, drain).
#[test]
fn man_pages_have_files_signals_exit_status_and_see_also() {
    let dir = std::env::temp_dir().join(format!("satpep-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_satpep"))
        .args(["generate", "man"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let proxy = std::fs::read_to_string(dir.join("satpep-proxy.1")).unwrap();
    for want in [
        ".SH FILES",
        "/etc/satpep/proxy.toml",
        ".SH SIGNALS",
        "SIGHUP",
        "proxy.drain",
        ".SH \"EXIT STATUS\"",
        ".SH \"SEE ALSO\"",
    ] {
        assert!(proxy.contains(want), "satpep-proxy.1 lacks {want}");
    }
    let lab = std::fs::read_to_string(dir.join("satpep-lab-run.1")).unwrap();
    assert!(lab.contains(".SH \"EXIT STATUS\"") && !lab.contains(".SH SIGNALS"));
    // The page renders: man(1) would show its sections (groff is not needed to check roff's
    // section macros begin lines).
    assert!(proxy.lines().filter(|l| l.starts_with(".SH")).count() >= 6);
    let _ = std::fs::remove_dir_all(&dir);
}
