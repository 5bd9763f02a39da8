// microvm_disks: a microVM's disks when its environment has more layer images
// than a VM has disk slots (microvm_options::max_layers: virtio-mmio has 8
// slots and the channel takes one).
//
// The topmost images stay disks of their own; the lowest ones are merged into
// one EROFS image (store::flatten: their overlay, whiteouts applied), which
// becomes the lowest disk. A merged image is made once per node for each set
// of images (keyed by their paths, which are content-addressed blobs) and
// shared by every VM that uses that set; two VMs that need the same one at
// once make it once (the second waits).
//
// Where: STATE/microvm-disks/PID-START/ (this process's id and start time).
// Nothing else uses that directory: it is removed when the object is
// destroyed (the node stopping), and a directory whose process is gone (a
// killed daemon) is removed when the next one opens its own. A running VM
// keeps its open image even so.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

class store;

class microvm_disks {
public:
  /// Makes this process's directory below `st`'s; removes those of processes
  /// that are gone (each named in `collected`, for the log).
  static expected<std::unique_ptr<microvm_disks>> open(const store& st,
                                                       std::vector<std::string>* collected = nullptr);
  ~microvm_disks();
  microvm_disks(const microvm_disks&) = delete;
  microvm_disks& operator=(const microvm_disks&) = delete;

  /// `images` (topmost first) as at most `slots` disks, topmost first: itself
  /// when it fits; else its first slots - 1 images and one merged image of
  /// the rest (made now, or found). Errors name the images being merged.
  expected<std::vector<std::string>> fit(const std::vector<std::string>& images, size_t slots);

  /// Merged images made so far (each is one file in dir()).
  [[nodiscard]] size_t made() const;
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

private:
  microvm_disks(const store& st, std::string dir) : store_(st), dir_(std::move(dir)) {}

  const store& store_;
  std::string dir_;
  mutable std::mutex mutex_;
  std::condition_variable built_;
  std::map<std::string, std::string> ready_; // key -> image path
  std::set<std::string> building_;
  unsigned next_tmp_ = 0;
};

} // namespace dsec
