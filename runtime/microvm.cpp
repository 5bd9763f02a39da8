#include "runtime/microvm.hpp"

#include <fcntl.h>
#include <linux/kvm.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "runtime/sys.hpp"

extern char** environ;

namespace dsec {

namespace {

constexpr size_t console_keep = 8192;

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

expected<std::string> find_on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0)
      return name;
    return make_error(errc::not_found, "qemu '" + name + "' is not an executable file");
  }
  const char* path = ::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos)
      end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0)
      return cand;
    start = end + 1;
  }
  return make_error(errc::not_found, "no " + name + " on PATH (tools/setup installs qemu-system-x86)");
}

// The host's TSC in kHz, for tsc_early_khz=: under TCG the guest's calibration
// against the PIT hangs now and then without it.
std::string tsc_khz() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        double mhz = std::strtod(line.c_str() + colon + 1, nullptr);
        if (mhz > 0)
          return std::to_string(static_cast<long>(mhz * 1000));
      }
    }
  }
  return {};
}

bool cpu_has_virt() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" vmx") != std::string::npos || line.find(" svm") != std::string::npos;
  return false;
}

bool valid_hostname(const std::string& h) {
  if (h.size() > 63)
    return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.'))
      return false;
  return true;
}

} // namespace

expected<microvm_guest> microvm_guest::in(const std::string& dir) {
  microvm_guest g{dir + "/vmlinux", dir + "/initrd.cpio"};
  if (!file_exists(g.kernel) || !file_exists(g.initrd))
    return make_error(errc::not_found, "no microVM guest in " + dir +
                                           " (vmlinux and initrd.cpio: tools/microvm-guest builds them)");
  return g;
}

microvm_accel detect_accel() {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return microvm_accel::tcg;
  int v = ::ioctl(fd, KVM_GET_API_VERSION, 0);
  ::close(fd);
  return v == KVM_API_VERSION && cpu_has_virt() ? microvm_accel::kvm : microvm_accel::tcg;
}

const char* to_string(microvm_accel a) {
  switch (a) {
  case microvm_accel::kvm: return "kvm";
  case microvm_accel::tcg: return "tcg";
  default: return "auto";
  }
}

expected<std::unique_ptr<microvm>> microvm::boot(const microvm_options& opts) {
  if (opts.layers.empty())
    return make_error(errc::invalid_argument, "microvm: no layers (a base layer at least)");
  if (opts.layers.size() > microvm_options::max_layers)
    return make_error(errc::invalid_argument,
                      "microvm: " + std::to_string(opts.layers.size()) + " layers, at most " +
                          std::to_string(microvm_options::max_layers) +
                          " (virtio-mmio has 8 slots; a node merges the lowest ones first: runtime/microvm_disks.hpp)");
  if (opts.memory < (64ull << 20))
    return make_error(errc::invalid_argument,
                      "microvm: memory " + std::to_string(opts.memory) + " is below 64 MiB");
  if (opts.cpus < 1 || opts.cpus > 64)
    return make_error(errc::invalid_argument,
                      "microvm: cpus " + std::to_string(opts.cpus) + " is not in 1..64");
  if (!valid_hostname(opts.hostname))
    return make_error(errc::invalid_argument, "microvm: hostname '" + opts.hostname +
                                                  "' has characters other than letters, digits, '-' and '.'");
  for (const auto& l : opts.layers)
    if (!file_exists(l))
      return make_error(errc::not_found, "microvm: layer image " + l + " is not a file");
  if (!file_exists(opts.guest.kernel))
    return make_error(errc::not_found, "microvm: kernel " + opts.guest.kernel + " is not a file");
  if (!file_exists(opts.guest.initrd))
    return make_error(errc::not_found, "microvm: initrd " + opts.guest.initrd + " is not a file");

  std::unique_ptr<microvm> vm(new microvm());
  vm->accel_ = opts.accel == microvm_accel::automatic ? detect_accel() : opts.accel;
  error last;
  unsigned attempts = opts.attempts ? opts.attempts : 1;
  for (unsigned a = 1; a <= attempts; ++a) {
    vm->times_ = {};
    vm->times_.attempts = a;
    auto started = vm->start_once(opts);
    if (!started)
      return std::move(started).error_value(); // QEMU could not start: no retry helps
    auto ready = vm->wait_ready(opts.boot_timeout, opts.cancel);
    if (ready)
      return vm;
    last = std::move(ready).error_value();
    vm->kill_qemu();
    if (last.code != errc::timeout || (opts.cancel && opts.cancel->load()))
      break; // the guest said why: another try says the same
  }
  return last;
}

