//! Image resizing, the CPU-heavy half of the images stage: decode within limits, scale,
//! encode. Pure functions of bytes, run on the worker pool, never on an event loop.
//!
//! Where the time goes (bench_images' 1200×800 JPEG → 320×213, one core): with the image
//! crate, decoding 9.4 ms, its area-average shrink 8.3 ms, encoding 3.3 ms. So JPEGs are
//! decoded by libjpeg-turbo at reduced size (its scaled IDCT: 1/2, 1/4 or 1/8, never below
//! what the output needs), the rest is resized by a SIMD convolution (fast_image_resize),
//! and JPEG is encoded by libjpeg-turbo, WebP by libwebp (lossy, at the app's quality).
//! The floor left is libjpeg-turbo's entropy decoding of the whole file (≈ 5 ms for that
//! photo even at 1/8): every coefficient must be read to find the next.

use std::io::Cursor;

use fast_image_resize::{self as fir, images::Image as Pixmap, PixelType};
use image::{ImageEncoder, ImageFormat, ImageReader, Limits};

/// Decoded originals larger than this many pixels are refused before any pixel is
/// allocated: a small file can declare an enormous image (a decompression bomb).
const MAX_SOURCE_PIXELS: u64 = 50_000_000;
/// Memory the decoder of PNG and WebP originals may allocate.
const MAX_DECODE_BYTES: u64 = 512 * 1024 * 1024;
/// The reductions libjpeg-turbo's IDCT does while decoding, largest first: the fast ones
/// (powers of two), as libvips uses for its shrink-on-load.
const JPEG_SHRINKS: [usize; 3] = [8, 4, 2];

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
    #[error("the image cannot be resized: {0}")]
    Resize(String),
    #[error("the resized image cannot be encoded: {0}")]
    Encode(String),
}

/// Decoded pixels, 8-bit RGB or RGBA, and the size of the original they came from (a JPEG
/// may be decoded smaller).
struct Decoded {
    pixels: Pixmap<'static>,
    original_width: u32,
    original_height: u32,
}

pub(crate) fn resize(original: &[u8], wanted: Resize) -> Result<Resized, Unprocessable> {
    let source_encoding = image::guess_format(original)
        .ok()
        .and_then(Encoding::of)
        .ok_or(Unprocessable::UnsupportedFormat)?;
    let decoded = match source_encoding {
        Encoding::Jpeg => decode_jpeg(original, wanted)?,
        Encoding::Png | Encoding::WebP => decode_with_image_crate(original)?,
    };
    let (width, height) = output_size(decoded.original_width, decoded.original_height, wanted);
    let scaled = scale(&decoded.pixels, width, height, wanted.fit)?;
    let encoding = wanted.encoding.unwrap_or(source_encoding);
    let bytes = encode(&scaled, encoding, wanted.quality)?;
    Ok(Resized {
        bytes,
        encoding,
        width,
        height,
    })
}

/// The output's size: the box for `Cover`; for `Contain`, the original scaled by the ratio
/// that fits it inside the box (rounded, at least one pixel).
fn output_size(original_width: u32, original_height: u32, wanted: Resize) -> (u32, u32) {
    if wanted.fit == Fit::Cover {
        return (wanted.width, wanted.height);
    }
    let ratio = needed_ratio(original_width, original_height, wanted);
    let side = |length: u32| ((f64::from(length) * ratio).round() as u32).max(1);
    (side(original_width), side(original_height))
}

/// How much of the original's linear size the output needs.
fn needed_ratio(original_width: u32, original_height: u32, wanted: Resize) -> f64 {
    let across = f64::from(wanted.width) / f64::from(original_width.max(1));
    let down = f64::from(wanted.height) / f64::from(original_height.max(1));
    match wanted.fit {
        Fit::Contain => across.min(down),
        Fit::Cover => across.max(down),
    }
}

fn check_pixels(width: u64, height: u64) -> Result<(), Unprocessable> {
    if width * height > MAX_SOURCE_PIXELS {
        return Err(Unprocessable::TooManyPixels(MAX_SOURCE_PIXELS));
    }
    Ok(())
}

