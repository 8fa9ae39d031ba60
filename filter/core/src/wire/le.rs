//! Little-endian fields of the small fixed encodings kept in shared data
//! (breakers, buckets, counters, cache indexes). A short or damaged value
//! reads as `None`, never as a panic.

/// `N` bytes at `at`, if the value holds them.
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    bytes_at(b, at).map(u32::from_le_bytes)
}

pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    bytes_at(b, at).map(u64::from_le_bytes)
}

pub fn i64_at(b: &[u8], at: usize) -> Option<i64> {
    bytes_at(b, at).map(i64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn fields_read_in_place_and_short_values_are_none() {
        let mut v = 7u32.to_le_bytes().to_vec();
        v.extend_from_slice(&(-3i64).to_le_bytes());
        assert_eq!(u32_at(&v, 0), Some(7));
        assert_eq!(i64_at(&v, 4), Some(-3));
        assert_eq!(u64_at(&v, 5), None);
        assert_eq!(u32_at(&v, usize::MAX), None);
    }
}
