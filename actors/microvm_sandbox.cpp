#include "actors/microvm_sandbox.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "actors/exec_command.hpp"
#include "actors/sandbox.hpp"
#include "actors/transfer_command.hpp"
#include "actors/types.hpp"
#include "runtime/builder.hpp"
#include "runtime/clock.hpp"
#include "runtime/engine.hpp"
#include "runtime/freezer.hpp"
#include "runtime/image_config.hpp"
#include "runtime/microvm.hpp"
#include "runtime/microvm_disks.hpp"
#include "runtime/mount.hpp"
#include "runtime/usage.hpp"

namespace dsec {

namespace {

using clock_type = std::chrono::steady_clock;

// What the worker thread tells the actor, in order.
// What a VM's commands take from its base image (docs/images.md, "The image
// config"), read on the host from the base's own blobs before the VM boots:
// never from the guest, whose tree is the agent's.
struct vm_image {
  command_defaults defaults;
  user_files users; // its etc/passwd and etc/group, for commands naming a user
};

// The base layer's config and user files: each of its images (an OCI image has
// several, topmost first) mounted on the host, detached and read-only, for as
// long as it takes to read two files (nothing is attached anywhere; the mounts
// go with their descriptors).
expected<vm_image> read_vm_image(const layer_lease& base) {
  vm_image out;
  std::vector<layer_mount> mounts;
  for (const auto& path : base.blob_paths()) {
    auto m = layer_mount::open(path, -1);
    if (!m)
      return std::move(m).error_value();
    out.users.add_lower(m->dir_fd());
    mounts.push_back(std::move(*m));
  }
  auto d = command_defaults::of(base.info().config,
                                [&]() -> std::optional<std::string> { return out.users.passwd; });
  if (!d)
    return std::move(d).error_value();
  out.defaults = std::move(*d);
  return out;
}

struct vm_event {
  enum class kind { ready, failed, frame } what;
  error err;
  microvm::frame f;
  microvm_boot_times times;
  std::string accel;
  std::vector<std::string> cgroups; // ready: QEMU's cgroup directories (pause freezes them)
  // ready: what commands leave out, from the base image, and its users.
  std::shared_ptr<const vm_image> image;
};

// The node's merged disks (runtime/microvm_disks.hpp), shared by its VMs'
// workers: opened when the backend is made (collecting what a killed daemon
// left), removed when the last holder goes.
struct vm_disks {
  std::unique_ptr<microvm_disks> disks;
  error why; // why there are none
};

// One VM's thread: lease, boot, pump; destroy on stop. Shared by the actor
// and the thread; the thread holds it until it has reaped QEMU.
class vm_worker : public std::enable_shared_from_this<vm_worker> {
public:
  vm_worker(sandbox_actor owner, microvm_options opts, engine* eng, environment env,
            std::shared_ptr<vm_disks> disks)
    : owner_(std::move(owner)), opts_(std::move(opts)), eng_(eng), store_(&eng->layers()),
      env_(std::move(env)), disks_(std::move(disks)) {}

  void start() {
    auto self = shared_from_this();
    std::thread([self] { self->run(); }).detach();
  }

  // From the actor: never blocks on the guest.
  void queue(uint16_t type, uint32_t id, std::string_view a, std::string_view b = {}) {
    std::lock_guard lock(mutex_);
    if (vm_)
      vm_->queue(type, id, a, b);
  }

  void stop() {
    stop_ = true;
    std::lock_guard lock(mutex_);
    if (vm_)
      vm_->wake();
  }

  std::deque<vm_event> take() {
    std::lock_guard lock(mutex_);
    std::deque<vm_event> out;
    out.swap(events_);
    return out;
  }

  pid_t qemu_pid() const { return pid_.load(); }

  // Bytes queued for the guest and not yet written (stdin's back-pressure).
  size_t queued() {
    std::lock_guard lock(mutex_);
    return vm_ ? vm_->queued() : 0;
  }

private:
  void post_failed(error e) {
    vm_event ev{};
    ev.what = vm_event::kind::failed;
    ev.err = std::move(e);
    post(std::move(ev));
  }

  void post(vm_event ev) {
    bool first;
    {
      std::lock_guard lock(mutex_);
      first = events_.empty();
      events_.push_back(std::move(ev));
    }
    if (first)
      caf::anon_send(owner_, event_atom::value, process_key());
  }

  void run() {
    run_vm();
    // Gone: QEMU reaped, the layers' leases released.
    caf::anon_send(owner_, reaped_atom::value, process_key());
    owner_ = nullptr;
  }

