// Shared pieces of the dsec command line: a small argument cursor and how
// errors are printed (the global options: global_options.hpp). Each verb lives
// in its own file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "tools/dsec/global_options.hpp"

namespace dsec::cli {

/// Walks argv from a start index. Understands `--name VALUE`, `--name=VALUE`,
/// boolean `--name`, and `--` (everything after it is left for rest()).
class args {
public:
  args(int argc, char** argv, int first);

  [[nodiscard]] bool empty() const { return pos_ >= argv_.size(); }
  [[nodiscard]] std::string_view peek() const {
    return empty() ? std::string_view{} : std::string_view{argv_[pos_]};
  }
  std::string_view next() { return empty() ? std::string_view{} : argv_[pos_++]; }

  /// True if the current argument is `--name` or `--name=...`; then consumes it
  /// and its value. A missing value is an error naming the option.
  expected<bool> option(std::string_view name, std::string& value);

  /// True (and consumed) if the current argument is exactly `--name`.
  bool flag(std::string_view name);

  /// True if the current argument is -h or --help (consumed).
  bool help();

  /// If the current argument is `--`, consumes it and everything after it.
  bool rest(std::vector<std::string>& out);

  /// The current argument looks like an option (starts with '-').
  [[nodiscard]] bool at_option() const {
    auto a = peek();
    return a.size() > 1 && a[0] == '-';
  }

private:
  std::vector<std::string> argv_;
  size_t pos_;
};

/// A whole number of at most 12 decimal digits, no sign, up to `max`.
bool parse_uint(const std::string& s, uint64_t max, uint64_t& out);

/// Prints "dsec: MESSAGE" on stderr and returns 1 (or `code`).
int fail(const error& err, int code = 1);

/// Prints "dsec VERB: MESSAGE" and a pointer to --help on stderr; returns 2.
int usage_error(std::string_view verb, std::string_view message);

/// Prints `rows` on stdout as a table: each column as wide as its widest cell,
/// two spaces apart (rows may have fewer cells than others).
void print_table(const std::vector<std::vector<std::string>>& rows);

/// Resolves the state directory from --state, $DSEC_STATE or the default.
std::string default_state_dir();

/// A program dsec hands a verb to (dsec-client, dsec-oci): `name` beside this
/// binary, else $`env_var`, else in DSEC_LIBEXECDIR; empty when none is.
/// `beside_dir` gets this binary's directory (for the message), if known.
std::string find_companion(const char* name, const char* env_var, std::string& beside_dir);

// The verbs. Each returns the process exit status.
int layer_main(const global_options& global, args& a);
int run_main(const global_options& global, args& a);

} // namespace dsec::cli