/// A JPEG decoded by libjpeg-turbo at the smallest of its fast reductions that still leaves
/// at least the output's size, so the resizer never enlarges what the decoder shrank. JPEGs
/// libjpeg-turbo will not turn into RGB (CMYK, or data it warns about) go to the image
/// crate's decoder instead, which decides between pixels and a 422.
fn decode_jpeg(original: &[u8], wanted: Resize) -> Result<Decoded, Unprocessable> {
    let mut decompressor = match turbojpeg::Decompressor::new() {
        Ok(decompressor) => decompressor,
        Err(_) => return decode_with_image_crate(original),
    };
    let header = match decompressor.read_header(original) {
        Ok(header) => header,
        Err(_) => return decode_with_image_crate(original),
    };
    check_pixels(header.width as u64, header.height as u64)?;
    let (original_width, original_height) = (header.width as u32, header.height as u32);
    let ratio = needed_ratio(original_width, original_height, wanted);
    let shrink = JPEG_SHRINKS
        .into_iter()
        .find(|&shrink| 1.0 / shrink as f64 >= ratio)
        .unwrap_or(1);
    let width = header.width.div_ceil(shrink);
    let height = header.height.div_ceil(shrink);
    let mut buffer = vec![0u8; width * height * 3];
    let target = turbojpeg::Image {
        pixels: buffer.as_mut_slice(),
        width,
        pitch: width * 3,
        height,
        format: turbojpeg::PixelFormat::RGB,
    };
    if decompressor.decompress(original, target).is_err() {
        return decode_with_image_crate(original);
    }
    let pixels = Pixmap::from_vec_u8(width as u32, height as u32, buffer, PixelType::U8x3)
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    Ok(Decoded {
        pixels,
        original_width,
        original_height,
    })
}

fn decode_with_image_crate(original: &[u8]) -> Result<Decoded, Unprocessable> {
    let reader = ImageReader::new(Cursor::new(original))
        .with_guessed_format()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    check_pixels(u64::from(width), u64::from(height))?;
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
    let (buffer, pixel_type) = if decoded.color().has_alpha() {
        (decoded.to_rgba8().into_raw(), PixelType::U8x4)
    } else {
        (decoded.to_rgb8().into_raw(), PixelType::U8x3)
    };
    let pixels = Pixmap::from_vec_u8(width, height, buffer, pixel_type)
        .map_err(|e| Unprocessable::Corrupt(e.to_string()))?;
    Ok(Decoded {
        pixels,
        original_width: width,
        original_height: height,
    })
}

/// Lanczos3 both ways (the filter libvips and imgproxy shrink with); `Cover` first crops
/// the largest centred region with the box's aspect ratio. Alpha is premultiplied while
/// filtering so transparent pixels do not bleed their colour.
fn scale(
    source: &Pixmap<'static>,
    width: u32,
    height: u32,
    fit: Fit,
) -> Result<Pixmap<'static>, Unprocessable> {
    let mut target = Pixmap::new(width, height, source.pixel_type());
    let mut options = fir::ResizeOptions::new()
        .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Lanczos3));
    if fit == Fit::Cover {
        options = options.fit_into_destination(Some((0.5, 0.5)));
    }
    fir::Resizer::new()
        .resize(source, &mut target, &options)
        .map_err(|e| Unprocessable::Resize(e.to_string()))?;
    Ok(target)
}

