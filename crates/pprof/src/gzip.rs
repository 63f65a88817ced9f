//! Bounded gzip decompression.

use std::io::Read;

/// The gzip magic number.
pub(crate) fn is_gzip(b: &[u8]) -> bool {
    b.starts_with(&[0x1f, 0x8b])
}

/// Why decompression failed.
pub(crate) enum GunzipError {
    /// The stream is corrupt or truncated.
    Corrupt(std::io::Error),
    /// The output would exceed the limit.
    TooLarge,
}

/// Decompresses a gzip stream (all members, like Go's `gzip.Reader`).
/// The output buffer never grows beyond `limit` bytes (plus one 64 KiB
/// read buffer): a gzip bomb fails as soon as it produces `limit + 1`
/// bytes.
pub(crate) fn gunzip(b: &[u8], limit: usize) -> Result<Vec<u8>, GunzipError> {
    let mut decoder = flate2::read::MultiGzDecoder::new(b);
    let mut out: Vec<u8> = Vec::with_capacity(b.len().saturating_mul(4).clamp(64, limit.max(64)));
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match decoder.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(GunzipError::Corrupt(e)),
        };
        let need = out.len() + n;
        if need > limit {
            return Err(GunzipError::TooLarge);
        }
        if need > out.capacity() {
            // Grow geometrically, but never past the limit.
            let target = out.capacity().saturating_mul(2).max(need).min(limit);
            out.reserve_exact(target - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("write to vec");
        e.finish().expect("finish")
    }

    #[test]
    fn round_trip_and_limit() {
        let data = vec![7u8; 100_000];
        let z = gz(&data);
        assert!(is_gzip(&z));
        assert!(matches!(gunzip(&z, 100_000), Ok(v) if v == data));
        assert!(matches!(gunzip(&z, 99_999), Err(GunzipError::TooLarge)));
        assert!(matches!(
            gunzip(&z[..z.len() / 2], 1 << 20),
            Err(GunzipError::Corrupt(_))
        ));
        // Concatenated members are read like Go's gzip.Reader does.
        let mut two = z.clone();
        two.extend_from_slice(&z);
        assert!(matches!(gunzip(&two, 1 << 20), Ok(v) if v.len() == 200_000));
    }
}
