// dsec-load end to end: the real executable ($DSEC_LOAD_BIN) against a real
// dsecd process ($DSECD_BIN, dsecd_proc from test/actors/common.hpp) over the
// actor suites' layers (bbt@1 busybox with tar; the fixture's wd@1 and ta@1).
// Each case checks the exit status, the table or the JSON it wrote, and that
// nothing of the run is left on the node (node stats through a client, and the
// dsecd's own "0 sandboxes destroyed" when it is stopped).
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- a strict little JSON reader, enough to check what dsec-load wrote --------------

struct json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<json>,
               std::map<std::string, json>>
    v;
  [[nodiscard]] bool has(const std::string& k) const {
    auto* m = std::get_if<std::map<std::string, json>>(&v);
    return m && m->count(k);
  }
  [[nodiscard]] const json& operator[](const std::string& k) const {
    const auto& m = std::get<std::map<std::string, json>>(v);
    auto it = m.find(k);
    if (it == m.end())
      throw std::runtime_error("no key '" + k + "'");
    return it->second;
  }
  [[nodiscard]] double num() const { return std::get<double>(v); }
  [[nodiscard]] const std::string& str() const { return std::get<std::string>(v); }
  [[nodiscard]] const std::vector<json>& arr() const { return std::get<std::vector<json>>(v); }
};

class json_reader {
public:
  explicit json_reader(const std::string& s) : s_(s) {}
  json parse() {
    auto j = value();
    ws();
    if (i_ != s_.size())
      fail("trailing bytes");
    return j;
  }

private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("JSON: " + why + " at byte " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_])))
      ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  std::string string() {
    if (!eat('"'))
      fail("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20)
        fail("a control character in a string");
      if (c == '\\') {
        if (i_ >= s_.size())
          fail("an unfinished escape");
        char e = s_[i_++];
        switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u':
          if (i_ + 4 > s_.size())
            fail("a short \\u escape");
          out += static_cast<char>(std::stoi(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          break;
        default: fail("a bad escape");
        }
      } else {
        out += c;
      }
    }
    if (i_ >= s_.size())
      fail("an unfinished string");
    ++i_;
    return out;
  }
  json value() {
    ws();
    if (i_ >= s_.size())
      fail("unexpected end");
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      std::map<std::string, json> m;
      if (!eat('}')) {
        do {
          ws();
          auto k = string();
          if (!eat(':'))
            fail("expected ':'");
          if (m.count(k))
            fail("duplicate key '" + k + "'");
          m.emplace(k, value());
        } while (eat(','));
        if (!eat('}'))
          fail("expected '}'");
      }
      return json{std::move(m)};
    }
    if (c == '[') {
      ++i_;
      std::vector<json> a;
      if (!eat(']')) {
        do
          a.push_back(value());
        while (eat(','));
        if (!eat(']'))
          fail("expected ']'");
      }
      return json{std::move(a)};
    }
    if (c == '"')
      return json{string()};
    for (const auto& [word, val] : {std::pair<std::string, json>{"true", json{true}},
                                    {"false", json{false}}, {"null", json{nullptr}}})
      if (s_.compare(i_, word.size(), word) == 0) {
        i_ += word.size();
        return val;
      }
    size_t end = i_;
    while (end < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[end])) || s_[end] == '-'
                               || s_[end] == '+' || s_[end] == '.' || s_[end] == 'e'
                               || s_[end] == 'E'))
      ++end;
    if (end == i_)
      fail("unexpected character");
    size_t used = 0;
    double d = std::stod(s_.substr(i_, end - i_), &used);
    if (used != end - i_)
      fail("a malformed number");
    i_ = end;
    return json{d};
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::string slurp(const std::string& path) {
  std::ifstream in{path};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const std::string& path) {
  auto text = slurp(path);
  REQUIRE_MESSAGE(!text.empty(), "dsec-load wrote nothing to " << path);
  try {
    return json_reader{text}.parse();
  } catch (const std::exception& e) {
    FAIL("dsec-load's JSON does not parse: " << e.what() << "\n" << text);
  }
  return {};
}

// Checks one latency object: the keys, and p50 <= p90 <= p99 <= max.
void check_latency(const json& j, const std::string& key, double want_count) {
  REQUIRE_MESSAGE(j.has(key), "no '" << key << "'");
  const auto& l = j[key];
  for (const char* k : {"count", "p50", "p90", "p99", "max"})
    REQUIRE_MESSAGE(l.has(k), key << " has no '" << k << "'");
  CHECK_MESSAGE(l["count"].num() == want_count, key);
  CHECK(l["p50"].num() >= 0);
  CHECK(l["p50"].num() <= l["p90"].num());
  CHECK(l["p90"].num() <= l["p99"].num());
  CHECK(l["p99"].num() <= l["max"].num());
  if (want_count > 0)
    CHECK(l["max"].num() > 0);
}

