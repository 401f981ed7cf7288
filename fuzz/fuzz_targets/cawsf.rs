//! A `.cawsf` file through `cawsf::open`, `verify`, `inspect` and `layer_ranges` (each
//! checks the file on its own path, so all four run on every input).
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata::format::cawsf;

fuzz_target!(|data: &[u8]| {
    let path = strata_fuzz::write_scratch("fuzz.cawsf", data);
    if let Ok(src) = cawsf::open(&path) {
        strata_fuzz::touch_tensors(src.tensors.values());
    }
    let _ = cawsf::verify(&path);
    let _ = cawsf::inspect(&path);
    let _ = cawsf::layer_ranges(&path);
});
