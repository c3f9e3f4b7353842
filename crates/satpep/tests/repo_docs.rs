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
