// Running host programs from a test: run_process() to completion with captured
// output, background for a program that runs while the test does something else.
//
// Children get PR_SET_PDEATHSIG(SIGKILL): if the test process dies, whatever it
// started dies too (a `dsec run` takes its sandbox with it). Timeouts here are
// safety nets against a hung suite, never pass/fail thresholds.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dsec::test {

using namespace std::chrono_literals;

/// How a program ended and what it printed.
struct proc_result {
  int status = -1;            ///< exit code, or 128 + the signal that killed it
  bool safety_killed = false; ///< the safety net had to SIGKILL it
  bool output_left_open = false; ///< something else kept its stdout/stderr open
  std::string out, err;

  /// "status 3, stdout '...', stderr '...'" for failure messages.
  [[nodiscard]] std::string describe() const;
};

struct spawn_options {
  std::string input;                    ///< written to stdin, which is then closed
  std::chrono::seconds kill_after{240}; ///< safety net: SIGKILL after this long
  std::function<void()> in_child;       ///< runs in the child just before execve
};

/// Runs argv[0] (a path) with argv, feeding `input` and capturing stdout and
/// stderr, until it exits and its output ends.
proc_result run_process(const std::vector<std::string>& argv, const spawn_options& opts = {});

/// A program running in the background with stdin from /dev/null and stdout and
/// stderr captured. The destructor SIGKILLs and reaps it if it still runs.
class background {
public:
  explicit background(const std::vector<std::string>& argv);
  ~background();
  background(const background&) = delete;
  background& operator=(const background&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }

  /// Reads until stdout contains `text`; false if the program ended (or the
  /// safety net passed) first.
  bool wait_for_output(const std::string& text, std::chrono::seconds safety = 120s);

  /// Sends a signal (only while it has not been reaped).
  void kill(int sig);

  /// Reads the rest of its output and reaps it (SIGKILL after `safety`).
  proc_result wait(std::chrono::seconds safety = 120s);

  [[nodiscard]] const std::string& out() const { return res_.out; }
  [[nodiscard]] const std::string& err() const { return res_.err; }

private:
  // Reads what is available for up to `ms` milliseconds; false once both pipes
  // reached EOF.
  bool pump(int ms);

  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  proc_result res_;
};

/// True while a process with this pid exists (zombies count).
bool pid_exists(pid_t pid);

} // namespace dsec::test
