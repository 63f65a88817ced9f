//! Limits for the fuzz targets: the production defaults scaled down, so
//! that an input hitting a limit is found in milliseconds and a run stays
//! within libFuzzer's memory limit. The checks are the same code.

#![allow(dead_code)]

pub fn pprof() -> fathom_pprof::Limits {
    fathom_pprof::Limits {
        max_decompressed_bytes: 4 << 20,
        max_samples: 100_000,
        max_locations: 100_000,
        max_functions: 100_000,
        max_mappings: 10_000,
        max_strings: 100_000,
        max_decoded_bytes: 64 << 20,
        ..Default::default()
    }
}

pub fn otlp() -> fathom_otlp::Limits {
    fathom_otlp::Limits {
        max_samples: 100_000,
        max_profiles: 1_000,
        max_table_entries: 100_000,
        max_frames: 1_000_000,
        max_decoded_bytes: 64 << 20,
        ..Default::default()
    }
}

pub fn distributor() -> fathom_distributor::Limits {
    fathom_distributor::Limits {
        max_body_bytes: 4 << 20,
        max_decompressed_bytes: 16 << 20,
        max_profiles_per_push: 100,
        ..Default::default()
    }
}
