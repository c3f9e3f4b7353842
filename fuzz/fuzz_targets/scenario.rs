//! A lab scenario file with any content, full and quick: parsing and checking every cell never
//! panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use satpep_lab::scenario::Scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for quick in [false, true] {
        if let Err(e) = Scenario::parse(text, quick) {
            assert!(!e.is_empty());
        }
    }
});
