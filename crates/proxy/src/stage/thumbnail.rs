//! Image resizing, the CPU-heavy half of the images stage: decode within limits, scale,
//! encode. Pure functions of bytes, run on the worker pool, never on an event loop.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, ImageReader, Limits};

/// Decoded originals larger than this many pixels are refused before any pixel is
/// allocated: a small file can declare an enormous image (a decompression bomb).
const MAX_SOURCE_PIXELS: u64 = 50_000_000;
/// Memory the decoder may allocate.
const MAX_DECODE_BYTES: u64 = 512 * 1024 * 1024;

/// How the output relates to the asked box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Inside the box, aspect ratio kept (one side may be smaller).
    Contain,
    /// Exactly the box, aspect ratio kept by cropping the overflow (centred).
    Cover,
}

/// Output encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Jpeg,
    Png,
    WebP,
}

impl Encoding {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "jpeg" | "jpg" => Some(Self::Jpeg),
            "png" => Some(Self::Png),
            "webp" => Some(Self::WebP),
            _ => None,
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Self::Jpeg => "image/jpeg",
            Self::Png => "image/png",
            Self::WebP => "image/webp",
        }
    }

    fn of(format: ImageFormat) -> Option<Self> {
        match format {
            ImageFormat::Jpeg => Some(Self::Jpeg),
            ImageFormat::Png => Some(Self::Png),
            ImageFormat::WebP => Some(Self::WebP),
            _ => None,
        }
    }
}

/// One resize: the box, the fit, and the encoding (`None`: the original's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resize {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) fit: Fit,
    pub(crate) encoding: Option<Encoding>,
    pub(crate) quality: u8,
}

/// A resized image.
#[derive(Debug)]
pub(crate) struct Resized {
    pub(crate) bytes: Vec<u8>,
    pub(crate) encoding: Encoding,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

/// Why an original cannot be resized: the client gets 422 with this text.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unprocessable {
    #[error("the original is not a JPEG, PNG or WebP image")]
    UnsupportedFormat,
    #[error("the original image is over the size limit ({0} pixels)")]
    TooManyPixels(u64),
    #[error("the original image cannot be decoded: {0}")]
    Corrupt(String),
    #[error("the resized image cannot be encoded: {0}")]
    Encode(String),
}

pub(crate) fn resize(original: &[u8], wanted: Resize) -> Result<Resized, Unprocessable> {
    let reader = ImageReader::new(Cursor::new(original))
        .with_guessed_format()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    let source_encoding = reader
        .format()
        .and_then(Encoding::of)
        .ok_or(Unprocessable::UnsupportedFormat)?;
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    if u64::from(width) * u64::from(height) > MAX_SOURCE_PIXELS {
        return Err(Unprocessable::TooManyPixels(MAX_SOURCE_PIXELS));
    }
    let mut reader = ImageReader::new(Cursor::new(original))
        .with_guessed_format()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let decoded = reader
        .decode()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    let scaled = scale(&decoded, wanted.width, wanted.height, wanted.fit);
    let encoding = wanted.encoding.unwrap_or(source_encoding);
    let bytes = encode(&scaled, encoding, wanted.quality)?;
    Ok(Resized {
        bytes,
        encoding,
        width: scaled.width(),
        height: scaled.height(),
    })
}

/// Shrinking averages the source pixels under each output pixel (the `thumbnail` sampler:
/// sharp enough for thumbnails and several times faster than a convolution filter on a
/// large original); enlarging interpolates with Catmull-Rom.
fn scale(image: &DynamicImage, width: u32, height: u32, fit: Fit) -> DynamicImage {
    let shrinking = width <= image.width() && height <= image.height();
    let filter = image::imageops::FilterType::CatmullRom;
    match (fit, shrinking) {
        (Fit::Contain, true) => image.thumbnail(width, height),
        (Fit::Contain, false) => image.resize(width, height, filter),
        (Fit::Cover, true) => {
            // The largest centred region with the box's aspect ratio, then shrunk to it.
            let ratio = f64::from(width) / f64::from(height);
            let (source_w, source_h) = (f64::from(image.width()), f64::from(image.height()));
            let (crop_w, crop_h) = if source_w / source_h > ratio {
                ((source_h * ratio).round(), source_h)
            } else {
                (source_w, (source_w / ratio).round())
            };
            let (crop_w, crop_h) = ((crop_w as u32).max(1), (crop_h as u32).max(1));
            let x = (image.width() - crop_w.min(image.width())) / 2;
            let y = (image.height() - crop_h.min(image.height())) / 2;
            image
                .crop_imm(x, y, crop_w, crop_h)
                .thumbnail_exact(width, height)
        }
        (Fit::Cover, false) => image.resize_to_fill(width, height, filter),
    }
}

