// runtime/nft_elements.hpp against the kernel: elements it adds are what
// `nft list` shows for the same text, a delete removes them, a transaction is
// all or nothing, and a failure names its set. A table of the test's own,
// removed at the end.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/nft_elements.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using dsec::test::run_process;
using dsec::test::skip_unless;

namespace {

const char* nft_bin() { return "/usr/sbin/nft"; }

bool can_nft() { return ::geteuid() == 0 && std::filesystem::exists(nft_bin()); }

struct test_table {
  std::string name = "dsec_test_" + std::to_string(::getpid());
  test_table() {
    auto r = run_process({nft_bin(), "add table inet " + name + "; "
                          "add set inet " + name + " iv { type ifname . ipv4_addr . inet_service; flags interval; }; "
                          "add set inet " + name + " h { type ifname . ipv4_addr; }; "
                          "add set inet " + name + " c { type ifname; counter; }; "
                          "add set inet " + name + " t { type ifname . ipv4_addr; flags timeout; }"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  }
  ~test_table() { (void) run_process({nft_bin(), "delete", "table", "inet", name}); }
  std::string list(const std::string& set) const {
    auto r = run_process({nft_bin(), "list", "set", "inet", name, set});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    return r.out;
  }
};

nft_elem range(const std::string& ifname, uint32_t a, uint32_t b, uint16_t plo, uint16_t phi) {
  nft_elem e;
  e.key.ifname(ifname).ipv4(a).port(plo);
  e.key_end.ifname(ifname).ipv4(b).port(phi);
  return e;
}

} // namespace

TEST_CASE("a key's fields are laid out as the kernel compares them") {
  nft_key k;
  k.ifname("dxab_1").ipv4(0xc6120001).port(8000);
  REQUIRE(k.len == 24);
  CHECK(std::string(reinterpret_cast<const char*>(k.bytes.data())) == "dxab_1");
  for (size_t i = 6; i < 16; ++i)
    CHECK(k.bytes[i] == 0);
  CHECK(k.bytes[16] == 0xc6); // network order
  CHECK(k.bytes[19] == 0x01);
  CHECK(k.bytes[20] == 0x1f); // 8000 = 0x1f40, then two bytes of padding
  CHECK(k.bytes[21] == 0x40);
  CHECK(k.bytes[22] == 0);
  CHECK(k.bytes[23] == 0);
}

TEST_CASE("set elements through netlink, as nft shows them"
          * skip_unless(can_nft(), "needs root and nft")) {
  test_table t;
  auto el = nft_elements::open(t.name);
  REQUIRE_MESSAGE(el, el.error_value().to_string());
  // 198.18.0.0/16 ports 8000-8080, and one address on one port.
  nft_set_elems iv{"iv", {range("dxab_1", 0xc6120000, 0xc612ffff, 8000, 8080),
                          range("dxab_1", 0xc6130005, 0xc6130005, 443, 443)}};
  nft_elem h;
  h.key.ifname("dxab_1").ipv4(0xc6130003);
  nft_set_elems hs{"h", {h}};
  nft_elem c;
  c.key.ifname("dxab_1");
  nft_set_elems cs{"c", {c}};
  nft_elem tm;
  tm.key.ifname("dxab_1").ipv4(0x01020304);
  tm.timeout_ms = 30000;
  nft_set_elems ts{"t", {tm}};
  std::vector<nft_set_elems> all{iv, hs, cs, ts};
  REQUIRE_MESSAGE(el->apply({}, all), "add");
  auto l = t.list("iv");
  CHECK_MESSAGE(l.find("\"dxab_1\" . 198.18.0.0/16 . 8000-8080") != std::string::npos, l);
  CHECK_MESSAGE(l.find("\"dxab_1\" . 198.19.0.5 . 443") != std::string::npos, l);
  CHECK_MESSAGE(t.list("h").find("\"dxab_1\" . 198.19.0.3") != std::string::npos, t.list("h"));
  CHECK_MESSAGE(t.list("c").find("\"dxab_1\" counter packets 0 bytes 0") != std::string::npos,
                t.list("c"));
  l = t.list("t");
  CHECK_MESSAGE(l.find("\"dxab_1\" . 1.2.3.4 timeout 30s") != std::string::npos, l);
  // An add of what is there already is no error (like `nft add element`).
  CHECK(el->apply({}, {&hs, 1}));
  // All or nothing: the delete of an element that is not there fails the
  // transaction, naming its set, and the add beside it is not applied.
  nft_elem other;
  other.key.ifname("dxab_2").ipv4(0xc6130009);
  nft_set_elems missing{"h", {other}};
  nft_elem c2;
  c2.key.ifname("dxab_2");
  nft_set_elems more{"c", {c2}};
  auto bad = el->apply({&missing, 1}, {&more, 1});
  REQUIRE_FALSE(bad);
  CHECK_MESSAGE(bad.error_value().message.find("deleting elements from set h") != std::string::npos,
                bad.error_value().to_string());
  CHECK(bad.error_value().code == errc::not_found);
  CHECK(t.list("c").find("dxab_2") == std::string::npos);
  // An unknown set is named too.
  nft_set_elems nosuch{"nosuch", {c2}};
  auto unknown = el->apply({}, {&nosuch, 1});
  REQUIRE_FALSE(unknown);
  CHECK_MESSAGE(unknown.error_value().message.find("adding elements to set nosuch")
                  != std::string::npos,
                unknown.error_value().to_string());
  // Deleted again, every set is empty.
  REQUIRE_MESSAGE(el->apply(all, {}), "delete");
  for (const char* s : {"iv", "h", "c", "t"})
    CHECK_MESSAGE(t.list(s).find("elements") == std::string::npos, t.list(s));
}
