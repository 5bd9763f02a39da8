// untar_beneath: unpacks an untrusted tar archive (one a sandbox made: `dsec
// cp ID:/x DST`) into a directory of the host, which must stay the only place
// written, whatever the archive holds and whatever DST held before.
//
// The archive is read with libarchive (ustar, pax and GNU tar; no compression)
// and every entry is written by this code, never by a tool, through
// descriptors: each directory on the way is opened from the one before with
// O_NOFOLLOW|O_DIRECTORY, so no symbolic link is ever followed, neither one
// the archive made earlier nor one DST held already (a first copy that left
// `x -> /etc` cannot make a second write `x/planted` into /etc: that entry is
// refused). Names are relative to DST: leading '/' and "./" are dropped, a
// ".." component refuses the archive. With `top`, every name must be `top` or
// below it (the copied file or directory's own name).
//
// What is kept: directories, regular files (sparse ones read whole), symbolic
// links (made as they are; their targets are never resolved here) and hard
// links to regular files this same archive made; modification times; the
// permission bits (0777) less `umask`. What is not: owners (the files belong
// to whoever runs this), set-user-ID, set-group-ID and sticky bits, xattrs and
// ACLs. Skipped, each with a line in untar_result::skipped: fifos, device
// nodes, and hard links to them. Refused (the copy stops with
// errc::invalid_argument naming the entry): a ".." component, a name outside
// `top`, an entry through a symbolic link or a non-directory, a hard link to
// anything but a regular file of this archive, an entry type dsec does not
// copy, and an archive libarchive cannot read.
//
// An existing directory of DST keeps its owner and mode; an existing file,
// symlink or other non-directory at an entry's name is replaced (unlinked,
// never written through), as tar does; an existing directory where the
// archive has a non-directory refuses it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

struct untar_result {
  uint64_t entries = 0;              ///< members read
  uint64_t files = 0;                ///< regular files written
  uint64_t bytes = 0;                ///< their size
  std::vector<std::string> skipped;  ///< "NAME (a fifo)", in archive order
  std::vector<std::string> warnings; ///< what libarchive warned about
};

/// Unpacks `archive` beneath the directory `dest_fd` (`dest_shown` names it
/// in messages). See above for what is kept, skipped and refused.
expected<untar_result> untar_beneath(int dest_fd, const std::string& dest_shown,
                                     std::string_view archive, mode_t umask,
                                     const std::string& top = {});

/// Where untar_stream reads the archive: the next piece (valid until the next
/// call), empty at the end; an error stops the unpacking with it.
using untar_reader = std::function<expected<std::string_view>()>;

/// The same, reading the archive as it comes (`dsec cp ID:PATH DST` streams
/// it). With `rename` (and `top`), the copied name `top` lands as `rename`
/// (`cp ID:/x/a.txt ./b.txt`), its entries below it likewise.
expected<untar_result> untar_stream(int dest_fd, const std::string& dest_shown,
                                    const untar_reader& read, mode_t umask,
                                    const std::string& top = {}, const std::string& rename = {});

} // namespace dsec
