//! Built-in PII patterns, scanned by hand (one pass over the bytes each, no
//! regular expression): e-mail addresses, phone numbers, card numbers that
//! pass the Luhn check, IBANs that pass the mod-97 check, and the shapes of
//! well-known API keys. Each scanner returns byte spans on char boundaries
//! (every byte it matches is ASCII).

/// One built-in pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pii {
    Email,
    Phone,
    Card,
    Iban,
    ApiKey,
}

impl Pii {
    pub const ALL: [Pii; 5] = [Pii::Email, Pii::Phone, Pii::Card, Pii::Iban, Pii::ApiKey];

    pub fn parse(s: &str) -> Option<Pii> {
        Pii::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The name in config and in `[REDACTED:<name>]`.
    pub fn name(self) -> &'static str {
        match self {
            Pii::Email => "email",
            Pii::Phone => "phone",
            Pii::Card => "card",
            Pii::Iban => "iban",
            Pii::ApiKey => "api_key",
        }
    }

    /// Whether this pattern can occur at all in a text with `bytes` (what
    /// every match of its scanner holds: an e-mail address its `@`, a
    /// phone, card or IBAN number a digit); a text that cannot hold one is
    /// not scanned (#49: a check pays only for texts it can match).
    pub fn may_occur(self, bytes: Bytes) -> bool {
        match self {
            Pii::Email => bytes.at_sign,
            Pii::Phone | Pii::Card | Pii::Iban => bytes.digit,
            Pii::ApiKey => true,
        }
    }

    /// Byte spans of this pattern in `text`, in order, not overlapping.
    pub fn find(self, text: &str, out: &mut Vec<(usize, usize)>) {
        let b = text.as_bytes();
        match self {
            Pii::Email => emails(b, out),
            Pii::Phone => phones(b, out),
            Pii::Card => cards(b, out),
            Pii::Iban => ibans(b, out),
            Pii::ApiKey => api_keys(b, out),
        }
    }
}

/// What a text holds that the scanners need, read in one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    pub at_sign: bool,
    pub digit: bool,
}

impl Bytes {
    pub fn of(text: &str) -> Bytes {
        let mut out = Bytes::default();
        for &c in text.as_bytes() {
            out.at_sign |= c == b'@';
            out.digit |= c.is_ascii_digit();
        }
        out
    }
}

fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

/// Whether position `i` starts a word (the byte before is not a letter or
/// digit).
fn word_start(b: &[u8], i: usize) -> bool {
    i == 0 || !at(b, i - 1).is_ascii_alphanumeric()
}

fn word_end(b: &[u8], i: usize) -> bool {
    !at(b, i).is_ascii_alphanumeric()
}

fn emails(b: &[u8], out: &mut Vec<(usize, usize)>) {
    let local = |c: u8| c.is_ascii_alphanumeric() || b"._%+-".contains(&c);
    let domain = |c: u8| c.is_ascii_alphanumeric() || c == b'.' || c == b'-';
    let mut from = 0;
    while let Some(off) = b
        .get(from..)
        .and_then(|s| s.iter().position(|&c| c == b'@'))
    {
        let at_sign = from + off;
        from = at_sign + 1;
        let mut start = at_sign;
        while start > 0 && local(at(b, start - 1)) {
            start -= 1;
        }
        while start < at_sign && at(b, start) == b'.' {
            start += 1;
        }
        let mut end = at_sign + 1;
        while end < b.len() && domain(at(b, end)) {
            end += 1;
        }
        while end > at_sign + 1 && matches!(at(b, end - 1), b'.' | b'-') {
            end -= 1;
        }
        let host = b.get(at_sign + 1..end).unwrap_or_default();
        let tld = host.rsplit(|&c| c == b'.').next().unwrap_or_default();
        let dotted = host.contains(&b'.') && !host.starts_with(b".");
        if start < at_sign && dotted && tld.len() >= 2 && tld.iter().all(u8::is_ascii_alphabetic) {
            if out.last().is_none_or(|&(_, e)| e <= start) {
                out.push((start, end));
            }
            from = end;
        }
    }
}