  void run_vm() {
    // The layers' leases (store::remove refuses them while held) for as long
    // as the VM runs; their images are the VM's disks.
    auto leases = lease_layers(*store_, env_);
    if (!leases) {
      post_failed(std::move(leases).error_value().in_step("lease_layers"));
      return;
    }
    for (const auto& l : *leases)
      for (const auto& p : l.blob_paths())
        opts_.layers.push_back(p);
    if (opts_.layers.size() > microvm_options::max_layers) {
      // More images than disk slots: the lowest ones as one merged disk.
      if (!disks_->disks) {
        post_failed(disks_->why.in_step("merge_disks"));
        return;
      }
      auto fit = disks_->disks->fit(opts_.layers, microvm_options::max_layers);
      if (!fit) {
        post_failed(std::move(fit).error_value());
        return;
      }
      opts_.layers = std::move(*fit);
    }
    if (leases->empty()) {
      post_failed(make_error(errc::invalid_argument, "no base layer"));
      return;
    }
    auto image = read_vm_image(leases->back());
    if (!image) {
      post_failed(std::move(image).error_value().in_step("image_config"));
      return;
    }
    opts_.cancel = &stop_;
    // QEMU in a cgroup of its own, bounded by the guest's size (microvm.hpp).
    auto cgroups = eng_->cgroups();
    if (!cgroups) {
      post_failed(std::move(cgroups).error_value().in_step("microvm_cgroup"));
      return;
    }
    opts_.cgroups = *cgroups;
    auto vm = microvm::boot(opts_);
    if (!vm) {
      post_failed(std::move(vm).error_value().in_step("boot_microvm"));
      return;
    }
    pid_ = (*vm)->pid();
    {
      std::lock_guard lock(mutex_);
      vm_ = vm->get();
    }
    vm_event ready{};
    ready.what = vm_event::kind::ready;
    ready.times = (*vm)->boot_times();
    ready.accel = to_string((*vm)->accel());
    ready.cgroups = (*vm)->cgroup_paths();
    ready.image = std::make_shared<const vm_image>(std::move(*image));
    post(std::move(ready));
    while (!stop_) {
      auto r = vm_->pump(-1, [&](microvm::frame&& f) {
        vm_event ev{};
        ev.what = vm_event::kind::frame;
        ev.f = std::move(f);
        post(std::move(ev));
      });
      if (!r) {
        post_failed(std::move(r).error_value());
        break;
      }
    }
    {
      std::lock_guard lock(mutex_);
      vm_ = nullptr;
    }
    vm->reset(); // SIGKILL and reap QEMU
  }

  sandbox_actor owner_;
  microvm_options opts_;
  engine* eng_;
  store* store_;
  environment env_;
  std::shared_ptr<vm_disks> disks_;
  std::atomic<bool> stop_{false};
  std::atomic<pid_t> pid_{-1};
  std::mutex mutex_;
  microvm* vm_ = nullptr; // while it runs (guarded by mutex_)
  std::deque<vm_event> events_;
};

enum class phase : uint8_t { creating, ready, destroying };

// A stdin piece waiting for room (the guest's channel holds stdin_buffer).
struct vm_stdin_wait {
  std::string data;
  bool close = false;
  caf::typed_response_promise<uint64_t> rp;
};

struct vm_exec {
  caf::typed_response_promise<exec_result> rp;
  // Instead of rp, when set: the whole-buffer put and get take the result.
  std::function<void(expected<exec_result>)> done;
  caf::strong_actor_ptr listener; // gets output_chunk when streaming, and a handle's id
  bool stream = false;
  bool detach = false;
  bool handle = false;       // exec_request.handle: its id goes to the listener at start
  bool open_stdin = false;   // its stdin stays open for the stdin verb
  std::string prog;          // argv[0], for the error when it cannot start
  bool stdin_closed = false; // the end was sent (or it was never open)
  std::deque<vm_stdin_wait> stdin_waiting;
  // A transfer (exec_request.transfer): its tar's end read as put's or get's
  // (transfer_outcome); a get's stderr collected, its first transfer_hold_back
  // bytes held until there are more or tar ended well (a failed get sends none).
  std::optional<exec_request> transfer;
  bool flowing = false;
  bool timed_out = false;
  bool truncated = false;
  uint64_t max_output = 0;
  std::string out, err;
  clock_type::time_point t0;
};

// What a command's stdin waiters hear when it can take no more.
void fail_stdin_waiters(vm_exec& x, const std::string& why) {
  for (auto& w : x.stdin_waiting)
    w.rp.deliver(to_caf(make_error(errc::closed, why)));
  x.stdin_waiting.clear();
}

// Gives command `x` its result: to its done function, else its promise.
void end_exec(vm_exec& x, expected<exec_result> r) {
  if (x.done)
    return x.done(std::move(r));
  if (r)
    x.rp.deliver(std::move(*r));
  else
    x.rp.deliver(to_caf(std::move(r).error_value()));
}

struct vm_state {
  static inline const char* name = "dsec.microvm_sandbox";

