// Temporary folders of the C++ tests (disk tiers, stores): a fresh folder
// under /tmp and its recursive removal.
#pragma once
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace kvtest {

// A fresh folder /tmp/<name>_XXXXXX (aborts when none can be made).
inline std::string temp_dir(const char *name) {
  std::string t = std::string("/tmp/") + name + "_XXXXXX";
  if (!mkdtemp(t.data())) std::abort();
  return t;
}

// Removes a folder and everything under it.
inline void remove_dir(const std::string &d) {
  if (DIR *dp = opendir(d.c_str())) {
    for (dirent *e; (e = readdir(dp)) != nullptr;)
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        const std::string p = d + "/" + e->d_name;
        if (unlink(p.c_str()) != 0) remove_dir(p);
      }
    closedir(dp);
  }
  rmdir(d.c_str());
}

}  // namespace kvtest
