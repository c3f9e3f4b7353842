//! `satpep cc`: listing, and clear errors for bad names and values.

mod common;

use common::*;

fn run(args: &[&str]) -> (bool, String, String) {
    let out = satpep().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn list_names_every_bundled_controller_and_the_kernels() {
    let (ok, out, err) = run(&["cc", "list", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["bundled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    let bundled: Vec<&str> = satpep_cc::BUNDLED.iter().map(|b| b.name).collect();
    assert_eq!(names, bundled);
    assert_eq!(
        bundled.len(),
        7,
        "Hybla, Westwood+, Vegas, Tarang, HighSpeed, Scalable, satellite"
    );
    for n in bundled {
        assert!(n.len() <= 15, "{n}: the kernel takes 15 characters");
    }
    assert!(v["kernel"].as_array().unwrap().iter().any(|k| k == "cubic"));
}

#[test]
fn bad_names_and_values_are_refused_with_the_reason() {
    require_root();
    let (ok, _, err) = run(&["cc", "load", "satpep_nosuch"]);
    assert!(
        !ok && err.contains("'satpep_nosuch' is not a bundled congestion control"),
        "{err}"
    );
    let (ok, _, err) = run(&["cc", "load", "satpep_hybla", "--rtt0", "0ms"]);
    assert!(!ok && err.contains("--rtt0"), "{err}");
    let (ok, _, err) = run(&["cc", "load", "satpep_tarang", "--capacity", "fast"]);
    assert!(!ok && err.contains("--capacity"), "{err}");
    let (ok, _, err) = run(&["cc", "unload", "satpep_nosuch"]);
    assert!(!ok && err.contains("not pinned"), "{err}");
}

#[test]
fn a_loaded_controller_is_usable_by_any_socket_and_goes_away_when_unloaded() {
    require_root();
    let _ = satpep_cc::unpin("satpep_scalable");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, _, err) = run(&["cc", "load", "satpep_scalable", "--pin"]);
    assert!(ok, "{err}");
    // Loading it again is no error (the README's demo leaves one pinned): it is kept.
    let (ok, _, err) = run(&["cc", "load", "satpep_scalable", "--pin"]);
    assert!(ok && err.contains("already registered"), "{err}");
    // Any process can now select it by name.
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    use std::os::fd::AsRawFd;
    satpep_proxy::sockets::set_congestion(s.as_raw_fd(), "satpep_scalable").unwrap();
    drop(s);
    let (ok, _, err) = run(&["cc", "unload", "satpep_scalable"]);
    assert!(ok, "{err}");
    // Unregistered once the last socket using it is gone.
    let mut gone = false;
    for _ in 0..50 {
        if !satpep_cc::available()
            .iter()
            .any(|a| a == "satpep_scalable")
        {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(gone, "still registered: {:?}", satpep_cc::available());
}

#[test]
fn a_controller_pinned_by_another_build_is_replaced_by_this_builds() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    let name = "satpep_hstcp";
    let _ = satpep_cc::unpin(name);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, _, err) = run(&["cc", "load", name, "--pin"]);
    assert!(ok, "{err}");
    let dir = std::path::Path::new(satpep_cc::PIN_DIR);
    let markers = || -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("{name}@")))
            .collect()
    };
    // The pin names its build; `cc list` shows the controller, not the marker.
    assert_eq!(markers().len(), 1, "{:?}", markers());
    assert!(!satpep_cc::pinned().iter().any(|p| p.contains('@')));
    let (ok, _, err) = run(&["cc", "load", name, "--pin"]);
    assert!(ok && err.contains("already registered"), "{err}");
    // Another build's pin (as an upgrade finds it): no marker of this build.
    let before = std::fs::metadata(dir.join(name)).unwrap().ino();
    for m in markers() {
        std::fs::remove_file(dir.join(m)).unwrap();
    }
    let (ok, _, err) = run(&["cc", "load", name, "--pin"]);
    assert!(ok && err.contains("replaced by this build's"), "{err}");
    assert_ne!(std::fs::metadata(dir.join(name)).unwrap().ino(), before);
    assert_eq!(markers().len(), 1, "{:?}", markers());
    assert!(satpep_cc::available().iter().any(|a| a == name));
    // Unloading removes the pin and its marker.
    let (ok, _, err) = run(&["cc", "unload", name]);
    assert!(ok, "{err}");
    assert!(markers().is_empty() && !dir.join(name).exists());
}

/// Not `cc` alone: every command that only prints (status, keygen, generate, cc) ends
/// quietly when its reader stops early (`| head`), as Unix tools do, instead of panicking on
/// the broken pipe.
#[test]
fn a_printing_command_whose_reader_stops_early_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut child = satpep()
        .args(["generate", "completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little (the script is ~70 KB, more than a pipe holds), then stop reading.
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        out.status
    );
}
