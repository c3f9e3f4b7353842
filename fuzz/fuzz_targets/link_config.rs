//! A link emulator configuration with any content: parsing and resolving never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use satpep_link::config::LinkSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = toml::from_str::<LinkSpec>(text) else {
        return;
    };
    if let Ok(l) = LinkSpec::layered(&[&spec]) {
        let _ = l.resolve();
    }
});