  sandbox_config cfg;
  std::shared_ptr<const microvm_node_config> node;
  std::shared_ptr<vm_worker> worker;
  phase ph = phase::creating;
  uint64_t created_ms = 0;
  clock_type::time_point expires{};
  uint64_t ttl_setting = 0;
  bool creation_failed_told = false;
  bool reaped = false;
  uint32_t next_id = 0;
  std::map<uint32_t, vm_exec> execs;
  std::vector<caf::typed_response_promise<bool>> destroy_waiters;
  // pause: QEMU's cgroup frozen (every vCPU and device thread stops, so does
  // the guest's clock), the TTL clock stopped.
  std::vector<std::string> cgroups;
  std::shared_ptr<const vm_image> image; // from ready on
  std::optional<sandbox_freezer> freezer; // opened at the first pause
  bool paused = false;
  uint64_t ttl_left_ms = 0; // while paused
  // A warm pool's (cfg.pooled), booted before anyone asked, until a create
  // claims it: nobody's, so it refuses every command, and has no TTL yet.
  bool pooled = false;
};

using self_ptr = sandbox_actor::stateful_pointer<vm_state>;

void finish_destroy(self_ptr self) {
  auto& s = self->state;
  if (s.freezer) { // QEMU is reaped: its freezer cgroup (v1) goes
    (void) s.freezer->destroy();
    s.freezer.reset();
  }
  if (s.paused)
    self->send(s.cfg.node, pause_atom::value, process_key(), s.cfg.id, false);
  s.paused = false;
  for (auto& [id, x] : s.execs) {
    fail_stdin_waiters(x, "sandbox " + s.cfg.id + " was destroyed");
    if (!x.detach)
      end_exec(x, make_error(errc::sandbox_failed, "sandbox " + s.cfg.id + " was destroyed"));
  }
  s.execs.clear();
  if (s.pooled) // nobody's: only its node hears
    self->send(s.cfg.node, gone_atom::value, process_key(), s.cfg.id, s.created_ms != 0);
  else
    tell_end(self, s.cfg.key, s.cfg.session, s.cfg.node, s.cfg.id, s.cfg.request,
             s.created_ms != 0, s.creation_failed_told);
  for (auto& rp : s.destroy_waiters)
    rp.deliver(true);
  s.destroy_waiters.clear();
  self->quit();
}

void begin_destroy(self_ptr self) {
  auto& s = self->state;
  if (s.ph == phase::destroying)
    return;
  s.ph = phase::destroying;
  // A frozen task takes its SIGKILL only once thawed (v1): thaw first, so the
  // worker's kill and reap of QEMU go through.
  if (s.freezer && s.freezer->frozen())
    (void) s.freezer->thaw();
  s.worker->stop(); // the worker kills QEMU and then sends reaped_atom
  if (s.reaped)
    finish_destroy(self);
}

void fail_creation(self_ptr self, const error& e) {
  auto& s = self->state;
  s.creation_failed_told = true;
  if (s.pooled) {
    std::printf("dsecd: microvm %s (warm pool) failed to boot: %s\n", s.cfg.id.c_str(),
                e.to_string().c_str());
    std::fflush(stdout);
  } else {
    self->send(s.cfg.session, failed_atom::value, s.cfg.key, to_caf(e), s.cfg.request);
  }
  begin_destroy(self);
}

// The TTL clock of a sandbox just handed to its caller.
void start_ttl(self_ptr self) {
  auto& s = self->state;
  if (s.cfg.env.ttl_ms == 0)
    return;
  ++s.ttl_setting;
  s.expires = clock_type::now() + std::chrono::milliseconds(s.cfg.env.ttl_ms);
  self->delayed_send(self, std::chrono::milliseconds(s.cfg.env.ttl_ms), ttl_atom::value,
                     process_key(), s.ttl_setting);
}

void on_frame(self_ptr self, microvm::frame& f) {
  auto& s = self->state;
  auto it = s.execs.find(f.id);
  if (it == s.execs.end())
    return;
  auto& x = it->second;
  switch (f.type) {
    case VM_STARTED:
      if (x.handle && x.listener) // its id, for the stdin and signal verbs
        caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                       output_chunk{s.cfg.id, f.id, 0, {}});
      if (x.detach) {
        end_exec(x, exec_result{});
        // Nobody collects a detached command's output: forget it (its later
        // frames find no entry and are dropped).
        s.execs.erase(it);
      }
      return;
    case VM_OUTPUT: {
      uint8_t stream = f.flags == 2 ? 2 : 1;
      if (x.transfer && x.transfer->transfer == transfer_get && stream == 1 && !x.flowing) {
        if (x.out.size() + f.payload.size() < transfer_hold_back) {
          x.out += f.payload;
          return;
        }
        x.flowing = true; // enough to be an archive: what was held goes first
        f.payload.insert(0, x.out);
        x.out.clear();
      }
      // (a transfer's stderr is collected for its error, never streamed)
      if (x.stream && x.listener && !(x.transfer && stream == 2)) {
        caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                       output_chunk{s.cfg.id, f.id, stream, std::move(f.payload)});
        return;
      }
      auto& buf = stream == 1 ? x.out : x.err;
      if (buf.size() + f.payload.size() > x.max_output) {
        x.truncated = true;
        buf.append(f.payload, 0, x.max_output > buf.size() ? x.max_output - buf.size() : 0);
      } else {
        buf += f.payload;
      }
      return;
    }
    case VM_EXITED: {
      int32_t st = 0;
      if (f.payload.size() >= 4)
        std::memcpy(&st, f.payload.data(), 4);
      exec_result r;
      if (WIFEXITED(st))
        r.exit_code = WEXITSTATUS(st);
      else if (WIFSIGNALED(st)) {
        r.signal = WTERMSIG(st);
        r.exit_code = 128 + r.signal;
      }
      r.timed_out = x.timed_out;
      r.truncated = x.truncated;
      if (x.transfer && x.transfer->transfer == transfer_get && !x.flowing) {
        // Its whole archive was held back: out now, before the end, if tar succeeded.
        if (r.exit_code == 0 && !r.timed_out && !x.out.empty() && x.listener)
          caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                         output_chunk{s.cfg.id, f.id, 1, std::move(x.out)});
        x.out.clear();
      }
      r.out = std::move(x.out);
      r.err = std::move(x.err);
      r.duration_us = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - x.t0).count());
      fail_stdin_waiters(x, "the stdin of command " + std::to_string(f.id) + " in sandbox "
                              + s.cfg.id + " is closed (the command ended)");
      if (x.transfer)
        end_exec(x, transfer_outcome(*x.transfer, std::move(r)));
      else
        end_exec(x, std::move(r));
      s.execs.erase(it);
      return;
    }
    case VM_DONE: { // it could not start
      int32_t e = 0;
      if (f.payload.size() >= 4)
        std::memcpy(&e, f.payload.data(), 4);
      // Worded as a container's (container::describe_exec_failure).
      // (the guest's own text, which is the guest's: cut short)
      std::string why = f.payload.size() > 4 ? f.payload.substr(4, 200) : std::strerror(e);
      auto err = make_error(e == ENOENT ? errc::not_found : errc::invalid_argument,
                            "cannot execute '" + x.prog + "' in the sandbox: " + why)
                   .in_step("execve");
      if (x.transfer) // (no tar in the image: tar_error says so)
        err = *tar_error(x.transfer->transfer == transfer_put, x.transfer->transfer_path, err);
      end_exec(x, std::move(err));
      s.execs.erase(it);
      return;
    }
    default:
      return;
  }
}

