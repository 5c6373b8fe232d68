//! Process settings a router needs before it accepts its first connection: limits raised,
//! memory kept in small pages.

/// Most descriptors asked for, even when the hard limit is unlimited (the kernel refuses
/// more than `fs.nr_open`, 1,048,576 by default).
const MOST_OPEN_FILES: u64 = 1 << 20;

/// Raises the soft open-file limit to the hard one. Every client connection costs a
/// descriptor, every proxied request a second one, and pooled backend connections more: the
/// usual soft default of 1,024 would refuse connections long before memory or CPU run out,
/// while the hard limit is what the administrator actually allowed.
pub(crate) fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            log::warn!("cannot read the open-file limit: {e}");
            return;
        }
    };
    let wanted = hard.min(MOST_OPEN_FILES);
    if soft >= wanted {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, wanted, hard) {
        Ok(()) => log::info!("open-file limit raised from {soft} to {wanted}"),
        Err(e) => log::warn!("cannot raise the open-file limit from {soft} to {wanted}: {e}"),
    }
}

/// Keeps the process's memory in 4 KiB pages. mimalloc asks for transparent huge pages on
/// its arenas (`madvise(MADV_HUGEPAGE)`, honoured in the kernel's default `madvise` mode),
/// so the first byte written to a 2 MiB region makes all of it resident: every idle
/// connection's buffers, allocated but barely written, then cost their whole size. Measured
/// with 1,000 idle WebSockets: 200 KiB each with huge pages, 63 KiB without, and no
/// difference in CPU per request (bench/ENGINE.md).
pub(crate) fn keep_memory_in_small_pages() {
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        log::warn!(
            "cannot turn transparent huge pages off: {e}; idle connections cost more memory"
        );
    }
}
