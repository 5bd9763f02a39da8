#include "runtime/error.hpp"

#include <cerrno>

#include <doctest/doctest.h>

using namespace dsec;

TEST_CASE("sys_error keeps errno, the path and a readable message") {
  auto e = sys_error("open", "/no/such/file", ENOENT);
  CHECK(e.code == errc::not_found);
  CHECK(e.sys_errno == ENOENT);
  CHECK(e.path == "/no/such/file");
  CHECK(e.to_string() == "open /no/such/file: No such file or directory");
  auto p = sys_error("mount", "/mnt", EPERM);
  CHECK(p.code == errc::system_error);
}

TEST_CASE("to_string names the step once") {
  auto e = sys_error("move_mount", "/mnt", EPERM);
  e.in_step("attach_root").in_step("ignored");
  CHECK(e.step == "attach_root");
  CHECK(e.to_string() == "step 'attach_root' failed: move_mount /mnt: Operation not permitted");
}

TEST_CASE("expected carries a value or an error") {
  expected<int> a = 42;
  REQUIRE(a);
  CHECK(*a == 42);
  expected<int> b = make_error(errc::invalid_argument, "bad");
  REQUIRE_FALSE(b);
  CHECK(b.error_value().code == errc::invalid_argument);
  expected<void> ok;
  CHECK(ok);
  expected<void> bad = make_error(errc::in_use, "busy");
  CHECK_FALSE(bad);
  CHECK(std::string{to_string(bad.error_value().code)} == "in_use");
}

namespace {

expected<int> half(int x) {
  if (x % 2)
    return make_error(errc::invalid_argument, "odd");
  return x / 2;
}

expected<int> quarter(int x) {
  DSEC_TRY(h, half(x));
  DSEC_TRY(q, half(h));
  return q;
}

} // namespace

TEST_CASE("DSEC_TRY propagates the first error") {
  CHECK(*quarter(8) == 2);
  auto r = quarter(6);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().message == "odd");
}
