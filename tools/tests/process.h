// SPDX-License-Identifier: Apache-2.0
// Runs a program and captures its output and how it ended (test helper).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

struct ProcessResult {
  bool started = false;
  bool exited = false;  ///< false: killed by a signal
  int exit_code = -1;
  int signal = 0;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

inline std::string drain(int fd) {
  std::string s;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    s.append(buf, static_cast<std::size_t>(n));
  }
  return s;
}

/// Runs argv[0] with arguments argv; stdout and stderr go to temporary files.
inline ProcessResult run_process(const std::vector<std::string> &argv) {
  ProcessResult r;
  FILE *out = std::tmpfile(), *err = std::tmpfile();
  if (out == nullptr || err == nullptr) return r;
  const pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    dup2(fileno(out), 1);
    dup2(fileno(err), 2);
    std::vector<char *> args;
    for (const std::string &a : argv) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.started = true;
  r.exited = WIFEXITED(status);
  if (r.exited) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::rewind(out);
  std::rewind(err);
  r.out = drain(fileno(out));
  r.err = drain(fileno(err));
  std::fclose(out);
  std::fclose(err);
  return r;
}
