#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| portcullis_fuzz::cache_tiers(data));