// A temporary file name (removed with the suite's temporary root).
std::string temp_path(const std::string& name) {
  return suite::get().root() + "/load-" + std::to_string(::getpid()) + "-" + name;
}

// `dsec-load ARGS...` to completion.
proc_result load(const std::vector<std::string>& args) {
  std::vector<std::string> argv{env_path("DSEC_LOAD_BIN")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv);
  CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
  return r;
}

// A dsecd for one case, a client of it, and the checks that nothing is left.
struct node {
  node() : c(connect(sys, d.port)) {}
  ~node() { c.reset(); }

  [[nodiscard]] std::string where() const { return "127.0.0.1:" + std::to_string(d.port); }

  // No sandbox left (the node hears of a destroy just after its reply: polled).
  void check_empty() {
    bool empty = eventually([&] {
      auto s = c->stats();
      return s && s->live == 0 && s->creating == 0;
    });
    auto s = node_stats_of(*c);
    CHECK_MESSAGE(empty, "the node still has " << s.live << " live and " << s.creating
                                                << " creating sandboxes");
    CHECK(node_list(*c).empty());
  }

  // Stops the dsecd: it exits 0 and had no sandbox left to destroy.
  void finish() {
    c.reset();
    auto end = d.stop(SIGTERM);
    CHECK_MESSAGE(end.status == 0, end.describe());
    CHECK_MESSAGE(contains(end.out, "dsecd: 0 sandboxes destroyed"), end.describe());
  }

  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  std::unique_ptr<client> c;
};

} // namespace

TEST_CASE("usage errors exit 2 and name the option, before anything starts") {
  auto cat_bad = temp_path("bad.cat");
  {
    std::ofstream f{cat_bad};
    f << "# fine\n" << tar_base << "\n" << tar_base << " wd@1 ta@1,tb\n";
  }
  auto cat_weights = temp_path("weights.cat");
  {
    std::ofstream f{cat_weights};
    f << tar_base << " - - 3\n" << tar_base << " wd@1\n";
  }
  struct bad_case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<bad_case> cases{
    {{"--embedded", "--base", tar_base}, "--count"},
    {{"--embedded", "--base", tar_base, "--count", "0"}, "--count"},
    {{"--embedded", "--base", tar_base, "--count", "-5"}, "--count"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--concurrency", "0"}, "--concurrency"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--rate", "-1"}, "--rate"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--sessions", "0"}, "--sessions"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--frobnicate"}, "--frobnicate"},
    {{"--base", tar_base, "--count", "10"}, "--connect"},
    {{"--embedded", "--connect", "127.0.0.1:7070", "--base", tar_base, "--count", "10"},
     "--embedded"},
    {{"--connect", "localhost", "--base", tar_base, "--count", "10"}, "--connect"},
    {{"--connect", "127.0.0.1:99999", "--base", tar_base, "--count", "10"}, "--connect"},
    {{"--connect", "127.0.0.1:7070", "--state", "/tmp", "--base", tar_base, "--count", "10"},
     "--state"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--hold", "--rate", "5"}, "--rate"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--batch", "32"}, "--batch"},
    {{"--embedded", "--count", "10"}, "--base"},
    {{"--embedded", "--base", "no-version", "--count", "10"}, "--base"},
    {{"--embedded", "--base", tar_base, "--tool", "x@", "--count", "10"}, "--tool"},
    {{"--embedded", "--count", "10", "--catalogue", temp_path("missing.cat")}, "missing.cat"},
    {{"--embedded", "--count", "10", "--catalogue", cat_bad}, cat_bad + ":3"},
    {{"--embedded", "--count", "10", "--catalogue", cat_weights}, cat_weights + ":2"},
    {{"--embedded", "--count", "10", "--catalogue", cat_bad, "--base", tar_base}, "--catalogue"},
    {{"--embedded", "--base", tar_base, "--count", "10", "--"}, "--"},
  };
  for (const auto& c : cases) {
    std::string line;
    for (const auto& a : c.args)
      line += a + " ";
    CAPTURE(line);
    auto r = load(c.args);
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(contains(r.err, c.names), "stderr should name '" << c.names << "': "
                                                                   << r.describe());
    CHECK_MESSAGE(contains(r.err, "dsec-load --help"), r.describe());
    CHECK(r.out.empty());
  }
  auto h = load({"--help"});
  CHECK(h.status == 0);
  CHECK(contains(h.out, "--concurrency"));
}