expected<void> microvm::start_once(const microvm_options& opts) {
  DSEC_TRY(qemu, find_on_path(opts.qemu));
  int agent[2], con[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, agent) != 0)
    return sys_error("socketpair", "microvm agent channel");
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con) != 0) {
    ::close(agent[0]);
    ::close(agent[1]);
    return sys_error("socketpair", "microvm console");
  }
  channel_.reset(agent[0]);
  unique_fd guest_agent(agent[1]);
  console_.reset(con[0]);
  unique_fd guest_console(con[1]);
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ::fcntl(channel_.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(console_.get(), F_SETFL, O_NONBLOCK);
  in_.clear();
  out_.clear();
  console_tail_.clear();

  std::string machine = "microvm,x-option-roms=off,isa-serial=off,rtc=on,pit=on";
  std::string append = "console=hvc0 quiet panic=-1 dsec.layers=" + std::to_string(opts.layers.size());
  if (opts.disk)
    append += " dsec.disk=" + std::to_string(opts.disk);
  if (!opts.hostname.empty())
    append += " dsec.hostname=" + opts.hostname;
  if (accel_ == microvm_accel::tcg) {
    auto khz = tsc_khz();
    if (!khz.empty())
      append += " tsc_early_khz=" + khz;
  }
  std::vector<std::string> args = {
      qemu, "-M", machine, "-accel", accel_ == microvm_accel::kvm ? "kvm" : "tcg,tb-size=128",
      "-m", std::to_string(opts.memory >> 20) + "M", "-smp", std::to_string(opts.cpus),
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
      "-kernel", opts.guest.kernel, "-initrd", opts.guest.initrd, "-append", append,
      "-chardev", "socket,id=agent,fd=3", "-chardev", "socket,id=con,fd=4",
      "-device", "virtio-serial-device", "-device", "virtconsole,chardev=con",
      "-device", std::string("virtserialport,chardev=agent,name=") + VM_PORT_NAME};
  if (accel_ == microvm_accel::kvm)
    args.insert(args.end(), {"-cpu", "host"});
  for (size_t i = 0; i < opts.layers.size(); ++i) {
    // The image file itself is the disk; file.locking=off: other VMs and the
    // host's own mounts read the same file.
    args.insert(args.end(),
                {"-drive", "file=" + opts.layers[i] +
                               ",if=none,format=raw,readonly=on,file.locking=off,id=l" + std::to_string(i),
                 "-device", "virtio-blk-device,drive=l" + std::to_string(i) +
                                ",serial=" VM_LAYER_SERIAL_PREFIX + std::to_string(i)});
  }
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  // QEMU's cgroup, fresh for each attempt (the last one's went with its QEMU).
  cgroup_.reset();
  std::vector<int> join;
  if (opts.cgroups) {
    auto cg = opts.cgroups->create(opts.cgroup_name, opts.qemu_limits());
    if (!cg)
      return std::move(cg).error_value().in_step("microvm cgroup");
    cgroup_.emplace(std::move(*cg));
    join = cgroup_->join_fds();
  }

  pid_t parent = ::getpid();
  started_ = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid < 0)
    return sys_error("fork", qemu);
  if (pid == 0) {
    // Only async-signal-safe calls from here.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(127);
    // Into QEMU's cgroup before anything of QEMU runs (its threads follow).
    for (int fd : join)
      if (::write(fd, "0", 1) != 1)
        ::_exit(126);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(guest_console.get(), 1);
    ::dup2(guest_console.get(), 2);
    ::dup2(guest_agent.get(), 3);
    ::dup2(guest_console.get(), 4);
    sys::close_range(5, ~0U, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  pid_ = pid;
  pidfd_.reset(sys::pidfd_open(pid, 0));
  if (cgroup_)
    cgroup_->close_join_fds();
  return {};
}

void microvm::kill_qemu() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  cgroup_.reset(); // empty now: removed (or back in the pool)
  pidfd_.reset();
  channel_.reset();
  console_.reset();
}

microvm::~microvm() { kill_qemu(); }

limits microvm_options::qemu_limits() const {
  limits l;
  l.memory_bytes = memory + qemu_overhead;
  l.pids = 256;
  l.cpus = static_cast<double>(cpus);
  return l;
}

std::vector<std::string> microvm::cgroup_paths() const {
  return cgroup_ ? cgroup_->paths() : std::vector<std::string>{};
}

std::string microvm::console_tail() const { return console_tail_; }

