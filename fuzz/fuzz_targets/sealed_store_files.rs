#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzzing::sealed_store_files(data);
});
