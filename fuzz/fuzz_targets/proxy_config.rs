//! A proxy configuration file with any content: parsing and checking it never panics; it is
//! either accepted or refused with a message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use satpep_proxy::config::ProxyFile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = ProxyFile::parse(text).and_then(|f| f.resolve()) {
        assert!(!e.is_empty());
    }
});