void microvm::read_console() {
  char buf[4096];
  for (;;) {
    ssize_t r = ::read(console_.get(), buf, sizeof buf);
    if (r <= 0)
      return;
    console_tail_.append(buf, static_cast<size_t>(r));
    if (console_tail_.size() > console_keep)
      console_tail_.erase(0, console_tail_.size() - console_keep);
  }
}

size_t microvm::queued() const {
  std::lock_guard lock(out_mutex_);
  return out_.size();
}

void microvm::queue(uint16_t type, uint32_t id, std::string_view a, std::string_view b,
                    uint16_t flags) {
  vm_frame f{VM_MAGIC, static_cast<uint32_t>(a.size() + b.size()), type, flags, id};
  {
    std::lock_guard lock(out_mutex_);
    out_.append(reinterpret_cast<const char*>(&f), sizeof f);
    out_.append(a);
    out_.append(b);
  }
  wake();
}

void microvm::wake() {
  if (wake_) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
}

std::string microvm::exec_payload(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env, const std::string& cwd,
                                  const vm_credentials& who) {
  std::string p;
  uint32_t argc = static_cast<uint32_t>(argv.size()), envc = static_cast<uint32_t>(env.size());
  auto ngroups = static_cast<uint32_t>(std::min<size_t>(who.groups.size(), VM_MAX_GROUPS));
  for (uint32_t v : {argc, envc, who.uid, who.gid, ngroups})
    p.append(reinterpret_cast<const char*>(&v), 4);
  for (uint32_t i = 0; i < ngroups; ++i)
    p.append(reinterpret_cast<const char*>(&who.groups[i]), 4);
  p.append(cwd);
  p.push_back('\0');
  for (const auto& a : argv) {
    p.append(a);
    p.push_back('\0');
  }
  for (const auto& e : env) {
    p.append(e);
    p.push_back('\0');
  }
  return p;
}

expected<void> microvm::pump(int timeout_ms, const std::function<void(frame&&)>& on_frame) {
  if (!channel_)
    return make_error(errc::sandbox_failed, "microvm: QEMU is not running");
  bool pending;
  {
    std::lock_guard lock(out_mutex_);
    pending = !out_.empty();
  }
  pollfd pf[4] = {{channel_.get(), static_cast<short>(POLLIN | (pending ? POLLOUT : 0)), 0},
                  {console_.get(), POLLIN, 0},
                  {wake_.get(), POLLIN, 0},
                  {pidfd_.get(), POLLIN, 0}};
  int n = ::poll(pf, 4, timeout_ms);
  if (n < 0 && errno != EINTR)
    return sys_error("poll", "microvm channel");
  if (pf[2].revents) {
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof v);
  }
  if (pf[1].revents)
    read_console();
  // Send what is queued, as far as the channel takes it now.
  {
    std::lock_guard lock(out_mutex_);
    while (!out_.empty()) {
      ssize_t w = ::send(channel_.get(), out_.data(), out_.size(), MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EINTR)
          break;
        return sys_error("send", "microvm agent channel");
      }
      out_.erase(0, static_cast<size_t>(w));
    }
  }
  if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
    char buf[65536];
    for (;;) {
      ssize_t r = ::read(channel_.get(), buf, sizeof buf);
      if (r > 0) {
        in_.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR)
        continue;
      break; // EAGAIN; EOF comes with QEMU's exit, which pidfd reports
    }
    while (in_.size() >= sizeof(vm_frame)) {
      vm_frame f;
      std::memcpy(&f, in_.data(), sizeof f);
      if (f.magic != VM_MAGIC || f.len > VM_MAX_PAYLOAD)
        return make_error(errc::sandbox_failed, "microvm: the guest sent a malformed frame");
      if (in_.size() < sizeof f + f.len)
        break;
      frame fr{f.type, f.flags, f.id, in_.substr(sizeof f, f.len)};
      in_.erase(0, sizeof f + f.len);
      on_frame(std::move(fr));
    }
  }
  if (pf[3].revents) {
    read_console();
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    channel_.reset();
    std::string why = WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                                    : "was killed by signal " + std::to_string(WTERMSIG(st));
    return make_error(errc::sandbox_failed, "microvm: QEMU " + why + "; console: " + console_tail_);
  }
  return {};
}