/// Digits from `i`, allowing single separators from `seps` between them:
/// (end of the run, digits in it).
fn digit_run(b: &[u8], i: usize, seps: &[u8], digits: &mut Vec<u8>) -> usize {
    let mut j = i;
    let mut end = i;
    while j < b.len() {
        let c = at(b, j);
        // One separator, or two (`) `), between digits.
        let two = seps.contains(&at(b, j + 1)) && at(b, j + 2).is_ascii_digit();
        if c.is_ascii_digit() {
            digits.push(c - b'0');
            j += 1;
            end = j;
        } else if seps.contains(&c) && j > i && (at(b, j + 1).is_ascii_digit() || two) {
            j += if two { 2 } else { 1 };
        } else {
            break;
        }
        if digits.len() > 32 {
            break;
        }
    }
    end
}

fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

fn cards(b: &[u8], out: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    let mut digits = Vec::new();
    while i < b.len() {
        if !(at(b, i).is_ascii_digit() && word_start(b, i)) {
            i += 1;
            continue;
        }
        digits.clear();
        let end = digit_run(b, i, b" -", &mut digits);
        if (13..=19).contains(&digits.len()) && word_end(b, end) && luhn(&digits) {
            out.push((i, end));
        }
        i = end.max(i + 1);
    }
}

fn phones(b: &[u8], out: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    let mut digits = Vec::new();
    while i < b.len() {
        let c = at(b, i);
        let plus = c == b'+' && at(b, i + 1).is_ascii_digit();
        let paren = c == b'(' && at(b, i + 1).is_ascii_digit();
        if !((c.is_ascii_digit() || plus || paren) && word_start(b, i)) {
            i += 1;
            continue;
        }
        let first = if plus || paren { i + 1 } else { i };
        digits.clear();
        let end = digit_run(b, first, b" -.()", &mut digits);
        // A closing parenthesis right after an area code counts as a separator.
        let separated = b
            .get(first..end)
            .is_some_and(|s| !s.iter().all(u8::is_ascii_digit));
        let n = digits.len();
        let phone_like = (7..=15).contains(&n) && (plus || paren || separated || n >= 10);
        if phone_like && word_end(b, end) {
            out.push((i, end));
        }
        i = end.max(i + 1);
    }
}

fn ibans(b: &[u8], out: &mut Vec<(usize, usize)>) {
    let mut i = 0;
    while i + 4 <= b.len() {
        let ok_start = at(b, i).is_ascii_uppercase()
            && at(b, i + 1).is_ascii_uppercase()
            && at(b, i + 2).is_ascii_digit()
            && at(b, i + 3).is_ascii_digit()
            && word_start(b, i);
        if !ok_start {
            i += 1;
            continue;
        }
        // Letters and digits, with a single space allowed between groups.
        let mut chars = Vec::new();
        let mut j = i;
        let mut end = i;
        while j < b.len() && chars.len() <= 34 {
            let c = at(b, j);
            if c.is_ascii_uppercase() || c.is_ascii_digit() {
                chars.push(c);
                j += 1;
                end = j;
            } else if c == b' '
                && (at(b, j + 1).is_ascii_uppercase() || at(b, j + 1).is_ascii_digit())
            {
                j += 1;
            } else {
                break;
            }
        }
        if (15..=34).contains(&chars.len()) && word_end(b, end) && mod97(&chars) {
            out.push((i, end));
            i = end;
        } else {
            i += 1;
        }
    }
}