void on_events(self_ptr self) {
  auto& s = self->state;
  for (auto& ev : s.worker->take()) {
    switch (ev.what) {
      case vm_event::kind::ready:
        if (s.ph != phase::creating)
          break;
        s.ph = phase::ready;
        s.created_ms = unix_ms();
        s.cgroups = std::move(ev.cgroups);
        s.image = std::move(ev.image);
        std::printf("dsecd: microvm %s ready%s (%s): boot %.0f ms (kernel %.0f, agent %.0f, qemu %.0f)\n",
                    s.cfg.id.c_str(), s.pooled ? " (warm pool)" : "", ev.accel.c_str(),
                    ev.times.total_ms, ev.times.kernel_ms, ev.times.agent_ms, ev.times.qemu_ms);
        std::fflush(stdout);
        self->send(s.cfg.node, ready_atom::value, process_key(), s.cfg.id);
        if (s.pooled)
          break; // waits for a claim: no session, no TTL yet
        self->send(s.cfg.session, ready_atom::value, s.cfg.key, s.cfg.id, sandbox_actor{self},
                   s.cfg.request);
        start_ttl(self);
        break;
      case vm_event::kind::failed:
        if (s.ph == phase::creating) {
          fail_creation(self, ev.err);
        } else {
          for (auto& [id, x] : s.execs)
            if (!x.detach)
              end_exec(x, ev.err);
          s.execs.clear();
          begin_destroy(self);
        }
        break;
      case vm_event::kind::frame:
        on_frame(self, ev.f);
        break;
    }
  }
}

// pause (true) / resume (false): QEMU frozen by its cgroup and the TTL clock
// stopped, or both going again. True when the state changed.
expected<bool> set_paused(self_ptr self, bool on) {
  auto& s = self->state;
  if (s.pooled)
    return make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool (nobody's)");
  if (s.ph != phase::ready)
    return make_error(s.ph == phase::creating ? errc::invalid_argument : errc::not_found,
                      "sandbox " + s.cfg.id
                        + (s.ph == phase::creating ? " is not ready yet" : " is being destroyed"));
  if (on == s.paused)
    return false;
  if (on) {
    if (!s.freezer) {
      auto cg = s.cfg.eng->cgroups();
      if (!cg)
        return std::move(cg).error_value().in_step("pause");
      auto f = sandbox_freezer::open(s.cgroups, s.cfg.id, (*cg)->owner());
      if (!f)
        return std::move(f).error_value().in_step("pause");
      s.freezer.emplace(std::move(*f));
    }
    DSEC_TRY_VOID(s.freezer->freeze());
    if (s.cfg.env.ttl_ms > 0 && s.expires != clock_type::time_point{}) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.expires
                                                                        - clock_type::now());
      s.ttl_left_ms = left.count() > 1 ? static_cast<uint64_t>(left.count()) : 1;
      ++s.ttl_setting; // the running timer finds its setting gone
    }
    s.paused = true;
  } else {
    DSEC_TRY_VOID(s.freezer->thaw());
    s.paused = false;
    if (s.cfg.env.ttl_ms > 0 && s.ttl_left_ms > 0) {
      ++s.ttl_setting;
      s.expires = clock_type::now() + std::chrono::milliseconds(s.ttl_left_ms);
      self->delayed_send(self, std::chrono::milliseconds(s.ttl_left_ms), ttl_atom::value,
                         process_key(), s.ttl_setting);
    }
  }
  self->send(s.cfg.node, pause_atom::value, process_key(), s.cfg.id, on);
  return true;
}

// Sends stdin piece `data` (then, with `close`, the end) of command `id` to
// the guest, in frames of 64 KiB.
void send_stdin(vm_state& s, uint32_t id, vm_exec& x, const std::string& data, bool close) {
  for (size_t off = 0; off < data.size(); off += 65536)
    s.worker->queue(VM_STDIN, id, std::string_view(data).substr(off, 65536));
  if (close && !x.stdin_closed) {
    s.worker->queue(VM_STDIN, id, {});
    x.stdin_closed = true;
  }
}

// Hands waiting stdin pieces on while the guest's channel has room; looks
// again in 10 ms while some still wait.
void drain_stdin(self_ptr self, uint32_t id) {
  auto& s = self->state;
  auto it = s.execs.find(id);
  if (it == s.execs.end())
    return;
  auto& x = it->second;
  while (!x.stdin_waiting.empty() && s.worker->queued() < stdin_buffer) {
    auto w = std::move(x.stdin_waiting.front());
    x.stdin_waiting.pop_front();
    send_stdin(s, id, x, w.data, w.close);
    w.rp.deliver(static_cast<uint64_t>(w.data.size()));
  }
  if (!x.stdin_waiting.empty())
    self->delayed_send(self, std::chrono::milliseconds(10), stdin_atom::value, process_key(),
                       uint64_t{id});
}