fn encode(
    image: &Pixmap<'static>,
    encoding: Encoding,
    quality: u8,
) -> Result<Vec<u8>, Unprocessable> {
    let (width, height) = (image.width(), image.height());
    let has_alpha = image.pixel_type() == PixelType::U8x4;
    match encoding {
        Encoding::Jpeg => {
            // JPEG has no alpha channel: libjpeg-turbo skips the fourth byte (RGBX).
            let format = if has_alpha {
                turbojpeg::PixelFormat::RGBX
            } else {
                turbojpeg::PixelFormat::RGB
            };
            let mut compressor =
                turbojpeg::Compressor::new().map_err(|e| Unprocessable::Encode(e.to_string()))?;
            compressor.set_quality(i32::from(quality));
            compressor.set_subsamp(turbojpeg::Subsamp::Sub2x2);
            compressor
                .compress_to_vec(turbojpeg::Image {
                    pixels: image.buffer(),
                    width: width as usize,
                    pitch: width as usize * format.size(),
                    height: height as usize,
                    format,
                })
                .map_err(|e| Unprocessable::Encode(e.to_string()))
        }
        Encoding::Png => {
            let color = if has_alpha {
                image::ExtendedColorType::Rgba8
            } else {
                image::ExtendedColorType::Rgb8
            };
            let mut out = Vec::new();
            image::codecs::png::PngEncoder::new(&mut out)
                .write_image(image.buffer(), width, height, color)
                .map_err(|e| Unprocessable::Encode(e.to_string()))?;
            Ok(out)
        }
        Encoding::WebP => {
            let layout = if has_alpha {
                webp::PixelLayout::Rgba
            } else {
                webp::PixelLayout::Rgb
            };
            let mut config = webp::WebPConfig::new()
                .map_err(|()| Unprocessable::Encode("libwebp refused its defaults".into()))?;
            config.lossless = 0;
            config.quality = f32::from(quality);
            webp::Encoder::new(image.buffer(), layout, width, height)
                .encode_advanced(&config)
                .map(|memory| memory.to_vec())
                .map_err(|e| Unprocessable::Encode(format!("{e:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::DynamicImage;

    /// A `width`×`height` RGB image with gradients and texture, encoded as `format`.
    fn encoded(width: u32, height: u32, format: ImageFormat) -> Vec<u8> {
        let image = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x * y) % 256) as u8])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image)
            .write_to(&mut out, format)
            .expect("encode");
        out.into_inner()
    }

    fn png(width: u32, height: u32) -> Vec<u8> {
        encoded(width, height, ImageFormat::Png)
    }

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        encoded(width, height, ImageFormat::Jpeg)
    }

    impl Resize {
        fn with_quality(self, quality: u8) -> Self {
            Self { quality, ..self }
        }
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

    #[test]
    fn jpegs_are_decoded_at_the_smallest_reduction_that_still_covers_the_output() {
        let original = jpeg(1200, 800);
        // 320×213 needs more than a quarter: decoded at half size.
        let half = decode_jpeg(&original, wanted(320, 240, Fit::Contain, None)).expect("decode");
        assert_eq!((half.pixels.width(), half.pixels.height()), (600, 400));
        assert_eq!((half.original_width, half.original_height), (1200, 800));
        // Cover needs the larger ratio: 240/800 of the height, more than a quarter.
        let cover = decode_jpeg(&original, wanted(100, 240, Fit::Cover, None)).expect("decode");
        assert_eq!(cover.pixels.width(), 600);
        let eighth = decode_jpeg(&original, wanted(100, 100, Fit::Contain, None)).expect("decode");
        assert_eq!((eighth.pixels.width(), eighth.pixels.height()), (150, 100));
        let full = decode_jpeg(&original, wanted(1000, 800, Fit::Contain, None)).expect("decode");
        assert_eq!(full.pixels.width(), 1200);
    }

    #[test]
    fn jpeg_thumbnails_keep_the_contract_and_webp_comes_out_lossy() {
        let original = jpeg(1200, 800);
        let contained = resize(&original, wanted(320, 240, Fit::Contain, None)).expect("resize");
        assert_eq!((contained.width, contained.height), (320, 213));
        assert_eq!(contained.encoding, Encoding::Jpeg);
        let decoded = image::load_from_memory(&contained.bytes).expect("a JPEG comes out");
        assert_eq!((decoded.width(), decoded.height()), (320, 213));
        let covered = resize(
            &original,
            wanted(200, 200, Fit::Cover, Some(Encoding::WebP)),
        )
        .expect("resize");
        assert_eq!((covered.width, covered.height), (200, 200));
        // A lossy WebP is a RIFF file whose first chunk is `VP8 ` (lossless: `VP8L`).
        assert_eq!(&covered.bytes[..4], b"RIFF");
        assert_eq!(&covered.bytes[12..16], b"VP8 ");
        let decoded = image::load_from_memory(&covered.bytes).expect("a WebP comes out");
        assert_eq!((decoded.width(), decoded.height()), (200, 200));
        let quality = |q| {
            resize(
                &original,
                wanted(320, 240, Fit::Contain, Some(Encoding::WebP)).with_quality(q),
            )
            .expect("resize")
            .bytes
            .len()
        };
        assert!(
            quality(30) < quality(95),
            "the quality setting reaches libwebp"
        );
    }

    #[test]
    fn truncated_and_damaged_jpegs_get_an_answer_not_a_panic() {
        let original = jpeg(640, 480);
        for cut in [20, 200, original.len() / 2, original.len() - 2] {
            // libjpeg-turbo refuses; the image crate's decoder then decides: pixels or 422.
            match resize(&original[..cut], wanted(64, 64, Fit::Contain, None)) {
                Ok(resized) => assert_eq!(resized.width, 64),
                Err(Unprocessable::Corrupt(_)) | Err(Unprocessable::UnsupportedFormat) => {}
                Err(other) => panic!("unexpected refusal for a cut at {cut}: {other}"),
            }
        }
        let mut bomb = jpeg(16, 16);
        // The SOF0 header: height and width at offsets 5..9 after the marker.
        let sof = bomb
            .windows(2)
            .position(|pair| pair == [0xFF, 0xC0])
            .expect("a baseline JPEG");
        bomb[sof + 5..sof + 7].copy_from_slice(&60_000u16.to_be_bytes());
        bomb[sof + 7..sof + 9].copy_from_slice(&60_000u16.to_be_bytes());
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
