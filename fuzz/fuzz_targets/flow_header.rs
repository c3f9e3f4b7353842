//! A tunnel stream's flow header, as a peer (or an attacker holding a peer's credentials)
//! may send it: any bytes. Decoding never panics, never claims more bytes than it was given
//! or than a header may have, and what it accepts encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use satpep_tunnel::header::{Answer, FlowHeader, HeaderError, MAX_LEN};

fuzz_target!(|data: &[u8]| {
    match FlowHeader::decode(data) {
        Ok((h, n)) => {
            assert!(n <= data.len() && n <= MAX_LEN, "{n}");
            assert_eq!(h.len(), n);
            let again = h.encode();
            assert_eq!(&again[..], &data[..n], "a decoded header re-encodes differently");
            assert_eq!(FlowHeader::decode(&again).map(|(_, k)| k), Ok(n));
        }
        Err(HeaderError::Truncated { need, have }) => {
            assert_eq!(have, data.len());
            assert!(need > have && need <= MAX_LEN, "need {need} have {have}");
        }
        Err(_) => {}
    }
    if let Some(&b) = data.first() {
        if let Some(a) = Answer::from_byte(b) {
            assert_eq!(a as u8, b);
        }
    }
});