caf::error not_ready(const vm_state& s) {
  if (s.pooled)
    return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool (nobody's)"));
  return to_caf(make_error(s.ph == phase::creating ? errc::invalid_argument : errc::not_found,
                           "sandbox " + s.cfg.id
                             + (s.ph == phase::creating ? " is not ready yet"
                                                        : " is being destroyed")));
}

caf::error not_for_vm(const vm_state& s, const char* what) {
  return to_caf(make_error(errc::unsupported, std::string{what} + ": sandbox " + s.cfg.id
                                                + " is a microVM; the microvm backend has no "
                                                + what + " yet (docs/microvm.md)"));
}

// What a microVM uses, as the host sees it (`dsec stats ID`): its QEMU's
// memory (charged to QEMU's cgroup: the guest's RAM as it touched it, plus
// QEMU itself), CPU time and threads (tasks). The guest's processes and its
// writable layer (a tmpfs in its RAM) are not seen from here: 0. Read on a
// detached helper, like a container's.
caf::typed_response_promise<sandbox_usage> read_vm_usage(self_ptr self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<sandbox_usage>();
  sandbox_usage base;
  base.id = s.cfg.id;
  base.node = s.cfg.node_name;
  auto now = unix_ms();
  base.uptime_ms = s.created_ms && now > s.created_ms ? now - s.created_ms : 0;
  auto helper = self->spawn<caf::detached>(
    [qemu = s.worker->qemu_pid(), paths = s.cgroups, base](caf::event_based_actor* a) {
      return caf::behavior{[=](usage_atom) -> caf::result<internal_key, sandbox_usage> {
        a->quit();
        auto out = base;
        auto rows = read_sandbox_processes(qemu, paths, &out.usage);
        if (!rows)
          return to_caf(std::move(rows).error_value().in_step("usage"));
        // (statfs of QEMU's root is the host's: not the guest's layer)
        out.usage.processes = 0;
        out.usage.disk_bytes = out.usage.disk_limit = 0;
        out.usage.inodes = out.usage.inodes_limit = 0;
        return {process_key(), std::move(out)};
      }};
    });
  self->request(helper, caf::infinite, usage_atom::value)
    .then(
      [rp](const internal_key& k, sandbox_usage& u) mutable {
        if (!genuine(k, process_key(), "a usage result (microvm sandbox)"))
          rp.deliver(to_caf(make_error(errc::unauthorized, "a forged usage result")));
        else
          rp.deliver(std::move(u));
      },
      [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

// Starts command `req_in` (or the transfer it asks for) in the VM: checks it,
// makes its entry and queues its frames. The caller sets its promise or its
// done function (same turn: no frame of it can come before).
expected<vm_exec*> launch(self_ptr self, const exec_request& req_in,
                          caf::strong_actor_ptr listener) {
  auto& s = self->state;
  if (s.ph != phase::ready || s.pooled)
    return from_caf(not_ready(s));
  // A transfer (a streamed put or get: docs/actors.md "Transfers") is the
  // guest's tar, run as the VM's root from / (or as the uid it names).
  std::optional<exec_request> transfer;
  if (req_in.transfer != transfer_none) {
    auto t = transfer_command(req_in);
    if (!t)
      return std::move(t).error_value();
    transfer = std::move(*t);
  }
  const exec_request& req = transfer ? *transfer : req_in;
  if (s.paused)
    return make_error(errc::paused, "sandbox " + s.cfg.id
                                             + " is paused: resume it first (dsec resume "
                                             + s.cfg.id + ", sb.resume())");
  for (const auto& kv : req.env)
    if (kv.find('=') == std::string::npos || kv.front() == '=')
      return make_error(errc::invalid_argument,
                        "bad environment entry '" + kv + "' (expected KEY=VALUE)");
  if (req.tty)
    return from_caf(not_for_vm(s, "terminals (exec -t, pty=)"));
  if (req.trusted || req.pristine)
    return from_caf(not_for_vm(s, "Chronus (trusted commands)"));
  if (req.open_stdin && (!req.handle || req.detach))
    return make_error(errc::invalid_argument,
                      "an open stdin needs a process handle (exec_request.handle) and "
                      "a command that is not detached");
  // What it leaves out comes from the base image's config, as in a container
  // (actors/exec_command.hpp); a user by name from the image's own files.
  auto made = make_command(req, s.image->defaults);
  if (!made)
    return std::move(made).error_value();
  auto cmd = std::move(*made);
  if (auto u = apply_request_user(cmd, req, s.image->users); !u)
    return std::move(u).error_value();
  if (cmd.groups.size() > VM_MAX_GROUPS)
    return make_error(errc::invalid_argument, "user '" + req.user + "' has more than "
                                                + std::to_string(VM_MAX_GROUPS) + " groups");
  auto id = ++s.next_id;
  auto& x = s.execs[id];
  x.stream = req.stream;
  x.detach = req.detach;
  x.max_output = req.max_output;
  x.handle = req.handle;
  x.open_stdin = req.open_stdin;
  x.transfer = transfer;
  x.t0 = clock_type::now();
  if ((req.stream || req.handle) && listener) {
    self->monitor(listener);
    x.listener = std::move(listener);
  }
  vm_credentials who;
  who.uid = cmd.uid.value_or(0);
  who.gid = cmd.gid.value_or(cmd.uid ? who.uid : 0);
  who.groups = cmd.groups;
  x.prog = cmd.argv.front();
  s.worker->queue(VM_EXEC, id, microvm::exec_payload(cmd.argv, cmd.env, cmd.cwd, who));
  send_stdin(s, id, x, req.input, !req.open_stdin);
  if (req.timeout_ms > 0)
    self->delayed_send(self, std::chrono::milliseconds(req.timeout_ms), timeout_atom::value,
                       process_key(), uint64_t{id});
  return &x;
}

// A pooled microVM handed to a create (claim_atom): from now on it is that
// session's, of that request, with that TTL, as if it had been booted for it.
// One that is not ready (it is going) fails the request.
bool claim(self_ptr self, const session_actor& session, const std::string& session_id,
           uint64_t request, uint64_t ttl_ms) {
  auto& s = self->state;
  if (!s.pooled || !session)
    return false;
  s.pooled = false;
  take_claim(self, s.cfg, session, session_id, request, ttl_ms);
  if (s.ph != phase::ready || !s.execs.empty()) {
    s.creation_failed_told = true;
    s.created_ms = 0; // never the caller's: its end is no gone_atom
    self->send(session, failed_atom::value, s.cfg.key,
               to_caf(make_error(errc::sandbox_failed, "pooled sandbox " + s.cfg.id
                                                         + " ended before it was claimed")),
               request);
    begin_destroy(self);
    return false;
  }
  s.created_ms = unix_ms();
  self->send(session, ready_atom::value, s.cfg.key, s.cfg.id, sandbox_actor{self}, request);
  start_ttl(self);
  return true;
}

sandbox_actor::behavior_type vm_impl(self_ptr self, sandbox_config cfg,
                                     std::shared_ptr<const microvm_node_config> node,
                                     std::shared_ptr<vm_disks> disks) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.node = std::move(node);
  const auto& env = st.cfg.env;
  microvm_options o;
  o.qemu = st.node->qemu;
  o.accel = st.node->accel == "kvm" ? microvm_accel::kvm
            : st.node->accel == "tcg" ? microvm_accel::tcg
                                      : microvm_accel::automatic;
  if (auto g = microvm_guest::in(st.node->guest_dir))
    o.guest = *g;
  else
    o.guest = {st.node->guest_dir + "/vmlinux", st.node->guest_dir + "/initrd.cpio"}; // boot names it
  if (env.memory)
    o.memory = env.memory;
  if (env.cpus > 0)
    o.cpus = static_cast<unsigned>(std::ceil(env.cpus));
  o.disk = env.disk;
  o.hostname = st.cfg.id;
  o.cgroup_name = st.cfg.id;
  st.worker = std::make_shared<vm_worker>(sandbox_actor{self}, std::move(o), st.cfg.eng, env,
                                          std::move(disks));
  st.pooled = st.cfg.pooled;
  // The session ending ends its sandboxes (a pooled one's: the pool's owner, if any).
  if (st.cfg.session)
    self->monitor(st.cfg.session);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.cfg.session.address()) {
      if (really_down(s.cfg.session, "a down message of a sandbox's session"))
        begin_destroy(self);
      return;
    }
    for (auto& [id, x] : s.execs)
      if (x.listener && x.listener->address() == dm.source
          && really_down(x.listener, "a down message of a streamed command's listener")) {
        x.listener = nullptr;
        int32_t sig = SIGKILL;
        s.worker->queue(VM_SIGNAL, id, {reinterpret_cast<const char*>(&sig), 4});
      }
  });
  st.worker->start();
  return {
    [=](exec_atom, const internal_key& k, const exec_request& req_in) -> caf::result<exec_result> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "exec (sandbox)"))
        return refuse("exec");
      auto x = launch(self, req_in, self->current_sender());
      if (!x)
        return to_caf(std::move(x).error_value());
      (*x)->rp = self->make_response_promise<exec_result>();
      return (*x)->rp;
    },
    [=](timeout_atom, const internal_key& k, uint64_t id) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "timeout (sandbox)"))
        return;
      auto it = s.execs.find(static_cast<uint32_t>(id));
      if (it == s.execs.end())
        return;
      it->second.timed_out = true;
      int32_t sig = SIGKILL;
      s.worker->queue(VM_SIGNAL, it->first, {reinterpret_cast<const char*>(&sig), 4});
    },
    [=](signal_atom, const internal_key& k, int32_t sig) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "signal (sandbox)"))
        return refuse("signal");
      if (s.ph != phase::ready || s.pooled)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is not running"));
      if (sig < 1 || sig > 64)
        return to_caf(make_error(errc::invalid_argument, "bad signal " + std::to_string(sig)));
      for (auto& [id, x] : s.execs)
        s.worker->queue(VM_SIGNAL, id, {reinterpret_cast<const char*>(&sig), 4});
      return true;
    },
    [=](signal_atom, const internal_key& k, uint64_t eid, int32_t sig) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "signal (sandbox)"))
        return refuse("signal");
      if (sig < 1 || sig > 64)
        return to_caf(make_error(errc::invalid_argument, "bad signal " + std::to_string(sig)));
      auto it = s.execs.find(static_cast<uint32_t>(eid));
      if (eid > UINT32_MAX || it == s.execs.end())
        return to_caf(make_error(errc::not_found, "no command " + std::to_string(eid)
                                                    + " runs in sandbox " + s.cfg.id));
      s.worker->queue(VM_SIGNAL, it->first, {reinterpret_cast<const char*>(&sig), 4});
      return true;
    },
    [=](stdin_atom, const internal_key& k, uint64_t eid, std::string& data,
        bool close) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "stdin (sandbox)"))
        return refuse("stdin");
      auto it = s.execs.find(static_cast<uint32_t>(eid));
      if (eid > UINT32_MAX || it == s.execs.end())
        return to_caf(make_error(errc::not_found, "no command " + std::to_string(eid)
                                                    + " runs in sandbox " + s.cfg.id));
      auto& x = it->second;
      if (!x.open_stdin || x.stdin_closed)
        return to_caf(make_error(errc::closed, "the stdin of command " + std::to_string(eid)
                                                 + " in sandbox " + s.cfg.id
                                                 + (x.open_stdin ? " is closed"
                                                                 : " was not left open (open_stdin)")));
      if (data.size() > max_stdin_chunk)
        return to_caf(make_error(errc::too_large, "stdin: at most "
                                                    + std::to_string(max_stdin_chunk)
                                                    + " bytes a message, got "
                                                    + std::to_string(data.size())));
      if (x.stdin_waiting.empty() && s.worker->queued() < stdin_buffer) {
        send_stdin(s, it->first, x, data, close);
        return static_cast<uint64_t>(data.size());
      }
      // The guest's channel is full: the reply waits until it has room.
      if (x.stdin_waiting.size() >= 8)
        return to_caf(make_error(errc::overloaded,
                                 "stdin of command " + std::to_string(eid)
                                   + ": 8 messages wait already (wait for their replies)"));
      auto rp = self->make_response_promise<uint64_t>();
      x.stdin_waiting.push_back({std::move(data), close, rp});
      if (x.stdin_waiting.size() == 1)
        self->delayed_send(self, std::chrono::milliseconds(10), stdin_atom::value,
                           process_key(), uint64_t{it->first});
      return rp;
    },
    [=](stdin_atom, const internal_key& k, uint64_t eid) { // look for room again
      if (genuine(k, process_key(), "stdin room (microvm sandbox)") && eid <= UINT32_MAX)
        drain_stdin(self, static_cast<uint32_t>(eid));
    },
    [=](resize_atom, const internal_key& k, uint64_t, uint16_t,
        uint16_t) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "resize (sandbox)"))
        return refuse("resize");
      return not_for_vm(self->state, "terminals (exec -t, pty=)");
    },
    [=](credit_atom, const internal_key& k, uint64_t, uint64_t) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "credit (sandbox)"))
        return refuse("credit");
      return false; // streamed output of a microVM is not flow-controlled
    },
    // The whole-buffer put and get: the transfer's tar with the archive as its
    // input, or its output collected, run as any command.
    [=](put_atom, const internal_key& k, const std::string& dir,
        const std::string& tar) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.cfg.key, "put (sandbox)"))
        return refuse("put");
      auto req = whole_buffer_command(transfer_put, dir, tar);
      if (!req)
        return to_caf(req.error_value());
      req->uid = req->gid = -1; // (the VM's root)
      auto x = launch(self, *req, nullptr);
      if (!x)
        return to_caf(std::move(x).error_value());
      auto rp = self->make_response_promise<uint64_t>();
      (*x)->done = [rp, dir, size = uint64_t{tar.size()}](expected<exec_result> r) mutable {
        deliver(rp, put_answer(dir, size, r));
      };
      return rp;
    },
    [=](get_atom, const internal_key& k, const std::string& path) -> caf::result<std::string> {
      if (!genuine(k, self->state.cfg.key, "get (sandbox)"))
        return refuse("get");
      auto req = whole_buffer_command(transfer_get, path, {});
      if (!req)
        return to_caf(req.error_value());
      req->uid = req->gid = -1;
      auto x = launch(self, *req, nullptr);
      if (!x)
        return to_caf(std::move(x).error_value());
      auto rp = self->make_response_promise<std::string>();
      (*x)->done = [rp, path](expected<exec_result> r) mutable {
        deliver(rp, get_answer(path, std::move(r)));
      };
      return rp;
    },
    [=](destroy_atom, const internal_key& k) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "destroy (sandbox)"))
        return refuse("destroy");
      auto rp = self->make_response_promise<bool>();
      self->state.destroy_waiters.push_back(rp);
      begin_destroy(self);
      return rp;
    },
    [=](destroy_atom, const internal_key& k, const std::string&) { // (no reason kept here)
      if (genuine(k, self->state.cfg.key, "destroy (sandbox)"))
        begin_destroy(self);
    },
    [=](list_atom, const internal_key& k) -> caf::result<sandbox_info> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "list (sandbox)"))
        return refuse("list");
      sandbox_info info;
      info.id = s.cfg.id;
      info.session = s.cfg.session_id;
      info.node = s.cfg.node_name;
      info.state = s.ph == phase::creating     ? "creating"
                   : s.ph == phase::destroying ? "destroying"
                   : s.pooled                  ? "pooled"
                   : s.paused                  ? "paused"
                   : s.execs.empty()           ? "ready"
                                               : "running";
      info.env = s.cfg.env;
      info.created_ms = s.created_ms;
      if (s.paused) {
        info.ttl_left_ms = s.ttl_left_ms; // its clock stands still
      } else if (s.expires != clock_type::time_point{}) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.expires - clock_type::now());
        info.ttl_left_ms = left.count() > 0 ? static_cast<uint64_t>(left.count()) : 0;
      }
      info.running = static_cast<uint32_t>(s.execs.size());
      return info;
    },
    [=](feedback_atom, const internal_key& k, const chronus_feedback_msg&) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "feedback (sandbox)"))
        return refuse("feedback");
      return not_for_vm(self->state, "Chronus");
    },
    [=](pack_atom, const internal_key& k,
        const std::string&) -> caf::result<internal_key, std::string> {
      if (!genuine(k, self->state.cfg.key, "pack (sandbox)"))
        return refuse("pack");
      return not_for_vm(self->state, "packs");
    },
    [=](lifetime_atom, const internal_key& k, uint64_t ms) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "lifetime (sandbox)"))
        return refuse("lifetime");
      if (s.pooled)
        return not_ready(s);
      if (s.ph != phase::ready)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id + " is not ready: its TTL can be set once it is"));
      ++s.ttl_setting;
      s.cfg.env.ttl_ms = ms;
      if (s.paused) { // starts running at resume
        s.ttl_left_ms = ms;
        return ms;
      }
      s.expires = clock_type::now() + std::chrono::milliseconds(ms);
      self->delayed_send(self, std::chrono::milliseconds(ms), ttl_atom::value, process_key(),
                         s.ttl_setting);
      return ms;
    },
    [=](network_atom, const internal_key& k, const std::vector<std::string>&,
        const std::vector<std::string>&) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "network (sandbox)"))
        return refuse("network");
      return not_for_vm(self->state, "network (a microVM's network is none)");
    },
    [=](expose_atom, const internal_key& k, uint16_t) -> caf::result<exposed_port> {
      if (!genuine(k, self->state.cfg.key, "expose (sandbox)"))
        return refuse("expose");
      return not_for_vm(self->state, "expose (a microVM's network is none)");
    },
    [=](logs_atom, const internal_key& k, const logs_request&) -> caf::result<logs_reply> {
      if (!genuine(k, self->state.cfg.key, "logs (sandbox)"))
        return refuse("logs");
      return not_for_vm(self->state, "logs (a microVM's detached commands keep no output)");
    },
    [=](usage_atom, const internal_key& k, bool processes) -> caf::result<sandbox_usage> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "usage (sandbox)"))
        return refuse("usage");
      if (s.ph != phase::ready || s.pooled)
        return not_ready(s);
      if (processes)
        return not_for_vm(s, "top (the guest's processes are not seen from the host; stats shows "
                             "its QEMU's figures)");
      return read_vm_usage(self);
    },
    [=](event_atom, const internal_key& k) {
      if (genuine(k, process_key(), "event (sandbox)"))
        on_events(self);
    },
    [=](output_atom, const internal_key&, uint64_t, uint8_t, std::string&, bool) {},
    [=](reaped_atom, const internal_key& k) {
      if (!genuine(k, process_key(), "reaped (sandbox)"))
        return;
      auto& s = self->state;
      on_events(self); // a failure the worker posted just before
      s.reaped = true;
      if (s.ph != phase::destroying) {
        s.ph = phase::destroying; // QEMU went by itself
      }
      finish_destroy(self);
    },
    [=](ttl_atom, const internal_key& k, uint64_t setting) {
      if (genuine(k, process_key(), "ttl (sandbox)") && setting == self->state.ttl_setting)
        begin_destroy(self);
    },
    // Never orphaned (a microVM ends with its session, even when its
    // coordinator's process went away): nothing to adopt.
    [=](adopt_atom, const internal_key& k, const caf::actor&, const create_labels&, uint32_t) {
      (void) genuine(k, process_key(), "adopt (microvm sandbox)");
    },
    [=](orphan_atom, const internal_key& k, uint64_t) {
      (void) genuine(k, process_key(), "orphan (microvm sandbox)");
    },
    [=](claim_atom, const internal_key& k, const caf::actor& session,
        const std::string& session_id, uint64_t request, uint64_t ttl_ms,
        bool) -> caf::result<bool> { // (keep_upper: a microVM takes no packs)
      if (!genuine(k, process_key(), "claim (microvm sandbox)"))
        return refuse("claim");
      return claim(self, caf::actor_cast<session_actor>(session), session_id, request, ttl_ms);
    },
    [=](pause_atom, const internal_key& k, bool on) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "pause (sandbox)"))
        return refuse("pause");
      auto r = set_paused(self, on);
      if (!r)
        return to_caf(std::move(r).error_value());
      return *r;
    },
    [=](snapshot_atom, const internal_key& k,
        const std::string&) -> caf::result<internal_key, std::string> {
      if (!genuine(k, self->state.cfg.key, "snapshot (sandbox)"))
        return refuse("snapshot");
      return not_for_vm(self->state, "snapshots");
    },
  };
}

