//! Process limits a router needs raised before it accepts its first connection.

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
