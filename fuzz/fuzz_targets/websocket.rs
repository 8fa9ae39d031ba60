#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| portcullis_fuzz::websocket(data));