class microvm_backend final : public backend {
public:
  microvm_backend(microvm_node_config cfg, engine& eng)
    : cfg_(std::make_shared<const microvm_node_config>(std::move(cfg))),
      disks_(std::make_shared<vm_disks>()) {
    std::vector<std::string> collected;
    auto d = microvm_disks::open(eng.layers(), &collected);
    for (const auto& c : collected)
      std::printf("dsecd: removed %s (merged microVM disks left by a dsec that is gone)\n",
                  c.c_str());
    std::fflush(stdout);
    if (d)
      disks_->disks = std::move(*d);
    else
      disks_->why = std::move(d).error_value();
  }
  [[nodiscard]] std::string_view name() const override { return "microvm"; }
  sandbox_actor spawn(caf::actor_system& sys, sandbox_config cfg) override {
    return sys.spawn(vm_impl, std::move(cfg), cfg_, disks_);
  }

private:
  std::shared_ptr<const microvm_node_config> cfg_;
  std::shared_ptr<vm_disks> disks_;
};

} // namespace

std::unique_ptr<backend> make_microvm_backend(microvm_node_config cfg, engine& eng) {
  return std::make_unique<microvm_backend>(std::move(cfg), eng);
}

std::string microvm_accel_of(const microvm_node_config& cfg) {
  if (cfg.accel == "kvm" || cfg.accel == "tcg")
    return cfg.accel;
  return to_string(detect_accel());
}

} // namespace dsec
