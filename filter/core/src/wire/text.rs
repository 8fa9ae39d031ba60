//! Small text encodings: lower-case hex (ids, MACs, key hashes) and
//! zero-padded decimals (dates, reset times), written by hand on the
//! request path.

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().saturating_mul(2));
    push_hex(bytes, &mut out);
    out
}

/// Lower-case hex of `bytes`, appended.
pub fn push_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        for nibble in [b >> 4, b & 0x0f] {
            if let Some(&d) = DIGITS.get(usize::from(nibble)) {
                out.push(char::from(d));
            }
        }
    }
}

/// The bytes of lower-case or upper-case hex (`None`: odd length or not hex).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|pair| {
            let hi = char::from(*pair.first()?).to_digit(16)?;
            let lo = char::from(*pair.get(1)?).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect()
}

/// `n` in decimal, at least `width` digits (zero-padded), appended (also
/// the rate limits' reset times: numbers on the request path unformatted).
pub(crate) fn push_padded(n: u64, width: usize, out: &mut String) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i = i.saturating_sub(1);
        if let Some(d) = digits.get_mut(i) {
            *d = b'0'.saturating_add((n % 10) as u8);
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    let start = i.min(digits.len().saturating_sub(width));
    for &d in digits.get(start..).unwrap_or_default() {
        out.push(char::from(d));
    }
}
