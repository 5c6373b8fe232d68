//! Streams a page through each of the router's encoders at every level, in the pieces a
//! backend's answer comes in and flushed after each (as `content_coding` does), and prints
//! one line a level: `coding level cpu_us_per_kib ratio`. CPU is this thread's
//! (CLOCK_THREAD_CPUTIME_ID), over repeats until at least a quarter second was spent.
//!
//!     compress-levels PAGE [PIECE_BYTES]

use std::io::Write;

/// The router's windows (content_coding.rs): 2^18 bytes for brotli and zstd.
const WINDOW_LOG: u32 = 18;
const MIN_CPU_SECONDS: f64 = 0.25;

fn thread_cpu_seconds() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec the call fills.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// Writes `page` in `piece`-byte pieces, flushing each; the compressed length.
fn stream<W: Write>(
    mut encoder: W,
    page: &[u8],
    piece: usize,
    finish: impl FnOnce(W) -> usize,
) -> usize {
    for chunk in page.chunks(piece) {
        encoder.write_all(chunk).expect("compress");
        encoder.flush().expect("flush");
    }
    finish(encoder)
}

fn compressed_len(coding: &str, level: u32, page: &[u8], piece: usize) -> usize {
    match coding {
        "gzip" => stream(
            flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level)),
            page,
            piece,
            |e| e.finish().expect("finish").len(),
        ),
        "br" => stream(
            brotli::CompressorWriter::new(Vec::new(), 4096, level, WINDOW_LOG),
            page,
            piece,
            |e| e.into_inner().len(),
        ),
        _ => {
            let mut encoder =
                zstd::stream::write::Encoder::new(Vec::new(), level as i32).expect("zstd");
            encoder.window_log(WINDOW_LOG).expect("window");
            stream(encoder, page, piece, |e| e.finish().expect("finish").len())
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let page = std::fs::read(
        args.get(1)
            .expect("usage: compress-levels PAGE [PIECE_BYTES]"),
    )
    .expect("read the page");
    let piece: usize = args
        .get(2)
        .and_then(|p| p.parse().ok())
        .unwrap_or(16 * 1024);
    let kib = page.len() as f64 / 1024.0;
    for (coding, levels) in [("gzip", 1..=9), ("br", 0..=11), ("zstd", 1..=19)] {
        for level in levels {
            let size = compressed_len(coding, level, &page, piece);
            let started = thread_cpu_seconds();
            let mut runs = 0u32;
            while thread_cpu_seconds() - started < MIN_CPU_SECONDS {
                std::hint::black_box(compressed_len(coding, level, &page, piece));
                runs += 1;
            }
            let per_kib_us = (thread_cpu_seconds() - started) / f64::from(runs) / kib * 1e6;
            println!(
                "{coding} {level} {per_kib_us:.3} {:.4}",
                size as f64 / page.len() as f64
            );
        }
    }
}
