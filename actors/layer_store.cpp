#include "actors/layer_store.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <optional>
#include <string>
#include <vector>

#include "actors/types.hpp"
#include "runtime/fd.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace {

struct layer_store_state {
  static inline const char* name = "dsec.layer_store";

  std::optional<store> st;

  // The blobs read last, kept open: a peer reads an image chunk by chunk. A
  // blob removed from the store meanwhile is still served (its bytes are
  // those of its digest) until it falls out of here.
  static constexpr size_t max_open = 8;
  struct open_blob {
    std::string digest;
    unique_fd fd;
    uint64_t size = 0;
    uint64_t last_used = 0;
  };
  std::vector<open_blob> open;
  uint64_t tick = 0;

  expected<open_blob*> blob(const std::string& digest) {
    for (auto& b : open)
      if (b.digest == digest) {
        b.last_used = ++tick;
        return &b;
      }
    DSEC_TRY(fd, st->open_blob(digest));
    struct stat sb{};
    if (::fstat(fd.get(), &sb) != 0)
      return sys_error("cannot stat the image", digest);
    if (open.size() >= max_open) {
      auto oldest = open.begin();
      for (auto it = open.begin(); it != open.end(); ++it)
        if (it->last_used < oldest->last_used)
          oldest = it;
      open.erase(oldest);
    }
    open.push_back({digest, std::move(fd), static_cast<uint64_t>(sb.st_size), ++tick});
    return &open.back();
  }

  expected<layer_meta> describe(const std::string& text) const {
    DSEC_TRY(ref, parse_layer_ref(text));
    DSEC_TRY(info, st->find(ref));
    layer_meta m;
    m.ref = info.ref.to_string();
    m.kind = to_string(info.kind);
    m.digest = info.digest;
    m.size = info.size;
    m.created = info.created;
    m.source = info.source;
    m.on = info.on;
    if (!info.lowers.empty()) {
      // An OCI image: each lower travels as its own blob.
      for (size_t i = 0; i < info.lowers.size() && i < info.blob_paths.size(); ++i) {
        struct stat sb{};
        if (::stat(info.blob_paths[i].c_str(), &sb) != 0)
          return sys_error("cannot stat a lower of image " + text, info.blob_paths[i]);
        m.lowers.push_back(info.lowers[i]);
        m.lower_sizes.push_back(static_cast<uint64_t>(sb.st_size));
      }
      m.config = info.config;
      m.manifest = info.manifest;
    }
    return m;
  }

  expected<std::string> fetch(const std::string& digest, uint64_t offset, uint32_t length) {
    if (length == 0 || length > max_fetch_chunk)
      return make_error(errc::invalid_argument,
                        "a fetch asks for 1 to " + std::to_string(max_fetch_chunk)
                          + " bytes, not " + std::to_string(length));
    DSEC_TRY(b, blob(digest));
    if (offset >= b->size)
      return std::string{};
    std::string out(static_cast<size_t>(std::min<uint64_t>(length, b->size - offset)), '\0');
    size_t got = 0;
    while (got < out.size()) {
      auto n = sys::retry([&] {
        return ::pread(b->fd.get(), out.data() + got, out.size() - got,
                       static_cast<off_t>(offset + got));
      });
      if (n < 0)
        return sys_error("cannot read the image", digest);
      if (n == 0)
        break; // shorter than it was: only the end is missing
      got += static_cast<size_t>(n);
    }
    out.resize(got);
    return out;
  }
};

layer_store_actor::behavior_type
layer_store_impl(layer_store_actor::stateful_pointer<layer_store_state> self, store st,
                 internal_key key) {
  self->state.st.emplace(std::move(st));
  return {
    [=](describe_atom, const internal_key& k,
        const std::string& ref) -> caf::result<internal_key, layer_meta> {
      if (!genuine(k, key, "describe (layer store)"))
        return refuse("describe");
      auto r = self->state.describe(ref);
      if (!r)
        return to_caf(r.error_value());
      return {key, std::move(*r)};
    },
    [=](fetch_atom, const internal_key& k, const std::string& digest, uint64_t offset,
        uint32_t length) -> caf::result<internal_key, std::string> {
      if (!genuine(k, key, "fetch (layer store)"))
        return refuse("fetch");
      auto r = self->state.fetch(digest, offset, length);
      if (!r)
        return to_caf(r.error_value());
      return {key, std::move(*r)};
    },
  };
}

} // namespace

layer_store_actor spawn_layer_store(caf::actor_system& sys, store st, internal_key key) {
  return sys.spawn(layer_store_impl, std::move(st), key);
}

} // namespace dsec