expected<void> microvm::wait_ready(std::chrono::milliseconds timeout,
                                   const std::atomic<bool>* cancel) {
  auto deadline = started_ + timeout;
  bool ready = false;
  std::string failed;
  vm_ready r{};
  while (!ready && failed.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return make_error(errc::timeout, "microvm: the guest was not ready after " +
                                           std::to_string(timeout.count()) + " ms; console: " +
                                           console_tail_);
    if (cancel && cancel->load())
      return make_error(errc::closed, "microvm: the boot was cancelled");
    DSEC_TRY_VOID(pump(static_cast<int>(std::min<long>(left.count(), 200)), [&](frame&& f) {
      if (f.type == VM_READY && f.payload.size() >= sizeof r) {
        std::memcpy(&r, f.payload.data(), sizeof r);
        ready = true;
      } else if (f.type == VM_BOOT_FAILED) {
        failed = f.payload;
      }
    }));
  }
  if (!failed.empty())
    return make_error(errc::sandbox_failed, "microvm: the guest failed to boot: " + failed);
  times_.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              started_)
                        .count();
  times_.kernel_ms = r.agent_start_ms;
  times_.agent_ms = r.root_ms > r.agent_start_ms ? r.root_ms - r.agent_start_ms : 0;
  times_.qemu_ms = times_.total_ms > r.root_ms ? times_.total_ms - r.root_ms : 0;
  return {};
}

expected<microvm::frame> microvm::wait_for(uint32_t id,
                                           const std::function<bool(frame&)>& keep_going) {
  bool done = false;
  frame last;
  while (!done) {
    DSEC_TRY_VOID(pump(-1, [&](frame&& f) {
      if (done || f.id != id)
        return;
      if (!keep_going(f)) {
        done = true;
        last = std::move(f);
      }
    }));
  }
  return last;
}

namespace {
error guest_error(std::string_view what, const std::string& payload) {
  int32_t e = 0;
  if (payload.size() >= 4)
    std::memcpy(&e, payload.data(), 4);
  std::string text = payload.size() > 4 ? payload.substr(4) : std::string(std::strerror(e));
  errc code = e == ENOENT ? errc::not_found : e == EINVAL ? errc::invalid_argument : errc::system_error;
  auto err = make_error(code, std::string(what) + ": " + text);
  err.sys_errno = e;
  return err;
}
} // namespace

expected<int> microvm::exec(const std::vector<std::string>& argv, std::string_view input,
                            const output_fn& out, const std::vector<std::string>& env,
                            const std::string& cwd) {
  if (argv.empty())
    return make_error(errc::invalid_argument, "microvm exec: an empty command");
  uint32_t id = next_id();
  queue(VM_EXEC, id, exec_payload(argv, env, cwd));
  // Stdin in frames of at most 64 KiB, then an empty one: EOF.
  for (size_t off = 0; off < input.size(); off += 65536)
    queue(VM_STDIN, id, input.substr(off, 65536));
  queue(VM_STDIN, id, {});
  int status = -1;
  std::string failed;
  bool have_failed = false;
  DSEC_TRY(last, wait_for(id, [&](frame& f) {
    if (f.type == VM_OUTPUT) {
      if (out)
        out(f.flags, f.payload);
      return true;
    }
    if (f.type == VM_STARTED)
      return true;
    if (f.type == VM_DONE) {
      have_failed = true;
      failed = f.payload;
      return false;
    }
    return f.type != VM_EXITED;
  }));
  if (have_failed)
    return guest_error("microvm exec " + argv[0], failed);
  if (last.payload.size() >= 4)
    std::memcpy(&status, last.payload.data(), 4);
  return status;
}

expected<void> microvm::put_file(const std::string& path, std::string_view content, uint32_t mode) {
  if (sizeof(uint32_t) + path.size() + 1 + content.size() > VM_MAX_PAYLOAD)
    return make_error(errc::too_large, "microvm put " + path + ": over " +
                                           std::to_string(VM_MAX_PAYLOAD) + " bytes");
  uint32_t id = next_id();
  std::string head(reinterpret_cast<const char*>(&mode), 4);
  head += path;
  head.push_back('\0');
  queue(VM_PUT, id, head, content);
  DSEC_TRY(last, wait_for(id, [](frame& f) { return f.type != VM_DONE; }));
  int32_t e = 0;
  if (last.payload.size() >= 4)
    std::memcpy(&e, last.payload.data(), 4);
  if (e != 0)
    return guest_error("microvm put " + path, last.payload);
  return {};
}

expected<std::string> microvm::get_file(const std::string& path) {
  uint32_t id = next_id();
  queue(VM_GET, id, std::string(path) + '\0');
  std::string data;
  DSEC_TRY(last, wait_for(id, [&](frame& f) {
    if (f.type == VM_DATA) {
      data += f.payload;
      return true;
    }
    return f.type != VM_DONE;
  }));
  int32_t e = 0;
  if (last.payload.size() >= 4)
    std::memcpy(&e, last.payload.data(), 4);
  if (e != 0)
    return guest_error("microvm get " + path, last.payload);
  return data;
}

} // namespace dsec
