// The default limits of a sandbox: derived from the machine and the node's size.
#include "runtime/defaults.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <string>

using dsec::derive_defaults;
using dsec::machine_resources;

namespace {
constexpr uint64_t mib = 1ull << 20, gib = 1ull << 30;
}

TEST_CASE("defaults: each admitted sandbox gets its share of the machine, within bounds") {
  // This machine's shape with dsecd's own defaults (3,200 slots): the floors.
  machine_resources small{24 * gib, 32768};
  auto d = derive_defaults(small, 3200, 1.0);
  CHECK(d.memory_bytes == 256 * mib);
  CHECK(d.pids == 512);
  CHECK(d.disk_bytes == 128 * mib);

  // A node sized for 16 sandboxes on a large machine: the shares.
  machine_resources big{64 * gib, 4194304};
  d = derive_defaults(big, 16, 1.0);
  CHECK(d.memory_bytes == 4 * gib);
  CHECK(d.pids == 4194304 * 3 / 4 / 16);
  CHECK(d.disk_bytes == 2 * gib);
  // Oversubscribed twice: half the share each.
  auto over = derive_defaults(big, 16, 2.0);
  CHECK(over.memory_bytes == 2 * gib);
  CHECK(over.pids == 4194304 * 3 / 4 / 32);
  // Fewer admitted than slots: more each.
  CHECK(*derive_defaults(big, 16, 0.5).memory_bytes == 8 * gib);

  // One slot: at most half the machine, never all of it.
  d = derive_defaults(big, 1, 1.0);
  CHECK(d.memory_bytes == 32 * gib);
  CHECK(d.pids == 4194304 / 2);
  CHECK(derive_defaults(big, 0, 1.0).memory_bytes == d.memory_bytes);

  // A tiny machine: half of it, below the floor.
  machine_resources tiny{256 * mib, 1024};
  d = derive_defaults(tiny, 8, 1.0);
  CHECK(d.memory_bytes == 128 * mib);
  CHECK(d.pids == 512);
  CHECK(d.disk_bytes == 64 * mib);
  // Whatever it is, validate() takes it.
  CHECK(d.as_limits().validate());
  CHECK(d.as_limits().any());
}

TEST_CASE("defaults: apply() fills only what a request leaves unset; describe() says it") {
  dsec::sandbox_defaults d;
  d.memory_bytes = 256 * mib;
  d.pids = 512;
  d.disk_bytes = 128 * mib;
  dsec::limits asked;
  asked.memory_bytes = 2 * gib;
  asked.cpus = 1;
  d.apply(asked);
  CHECK(asked.memory_bytes == 2 * gib);
  CHECK(asked.pids == 512);
  CHECK(asked.cpus == 1);
  CHECK(d.describe() == "memory 256 MiB, pids 512, disk 128 MiB");
  dsec::sandbox_defaults none;
  dsec::limits empty;
  none.apply(empty);
  CHECK_FALSE(empty.any());
  CHECK(none.describe() == "memory none, pids none, disk half of RAM");
}

TEST_CASE("defaults: probe() reads this machine") {
  auto m = machine_resources::probe();
  std::ifstream pm("/proc/sys/kernel/pid_max");
  uint64_t pid_max = 0;
  pm >> pid_max;
  CHECK(m.pid_max > 0);
  CHECK(m.pid_max <= pid_max);
  std::ifstream mi("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  mi >> key >> kb;
  REQUIRE(key == "MemTotal:");
  CHECK(m.memory_bytes > 0);
  CHECK(m.memory_bytes <= kb * 1024);
}