fn encode(image: &DynamicImage, encoding: Encoding, quality: u8) -> Result<Vec<u8>, Unprocessable> {
    let mut out = Cursor::new(Vec::new());
    let failed = |e: image::ImageError| Unprocessable::Encode(e.to_string());
    match encoding {
        Encoding::Jpeg => {
            // JPEG has no alpha channel.
            let rgb = DynamicImage::ImageRgb8(image.to_rgb8());
            let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
            rgb.write_with_encoder(encoder).map_err(failed)?;
        }
        Encoding::Png => image.write_to(&mut out, ImageFormat::Png).map_err(failed)?,
        Encoding::WebP => {
            // The encoder of the image crate writes lossless WebP only, in 8-bit RGB(A).
            let converted = if image.color().has_alpha() {
                DynamicImage::ImageRgba8(image.to_rgba8())
            } else {
                DynamicImage::ImageRgb8(image.to_rgb8())
            };
            converted
                .write_to(&mut out, ImageFormat::WebP)
                .map_err(failed)?;
        }
    }
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let image = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x % 256) as u8, (y % 256) as u8, 128])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image)
            .write_to(&mut out, ImageFormat::Png)
            .expect("encode");
        out.into_inner()
    }

    fn wanted(width: u32, height: u32, fit: Fit, encoding: Option<Encoding>) -> Resize {
        Resize {
            width,
            height,
            fit,
            encoding,
            quality: 80,
        }
    }

    #[test]
    fn contain_keeps_the_aspect_ratio_and_cover_fills_the_box() {
        let original = png(400, 200);
        let contained = resize(&original, wanted(100, 100, Fit::Contain, None)).expect("resize");
        assert_eq!((contained.width, contained.height), (100, 50));
        assert_eq!(contained.encoding, Encoding::Png);
        let covered = resize(
            &original,
            wanted(100, 100, Fit::Cover, Some(Encoding::Jpeg)),
        )
        .expect("resize");
        assert_eq!((covered.width, covered.height), (100, 100));
        let decoded = image::load_from_memory(&covered.bytes).expect("a JPEG comes out");
        assert_eq!((decoded.width(), decoded.height()), (100, 100));
        let webp = resize(
            &original,
            wanted(50, 50, Fit::Contain, Some(Encoding::WebP)),
        )
        .expect("resize");
        assert_eq!(
            image::guess_format(&webp.bytes).expect("format"),
            ImageFormat::WebP
        );
    }

    #[test]
    fn enlarging_and_shrinking_both_honour_the_fit() {
        let original = png(40, 20);
        let bigger = resize(&original, wanted(200, 200, Fit::Contain, None)).expect("resize");
        assert_eq!((bigger.width, bigger.height), (200, 100));
        let filled = resize(&original, wanted(90, 30, Fit::Cover, None)).expect("resize");
        assert_eq!((filled.width, filled.height), (90, 30));
        let tall = resize(&png(300, 600), wanted(50, 50, Fit::Cover, None)).expect("resize");
        assert_eq!((tall.width, tall.height), (50, 50));
    }

    #[test]
    fn garbage_truncated_and_oversized_originals_are_refused_not_panicked_on() {
        assert!(matches!(
            resize(b"not an image at all", wanted(10, 10, Fit::Contain, None)),
            Err(Unprocessable::UnsupportedFormat)
        ));
        let original = png(300, 300);
        let cut = &original[..original.len() / 2];
        assert!(matches!(
            resize(cut, wanted(10, 10, Fit::Contain, None)),
            Err(Unprocessable::Corrupt(_))
        ));
        // A valid PNG header (checksum included) declaring 100,000 × 100,000 pixels.
        let mut bomb = png(1, 1);
        bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let checksum = crc32(&bomb[12..29]);
        bomb[29..33].copy_from_slice(&checksum.to_be_bytes());
        assert!(matches!(
            resize(&bomb, wanted(10, 10, Fit::Contain, None)),
            Err(Unprocessable::TooManyPixels(_))
        ));
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