TEST_CASE("60 episodes in batches of 4 against a dsecd: all created, JSON complete") {
  node n;
  auto json_path = temp_path("run.json");
  auto r = load({"--connect", n.where(), "--count", "60", "--concurrency", "8", "--batch", "4",
                 "--commands", "2", "--sessions", "2", "--base", tar_base, "--json", json_path,
                 "--quiet", "--", "sh", "-c", "echo hi"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.err.empty()); // --quiet
  CHECK(contains(r.out, "created    60"));
  auto j = read_json(json_path);
  for (const char* k : {"created", "failed", "rate_per_s", "count", "concurrency", "wall_s"})
    REQUIRE_MESSAGE(j.has(k), "no '" << k << "'");
  CHECK(j["created"].num() == 60);
  CHECK(j["failed"].num() == 0);
  CHECK(j["count"].num() == 60);
  CHECK(j["concurrency"].num() == 8);
  CHECK(j["rate_per_s"].num() > 0);
  CHECK(j["wall_s"].num() > 0);
  CHECK_FALSE(j.has("chronus_ms"));
  check_latency(j, "create_ms", 60);
  check_latency(j, "exec_ms", 120);
  check_latency(j, "destroy_ms", 60);
  CHECK(j["failures"].arr().empty());
  n.check_empty();
  auto s = node_stats_of(*n.c);
  CHECK(s.created == 60);
  CHECK(s.destroyed == 60);
  n.finish();
}

TEST_CASE("--hold: every sandbox exists at once before the commands run") {
  node n;
  auto json_path = temp_path("hold.json");
  auto r = load({"--connect", n.where(), "--count", "24", "--concurrency", "6", "--hold",
                 "--base", tar_base, "--json", json_path});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(contains(r.out, "--hold"));
  // Not quiet, and stderr is not a terminal: whole progress lines.
  CHECK(contains(r.err, "created 24/24"));
  CHECK_FALSE(contains(r.err, "\r"));
  auto j = read_json(json_path);
  CHECK(j["created"].num() == 24);
  CHECK(j["failed"].num() == 0);
  check_latency(j, "exec_ms", 24);
  n.check_empty();
  n.finish();
}

TEST_CASE("--hold keeps all N live until the last is created") {
  node n;
  // With --concurrency 3 and no --hold the node never has more than 3 of them;
  // with --hold all 12 are live while the commands (sleep 1, 3 at a time) run.
  background bg({env_path("DSEC_LOAD_BIN"), "--connect", n.where(), "--count", "12",
                 "--concurrency", "3", "--hold", "--quiet", "--base", tar_base, "--", "sleep",
                 "1"});
  CHECK(eventually([&] {
    auto s = n.c->stats();
    return s && s->live == 12;
  }));
  auto end = bg.wait();
  CHECK_MESSAGE(end.status == 0, end.describe());
  CHECK(contains(end.out, "created    12"));
  n.check_empty();
  n.finish();
}

TEST_CASE("a catalogue with a missing layer: its episodes fail with the node's message") {
  node n;
  auto cat = temp_path("envs.cat");
  {
    std::ofstream f{cat};
    f << "# base, workdir, tools, weight\n"
      << tar_base << " - - 3\n"
      << tar_base << " wd@1 ta@1 2\n"
      << tar_base << " - nope@7 2   # no such layer\n";
  }
  auto json_path = temp_path("cat.json");
  auto r = load({"--connect", n.where(), "--count", "40", "--concurrency", "8", "--catalogue",
                 cat, "--json", json_path, "--quiet"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK(contains(r.out, "failures"));
  CHECK(contains(r.out, "nope@7"));
  CHECK(contains(r.out, cat + ":4"));
  auto j = read_json(json_path);
  const auto& envs = j["environments"].arr();
  REQUIRE(envs.size() == 3);
  double episodes = 0, created = 0, failed = 0;
  for (const auto& e : envs) {
    episodes += e["episodes"].num();
    created += e["created"].num();
    failed += e["failed"].num();
  }
  CHECK(episodes == 40);
  CHECK(created == j["created"].num());
  CHECK(failed == j["failed"].num());
  CHECK(j["created"].num() + j["failed"].num() == 40);
  // The missing layer's line: every episode failed, none created.
  CHECK(envs[2]["episodes"].num() > 0);
  CHECK(envs[2]["failed"].num() == envs[2]["episodes"].num());
  CHECK(envs[2]["created"].num() == 0);
  CHECK(envs[0]["failed"].num() == 0);
  CHECK(envs[1]["failed"].num() == 0);
  const auto& fails = j["failures"].arr();
  REQUIRE(!fails.empty());
  CHECK(contains(fails[0]["message"].str(), "nope@7"));
  CHECK(fails[0]["count"].num() == envs[2]["failed"].num());
  n.check_empty();
  n.finish();
}

// The sum of `key` over a report's timeline bins.
double timeline_sum(const json& figures, const std::string& key) {
  double sum = 0;
  for (const auto& b : figures["timeline"].arr())
    sum += b[key].num();
  return sum;
}

// The sum of a report's histogram counts for one kind of call.
double histogram_sum(const json& figures, const std::string& kind) {
  double sum = 0;
  for (const auto& b : figures["histograms"][kind].arr())
    sum += b["count"].num();
  return sum;
}

// How often `part` occurs in `s`.
size_t occurrences(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size()))
    ++n;
  return n;
}

TEST_CASE("--report: an HTML page of plots, and its figures as JSON that add up to the run's") {
  node n;
  auto cat = temp_path("report.cat");
  {
    std::ofstream f{cat};
    f << tar_base << " - - 3\n" << tar_base << " - nope@7 1\n";
  }
  auto html_path = temp_path("report.html"), json_path = temp_path("report-run.json");
  auto r = load({"--connect", n.where(), "--count", "30", "--concurrency", "6", "--commands", "2",
                 "--catalogue", cat, "--json", json_path, "--report", html_path, "--quiet", "--",
                 "sh", "-c", "echo hi"});
  CHECK_MESSAGE(r.status == 1, r.describe()); // nope@7's episodes failed
  auto run = read_json(json_path);
  auto figures = read_json(temp_path("report.json")); // beside report.html
  double created = run["created"].num(), failed = run["failed"].num();
  REQUIRE(created > 0);
  REQUIRE(failed > 0);
  CHECK(created + failed == 30);
  // The report's summary is the run's JSON.
  CHECK(figures["summary"]["created"].num() == created);
  CHECK(figures["summary"]["failed"].num() == failed);
  // Every completed call is in one time bin and one histogram bucket.
  REQUIRE(figures["bin_s"].num() > 0);
  REQUIRE(!figures["timeline"].arr().empty());
  CHECK(timeline_sum(figures, "creates") == created);
  CHECK(timeline_sum(figures, "failures") == failed);
  CHECK(timeline_sum(figures, "execs") == 2 * created);
  CHECK(timeline_sum(figures, "destroys") == created);
  CHECK(histogram_sum(figures, "create") == created);
  CHECK(histogram_sum(figures, "exec") == 2 * created);
  CHECK(histogram_sum(figures, "destroy") == created);
  CHECK(histogram_sum(figures, "chronus") == 0);
  // Bins start at 0 and follow each other by bin_s; buckets rise, the last unbounded.
  const auto& tl = figures["timeline"].arr();
  for (size_t i = 0; i < tl.size(); ++i)
    CHECK(std::abs(tl[i]["t"].num() - static_cast<double>(i) * figures["bin_s"].num()) < 1e-9);
  const auto& buckets = figures["histograms"]["create"].arr();
  for (size_t i = 1; i + 1 < buckets.size(); ++i)
    CHECK(buckets[i]["le_ms"].num() > buckets[i - 1]["le_ms"].num());
  CHECK(std::holds_alternative<std::nullptr_t>(buckets.back()["le_ms"].v));
  // A bin's p50 is at most its p99; a bin without creates has neither.
  for (const auto& b : tl) {
    if (b["creates"].num() > 0)
      CHECK(b["create_p50_ms"].num() <= b["create_p99_ms"].num());
    else
      CHECK(std::holds_alternative<std::nullptr_t>(b["create_p50_ms"].v));
  }

  // The page: self-contained (no script to run, nothing fetched), the plots
  // there, one bar per non-empty bucket carrying its count, and the same
  // figures in its data element.
  auto html = slurp(html_path);
  REQUIRE(contains(html, "<!DOCTYPE html>"));
  CHECK_FALSE(contains(html, "src="));
  CHECK_FALSE(contains(html, "href="));
  CHECK(occurrences(html, "<script") == 1);
  CHECK(contains(html, "<script type=\"application/json\" id=\"dsec-load-data\">"));
  for (const char* id : {"id=\"rates\"", "id=\"create-latency\"", "id=\"histogram-create\"",
                         "id=\"histogram-exec\"", "id=\"histogram-destroy\"", "id=\"summary\"",
                         "id=\"failures\""})
    CHECK_MESSAGE(contains(html, id), id);
  CHECK(contains(html, "nope@7"));
  CHECK(occurrences(html, "data-series=\"creates/s\"") >= 1);
  double bars = 0;
  for (auto at = html.find("class=\"bar\" data-le=\""); at != std::string::npos;
       at = html.find("class=\"bar\" data-le=\"", at + 1)) {
    auto c = html.find("data-count=\"", at);
    REQUIRE(c != std::string::npos);
    bars += std::stod(html.substr(c + 12));
  }
  CHECK(bars == created + 2 * created + created); // create, exec and destroy bars
  auto data_at = html.find("id=\"dsec-load-data\">");
  auto data_end = html.find("</script>", data_at);
  REQUIRE(data_end != std::string::npos);
  auto data = html.substr(data_at + 20, data_end - data_at - 20);
  json embedded;
  try {
    embedded = json_reader{data}.parse();
  } catch (const std::exception& e) {
    FAIL("the page's JSON does not parse: " << e.what());
  }
  CHECK(timeline_sum(embedded, "creates") == created);
  CHECK(histogram_sum(embedded, "exec") == 2 * created);
  n.check_empty();
  n.finish();
}

TEST_CASE("--report: a .json name is refused (the JSON goes beside the HTML)") {
  auto r = load({"--embedded", "--count", "1", "--base", tar_base, "--report",
                 temp_path("x.json")});
  CHECK(r.status == 2);
  CHECK_MESSAGE(contains(r.err, "--report"), r.describe());
}

TEST_CASE("Chronus: 3 events per episode reach the watch") {
  node n;
  auto json_path = temp_path("chronus.json");
  auto r = load({"--connect", n.where(), "--count", "16", "--concurrency", "4", "--events", "3",
                 "--json", json_path, "--quiet", "--base", tar_base});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(contains(r.out, "chronus"));
  auto j = read_json(json_path);
  CHECK(j["created"].num() == 16);
  CHECK(j["failed"].num() == 0);
  check_latency(j, "chronus_ms", 16 * 3);
  CHECK(node_stats_of(*n.c).chronus_events == 16 * 3);
  n.check_empty();
  n.finish();
}

TEST_CASE("SIGINT mid-run: exit 130, partial table, nothing left on the node") {
  node n;
  auto json_path = temp_path("sigint.json");
  background bg({env_path("DSEC_LOAD_BIN"), "--connect", n.where(), "--count", "400",
                 "--concurrency", "8", "--json", json_path, "--base", tar_base, "--", "sleep",
                 "600"});
  // Wait until the run is in full swing: 8 sandboxes live, a command running
  // in each (dsec-load sends its exec only once it has the create's reply).
  CHECK(eventually([&] {
    auto l = node_list(*n.c);
    return l.size() == 8
           && std::all_of(l.begin(), l.end(), [](auto& x) { return x.running >= 1; });
  }));
  bg.kill(SIGINT);
  auto end = bg.wait();
  CHECK_MESSAGE(end.status == 130, end.describe());
  CHECK(contains(end.out, "stopped by INT"));
  CHECK(contains(end.err, "stopping"));
  auto j = read_json(json_path);
  // dsec-load had all 8 creates' replies; their commands were cancelled.
  CHECK(j["created"].num() == 8);
  CHECK(j["cancelled"].num() == 8);
  CHECK(j["failed"].num() == 0);
  CHECK(j["not_started"].num() == 392);
  n.check_empty();
  n.finish();
}

TEST_CASE("failing commands are grouped by how they ended, with what one of each said") {
  node n;
  auto json_path = temp_path("fails.json");
  // Each episode's command says something of its own on stderr and exits 1.
  auto r = load({"--connect", n.where(), "--count", "12", "--concurrency", "4", "--json",
                 json_path, "--quiet", "--base", tar_base, "--", "sh", "-c",
                 "echo \"no such thing $$\" >&2; exit 1"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  auto j = read_json(json_path);
  const auto& fails = j["failures"].arr();
  REQUIRE(fails.size() == 1);
  CHECK(fails[0]["message"].str() == "exec: exited with status 1");
  CHECK(fails[0]["count"].num() == 12);
  CHECK(contains(fails[0]["example"].str(), "no such thing "));
  CHECK(contains(r.out, "e.g. stderr: no such thing "));
  n.check_empty();
  n.finish();
}
