// pack_bench: what a pack of a typical writable layer costs, runtime/pack.hpp
// alone (no daemon, no actors): F files of 10 KiB in directories of 50, on a
// tmpfs like a sandbox's upper dir (/dev/shm), blobs on the disk of $TMPDIR
// (fsync is real there).
//
//   build/perf/pack_bench [--files F] [--rounds R]
//
// Per round, the median over R rounds is printed:
//   first      a pack of the fresh tree: every file read, every blob new
//   unchanged  the same tree again: every file found in the cache
//   touched    after 10 files were rewritten (same size, new content)
//   restore    the last pack restored into a fresh tmpfs directory
// Needs nothing but write access to /dev/shm and $TMPDIR; leaves nothing.
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/pack.hpp"

namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

std::string make_temp(const std::string& parent, const char* prefix) {
  std::string templ = parent + "/" + prefix + "XXXXXX";
  if (!::mkdtemp(templ.data())) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return templ;
}

void write_file(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

// Makes `content` unique: a tag over its first bytes (the size stays).
void stamp(std::string& content, const char* fmt, int a, int b) {
  char tag[48];
  int n = std::snprintf(tag, sizeof tag, fmt, a, b);
  std::memcpy(content.data(), tag, static_cast<size_t>(std::min(n, 47)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  int files = 1000, rounds = 9;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--files" && i + 1 < argc)
      files = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: pack_bench [--files F] [--rounds R]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::vector<double> first, unchanged, touched, restore;
  for (int r = 0; r < rounds; ++r) {
    auto up = make_temp("/dev/shm", "dsec-pack-bench-up.");
    auto state = make_temp(tmpdir ? tmpdir : "/tmp", "dsec-pack-bench-state.");
    std::string content(10 << 10, 'x');
    for (int i = 0; i < files; ++i) {
      auto dir = up + "/d" + std::to_string(i / 50);
      fs::create_directories(dir);
      stamp(content, "file %d round %d", i, r);
      write_file(dir + "/f" + std::to_string(i), content);
    }
    // Older than the pack's "racy" window, as files written a step earlier are.
    ::usleep(100 * 1000);
    int ufd = ::open(up.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    dsec::pack_cache cache;
    auto blobs = state + "/blobs";
    auto t0 = clk::now();
    auto a = dsec::write_pack(ufd, state + "/p1", blobs, cache, 0);
    first.push_back(ms_since(t0));
    t0 = clk::now();
    auto b = dsec::write_pack(ufd, state + "/p2", blobs, cache, 0);
    unchanged.push_back(ms_since(t0));
    for (int i = 0; i < 10; ++i) {
      stamp(content, "file %d touched %d", i * 7 % files, r);
      write_file(up + "/d" + std::to_string(i * 7 % files / 50) + "/f"
                   + std::to_string(i * 7 % files),
                 content);
    }
    t0 = clk::now();
    auto c = dsec::write_pack(ufd, state + "/p3", blobs, cache, 0);
    touched.push_back(ms_since(t0));
    ::close(ufd);
    if (!a || !b || !c) {
      std::fprintf(stderr, "pack_bench: %s\n",
                   (!a ? a.error_value() : !b ? b.error_value() : c.error_value())
                     .to_string()
                     .c_str());
      return 1;
    }
    auto dest = make_temp("/dev/shm", "dsec-pack-bench-dest.");
    int dfd = ::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    t0 = clk::now();
    auto rs = dsec::restore_pack(state + "/p3", blobs, dfd, 0);
    restore.push_back(ms_since(t0));
    ::close(dfd);
    if (!rs) {
      std::fprintf(stderr, "pack_bench: %s\n", rs.error_value().to_string().c_str());
      return 1;
    }
    for (const auto& d : {up, state, dest})
      fs::remove_all(d);
  }
  std::printf("pack of %d files of 10 KiB (median of %d rounds):\n", files, rounds);
  std::printf("  first (all read, all new blobs)   %8.2f ms\n", median(first));
  std::printf("  unchanged (all cached)            %8.2f ms\n", median(unchanged));
  std::printf("  10 files rewritten                %8.2f ms\n", median(touched));
  std::printf("  restore into a fresh dir          %8.2f ms\n", median(restore));
  return 0;
}
