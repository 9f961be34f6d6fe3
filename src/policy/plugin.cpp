#include "policy/plugin.h"

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <string>

#include "common/error.h"

namespace kvc::policy {

Plugin::Plugin(void *handle, const kvc_plugin_scorer *table, void *state)
    : handle_(handle), table_(table), state_(state) {}

Plugin::~Plugin() {
  if (table_->destroy) table_->destroy(state_);
  dlclose(handle_);
}

std::shared_ptr<Plugin> Plugin::load(const std::string &path) {
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    fail(Errc::InvalidArgument, "cannot load plugin '" + path + "': " + (e ? e : "unknown error"));
  }
  auto close_fail = [&](Errc c, const std::string &why) {
    dlclose(h);
    fail(c, "plugin '" + path + "': " + why);
  };
  dlerror();
  void *sym = dlsym(h, KVC_PLUGIN_ENTRY);
  if (!sym)
    close_fail(Errc::InvalidArgument, "no symbol " KVC_PLUGIN_ENTRY " (not a libkvcache plugin?)");
  kvc_plugin_get_fn get;
  static_assert(sizeof get == sizeof sym);
  __builtin_memcpy(&get, &sym, sizeof get);
  const kvc_plugin_scorer *t = get(KVC_PLUGIN_ABI_VERSION);
  if (!t)
    close_fail(Errc::Version,
               "does not provide scorer ABI version " + std::to_string(KVC_PLUGIN_ABI_VERSION));
  if (t->abi_version != KVC_PLUGIN_ABI_VERSION)
    close_fail(Errc::Version, "returned ABI version " + std::to_string(t->abi_version) +
                                  ", expected " + std::to_string(KVC_PLUGIN_ABI_VERSION));
  if (t->struct_size < offsetof(kvc_plugin_scorer, score) + sizeof t->score)
    close_fail(Errc::StructSize, "scorer table struct_size " + std::to_string(t->struct_size) +
                                     " is smaller than version 1's");
  if (!t->name || !t->score)
    close_fail(Errc::InvalidArgument, "scorer table without a name or a score function");
  void *state = t->create ? t->create() : nullptr;
  try {
    return std::shared_ptr<Plugin>(new Plugin(h, t, state));
  } catch (...) {
    if (t->destroy) t->destroy(state);
    dlclose(h);
    throw;
  }
}

void Plugin::score(const kvc_plugin_layer_view &view, float *scores_out) const {
  const int rc = table_->score(state_, &view, scores_out);
  if (rc != 0)
    fail(Errc::InvalidArgument, std::string("plugin '") + table_->name +
                                    "' failed to score layer " + std::to_string(view.layer) +
                                    " (returned " + std::to_string(rc) + ")");
  for (uint64_t i = 0; i < view.n_tokens; ++i)
    if (!std::isfinite(scores_out[i]))
      fail(Errc::NonFinite, std::string("plugin '") + table_->name +
                                "' returned a non-finite score for token " + std::to_string(i) +
                                " of layer " + std::to_string(view.layer));
}

}  // namespace kvc::policy
