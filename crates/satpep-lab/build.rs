//! Records the commit satpep was built from (SATPEP_GIT_COMMIT), for the provenance that
//! every lab result carries. Outside a git checkout (a packaged source) it says "unknown".

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    // (Whether the tree had uncommitted changes is not recorded: the script reruns only
    // when HEAD moves, so an edit after it would go unseen.)
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SATPEP_GIT_COMMIT={commit}");
    // Built again when HEAD moves: a commit (its branch's ref) or a checkout (HEAD).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        for f in ["HEAD", "packed-refs"] {
            println!("cargo:rerun-if-changed={}", dir.join(f).display());
        }
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(r).display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
