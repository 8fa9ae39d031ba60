//! What the endpoints priced by the unit are priced by: an image's quality
//! and size ([`ImageKey`]) and the prices per image by them
//! ([`ImagePrices`]). A leaf: the request's side (`api`) and the price's
//! (`ratelimit::Price`, `pricing`) both read it.

/// An image's quality (`quality`): what a per-image price is keyed by
/// besides its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quality {
    /// Not given, or a price for every quality.
    #[default]
    Any,
    Standard,
    Hd,
    Low,
    Medium,
    High,
    Auto,
}

impl Quality {
    pub fn of(s: &str) -> Option<Quality> {
        Some(match s {
            "" | "*" => Quality::Any,
            "standard" => Quality::Standard,
            "hd" => Quality::Hd,
            "low" => Quality::Low,
            "medium" => Quality::Medium,
            "high" => Quality::High,
            "auto" => Quality::Auto,
            _ => return None,
        })
    }
}

/// An image request's size and quality (`0x0`: not given or `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageKey {
    pub quality: Quality,
    pub width: u16,
    pub height: u16,
}

/// `1024x1536` as (width, height).
fn size_of(s: &str) -> Option<(u16, u16)> {
    let (w, h) = s.split_once('x')?;
    Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
}

impl ImageKey {
    /// From a request's `quality` and `size` (unknown values read as not
    /// given: the provider decides whether they are valid).
    pub fn of(quality: &str, size: &str) -> ImageKey {
        let (width, height) = size_of(size).unwrap_or((0, 0));
        ImageKey {
            quality: Quality::of(quality).unwrap_or_default(),
            width,
            height,
        }
    }

    /// From a price key: `1024x1024`, `hd`, `hd 1024x1792`, or `*`.
    pub fn of_price_key(key: &str) -> Option<ImageKey> {
        let mut quality = Quality::Any;
        let mut size = (0, 0);
        for word in key.split_whitespace() {
            if let Some(s) = size_of(word) {
                size = s;
            } else {
                quality = Quality::of(word)?;
            }
        }
        Some(ImageKey {
            quality,
            width: size.0,
            height: size.1,
        })
    }
}

/// Prices per image by quality and size (micro-dollars), at most
/// [`ImagePrices::MAX`] of them: fixed, so a [`Price`] stays a copy.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ImagePrices {
    entries: [(ImageKey, f64); ImagePrices::MAX],
    len: usize,
}

impl ImagePrices {
    pub const MAX: usize = 16;

    /// Add a price; `false` when full.
    pub fn push(&mut self, key: ImageKey, micros: f64) -> bool {
        let Some(slot) = self.entries.get_mut(self.len) else {
            return false;
        };
        *slot = (key, micros);
        self.len = self.len.saturating_add(1);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The price of one image: its quality and size's, else its size's,
    /// else its quality's, else the price for any.
    pub fn of(&self, k: ImageKey) -> Option<f64> {
        let entries = self.entries.get(..self.len).unwrap_or_default();
        let find = |q: Quality, sized: bool| {
            entries.iter().find_map(|(e, p)| {
                let size_ok = if sized {
                    (e.width, e.height) == (k.width, k.height) && e.width != 0
                } else {
                    e.width == 0
                };
                (e.quality == q && size_ok).then_some(*p)
            })
        };
        find(k.quality, true)
            .or_else(|| find(Quality::Any, true))
            .or_else(|| find(k.quality, false))
            .or_else(|| find(Quality::Any, false))
    }
}
