// Scorer plugins: shared objects implementing include/kvcache/kvcache_plugin.h.
#pragma once
#include <memory>
#include <string>

#include "kvcache/kvcache_plugin.h"

namespace kvc::policy {

class Plugin {
 public:
  // dlopen()s `path`, looks up kvc_plugin_get() and checks the ABI version
  // and the table. Throws Error (InvalidArgument: cannot open / missing
  // symbol / bad table; Version: ABI version mismatch).
  static std::shared_ptr<Plugin> load(const std::string &path);
  ~Plugin();
  Plugin(const Plugin &) = delete;
  Plugin &operator=(const Plugin &) = delete;

  const char *name() const { return table_->name; }
  // Calls the scorer; throws Error(Internal-free: InvalidArgument) when it
  // reports failure or returns non-finite scores.
  void score(const kvc_plugin_layer_view &view, float *scores_out) const;

 private:
  Plugin(void *handle, const kvc_plugin_scorer *table, void *state);
  void *handle_;
  const kvc_plugin_scorer *table_;
  void *state_;
};

}  // namespace kvc::policy