/// ISO 13616: move the first four characters to the end, letters to
/// 10..=35, and the number mod 97 is 1.
fn mod97(chars: &[u8]) -> bool {
    let (head, tail) = chars.split_at(4.min(chars.len()));
    let mut rem: u32 = 0;
    for &c in tail.iter().chain(head) {
        let v = if c.is_ascii_digit() {
            u32::from(c - b'0')
        } else {
            u32::from(c - b'A') + 10
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// Prefixes of well-known secret keys, each followed by at least 16 key
/// characters.
const KEY_PREFIXES: [&[u8]; 12] = [
    b"sk-",
    b"sk_live_",
    b"rk_live_",
    b"AKIA",
    b"ASIA",
    b"ghp_",
    b"gho_",
    b"ghs_",
    b"github_pat_",
    b"xoxb-",
    b"xoxp-",
    b"AIza",
];

fn api_keys(b: &[u8], out: &mut Vec<(usize, usize)>) {
    let key_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let mut i = 0;
    while i < b.len() {
        // Every prefix starts with one of these: most bytes stop here.
        if !matches!(at(b, i), b's' | b'r' | b'A' | b'g' | b'x') || !word_start(b, i) {
            i += 1;
            continue;
        }
        let rest = b.get(i..).unwrap_or_default();
        let prefix = KEY_PREFIXES.iter().find(|p| rest.starts_with(p));
        match prefix {
            Some(p) if word_start(b, i) => {
                let mut end = i + p.len();
                while end < b.len() && key_char(at(b, end)) {
                    end += 1;
                }
                if end - i - p.len() >= 16 {
                    out.push((i, end));
                    i = end;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn found(p: Pii, text: &str) -> Vec<&str> {
        let mut spans = Vec::new();
        p.find(text, &mut spans);
        spans.iter().map(|&(s, e)| &text[s..e]).collect()
    }

    #[test]
    fn emails_are_found_with_their_whole_address() {
        assert_eq!(
            found(Pii::Email, "mail jane.doe+x@mail.example.com. or bob@ex.io"),
            ["jane.doe+x@mail.example.com", "bob@ex.io"]
        );
        assert!(found(Pii::Email, "a@b, @home, x@localhost, me@host.c0m").is_empty());
    }

    #[test]
    fn cards_need_the_luhn_check() {
        assert_eq!(
            found(
                Pii::Card,
                "card 4111 1111 1111 1111 ok, 4111-1111-1111-1112 not"
            ),
            ["4111 1111 1111 1111"]
        );
        assert_eq!(found(Pii::Card, "5500005555555559"), ["5500005555555559"]);
        assert!(found(Pii::Card, "order 1234567890123").is_empty());
    }

    #[test]
    fn phones_need_a_phone_shape() {
        assert_eq!(
            found(
                Pii::Phone,
                "call +1 415 555 2671 or (415) 555-2671 or 555-2671"
            ),
            ["+1 415 555 2671", "(415) 555-2671", "555-2671"]
        );
        assert!(found(Pii::Phone, "in 2024 we had 12345 users").is_empty());
    }

    #[test]
    fn ibans_need_the_mod97_check() {
        assert_eq!(
            found(
                Pii::Iban,
                "pay DE89 3704 0044 0532 0130 00 or GB82WEST12345698765432."
            ),
            ["DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432"]
        );
        assert!(found(Pii::Iban, "DE89 3704 0044 0532 0130 01").is_empty());
    }

    #[test]
    fn api_keys_by_their_prefixes() {
        assert_eq!(
            found(
                Pii::ApiKey,
                "key sk-proj-abcdefghijklmnop1234 and AKIAIOSFODNN7EXAMPLE, not sk-short"
            ),
            ["sk-proj-abcdefghijklmnop1234", "AKIAIOSFODNN7EXAMPLE"]
        );
        assert!(found(Pii::ApiKey, "task-abcdefghijklmnopqrstu").is_empty());
    }

    /// A text a pattern is skipped for holds none of its matches: every
    /// match has what `may_occur` asks for.
    #[test]
    fn a_text_is_skipped_only_when_it_cannot_match() {
        let samples = [
            "mail jane.doe+x@mail.example.com. or bob@ex.io",
            "card 4111 1111 1111 1111 ok",
            "call +1 (415) 555-0100 now",
            "IBAN DE89 3704 0044 0532 0130 00",
            "key sk-proj-abcdefghijklmnop1234 and AKIAIOSFODNN7EXAMPLE",
            "Say hello to the benchmark in five words or fewer, please.",
        ];
        for text in samples {
            let bytes = Bytes::of(text);
            for p in Pii::ALL {
                if !p.may_occur(bytes) {
                    assert!(found(p, text).is_empty(), "{p:?} skipped in {text:?}");
                }
            }
        }
        let plain = Bytes::of(samples[5]);
        assert!(!plain.at_sign && !plain.digit);
        assert!(!Pii::Email.may_occur(plain) && !Pii::Card.may_occur(plain));
        assert!(Pii::ApiKey.may_occur(plain));
        assert_eq!(
            Bytes::of("a@b 7"),
            Bytes {
                at_sign: true,
                digit: true
            }
        );
    }

    #[test]
    fn scanners_never_panic_on_edges() {
        for text in [
            "", "@", "+", "(", "9", "DE", "sk-", "é@é.é", "a@b.", "+1 ", "4111 ",
        ] {
            for p in Pii::ALL {
                let _ = found(p, text);
            }
        }
    }
}
