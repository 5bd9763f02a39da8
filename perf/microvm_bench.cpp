// microvm_bench: the microvm backend's mechanism (runtime/microvm.hpp) against
// its peer, the container backend (a local `dsec run`), in the same run:
//   boot-to-ready of a microVM and the share of it that is the guest kernel,
//   the guest agent, and QEMU (its own setup and the channel);
//   create + exec `true` + destroy, microVM vs container;
//   memory per VM (QEMU's VmRSS after the exec; VmHWM too).
// A plain main: `microvm_bench --guest DIR [--rounds N]`. DIR is what
// tools/microvm-guest prints. It makes a temporary state dir with a busybox
// base (through $DSEC_BIN, default build/tools/dsec), removed at the end.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/microvm.hpp"
#include "runtime/store.hpp"

using namespace dsec;
using clk = std::chrono::steady_clock;

namespace {

int run(const std::vector<std::string>& argv) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> a;
    for (const auto& s : argv)
      a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

long status_kib(pid_t pid, const char* key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0)
      return std::atol(line.c_str() + std::strlen(key) + 1);
  return -1;
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  std::string guest_dir;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--guest" && i + 1 < argc)
      guest_dir = argv[++i];
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: microvm_bench --guest DIR [--rounds N]\n");
      return 2;
    }
  }
  auto guest = microvm_guest::in(guest_dir);
  if (!guest) {
    std::fprintf(stderr, "microvm_bench: %s\n", guest.error_value().message.c_str());
    return 2;
  }
  const char* dsec_env = std::getenv("DSEC_BIN");
  std::string dsec = dsec_env ? dsec_env : "build/tools/dsec";
  char tmpl[] = "/tmp/dsec-microvm-bench.XXXXXX";
  std::string root = ::mkdtemp(tmpl);
  std::string state = root + "/state", src = root + "/src";
  run({"/bin/mkdir", "-p", src + "/bin", src + "/proc", src + "/sys", src + "/dev", src + "/tmp"});
  run({"/bin/cp", "/bin/busybox", src + "/bin/busybox"});
  for (const char* app : {"sh", "true"})
    ::symlink("busybox", (src + "/bin/" + app).c_str());
  if (run({dsec, "--state", state, "layer", "build", "--kind", "base", "bb@1", src}) != 0) {
    std::fprintf(stderr, "microvm_bench: %s layer build failed\n", dsec.c_str());
    run({"/bin/rm", "-rf", root});
    return 1;
  }
  auto st = store::open(state);
  auto ref = parse_layer_ref("bb@1");
  auto lease = st->lease(*ref);
  if (!lease) {
    std::fprintf(stderr, "microvm_bench: %s\n", lease.error_value().message.c_str());
    return 1;
  }

  std::vector<double> vm_total, vm_boot, vm_kernel, vm_agent, vm_qemu, ct_total, rss, hwm;
  std::string accel;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = clk::now();
    microvm_options o;
    o.guest = *guest;
    o.layers = {lease->blob_path()};
    o.memory = 128ull << 20;
    auto vm = microvm::boot(o);
    if (!vm) {
      std::fprintf(stderr, "microvm_bench: boot: %s\n", vm.error_value().message.c_str());
      continue;
    }
    auto status = (*vm)->exec({"true"}, {}, {});
    rss.push_back(status_kib((*vm)->pid(), "VmRSS:") / 1024.0);
    hwm.push_back(status_kib((*vm)->pid(), "VmHWM:") / 1024.0);
    accel = to_string((*vm)->accel());
    const auto& t = (*vm)->boot_times();
    vm_boot.push_back(t.total_ms);
    vm_kernel.push_back(t.kernel_ms);
    vm_agent.push_back(t.agent_ms);
    vm_qemu.push_back(t.qemu_ms);
    vm->reset();
    vm_total.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    if (!status || *status != 0)
      std::fprintf(stderr, "microvm_bench: exec true failed\n");

    auto c0 = clk::now();
    int rc = run({dsec, "--state", state, "run", "--base", "bb@1", "--", "/bin/true"});
    ct_total.push_back(std::chrono::duration<double, std::milli>(clk::now() - c0).count());
    if (rc != 0)
      std::fprintf(stderr, "microvm_bench: dsec run exited %d\n", rc);
  }
  std::printf("microvm_bench: %d rounds, accel %s, medians\n", rounds, accel.c_str());
  std::printf("  microvm boot-to-ready        %9.1f ms  (kernel %.1f, agent %.1f, qemu+channel %.1f)\n",
              median(vm_boot), median(vm_kernel), median(vm_agent), median(vm_qemu));
  std::printf("  microvm create+exec+destroy  %9.1f ms\n", median(vm_total));
  std::printf("  container (dsec run) same    %9.1f ms\n", median(ct_total));
  std::printf("  microvm QEMU VmRSS           %9.1f MiB (VmHWM %.1f) at -m 128M\n", median(rss),
              median(hwm));
  lease = make_error(errc::closed, "done");
  run({"/bin/rm", "-rf", root});
  return 0;
}
