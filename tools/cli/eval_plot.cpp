// SPDX-License-Identifier: Apache-2.0
// `kvcache eval --plot`: the report drawn by gnuplot, PNG or SVG by extension.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "../runner/error.h"
#include "eval.h"

namespace kvc_cli {
using kvc_runner::RunnerError;

namespace {

/// The extension of `path` after its last '.', in lower case ("" without one).
std::string extension_of(const std::string &path) {
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos) return "";
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext;
}

/// `s` as a gnuplot string literal in single quotes (a quote doubled).
std::string gnuplot_quote(const std::string &s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'')
      out += "''";
    else
      out += ch;
  }
  return out + "'";
}

}  // namespace

void check_plot_target(const std::string &path) {
  const std::string ext = extension_of(path);
  if (ext != "png" && ext != "svg") {
    throw RunnerError("--plot '" + path + "': the file name must end in .png or .svg");
  }
  if (path.find_first_of("\n\r") != std::string::npos)
    throw RunnerError("--plot: the file name must not contain a line break");
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec))
    throw RunnerError("--plot '" + path + "' is a directory");
  const std::filesystem::path dir =
      p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(dir, ec))
    throw RunnerError("--plot '" + path + "': folder '" + dir.string() + "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    throw RunnerError("--plot '" + path + "': folder '" + dir.string() + "' is not writable");
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    throw RunnerError(
        "--plot needs gnuplot, which was not found on PATH (install it, e.g. "
        "apt-get install gnuplot-nox, or leave out --plot)");
  }
}

void write_plot(const EvalReport &rep, const std::string &path) {
  check_plot_target(path);
  const std::string ext = extension_of(path);
  // gnuplot's own output (should `set output` fail, the image itself) goes to
  // stderr, never into our stdout (which may hold the JSON report).
  std::fflush(stdout);
  FILE *gp = popen("gnuplot 1>&2", "w");
  if (gp == nullptr) throw RunnerError("cannot start gnuplot");
  std::fprintf(gp, "set terminal %s size 1000,650\n", ext == "svg" ? "svg" : "png");
  std::fprintf(gp, "set output %s\n", gnuplot_quote(path).c_str());
  std::fprintf(gp, "set grid\nset termoption noenhanced\n");  // strategy names hold '_' and '^'
  const std::size_t n_segments = rep.results.empty() ? 0 : rep.results[0].segment_ppl.size();
  if (n_segments > 1) {
    // Long context: perplexity per segment, one line per strategy.
    std::fprintf(gp, "set title %s\n",
                 gnuplot_quote("Perplexity per segment of " + std::to_string(rep.segment) +
                               " positions: " + rep.model + ", ctx " + std::to_string(rep.ctx) +
                               " (trained " + std::to_string(rep.trained_context) + "), " +
                               std::to_string(rep.tokens_scored) + " tokens")
                     .c_str());
    std::fprintf(gp, "set xlabel 'position (start of segment)'\nset ylabel 'perplexity'\n");
    std::fprintf(gp, "set logscale y\nset key top left\n");
    std::fprintf(gp, "set arrow from %d, graph 0 to %d, graph 1 nohead dashtype 2\n",
                 rep.trained_context, rep.trained_context);
    for (std::size_t r = 0; r < rep.results.size(); ++r) {
      std::fprintf(gp, "$s%zu << EOD\n", r);
      for (std::size_t k = 0; k < n_segments; ++k) {
        if (rep.results[r].segment_ppl[k] > 0)
          std::fprintf(gp, "%zu %.9g\n", k * static_cast<std::size_t>(rep.segment),
                       rep.results[r].segment_ppl[k]);
      }
      std::fprintf(gp, "EOD\n");
    }
    std::string cmd = "plot ";
    for (std::size_t r = 0; r < rep.results.size(); ++r) {
      cmd += (r ? ", " : "") + std::string("$s") + std::to_string(r) +
             " using 1:2 with linespoints lw 2 title " +
             gnuplot_quote(rep.results[r].strategy + (rep.results[r].reference ? " (dense)" : ""));
    }
    std::fprintf(gp, "%s\n", cmd.c_str());
  } else {
    std::fprintf(
        gp, "set title %s\n",
        gnuplot_quote("KV-cache quality loss vs storage size: " + rep.model + ", " +
                      std::to_string(rep.tokens_scored) + " tokens, ctx " + std::to_string(rep.ctx))
            .c_str());
    // Changes from -1 % to +3000 % on one axis: a symmetric log scale,
    // y = sign(d) log10(1 + |d| / 0.1 %), linear below 0.1 %, labelled in percent.
    auto symlog = [](double pct) {
      return (pct < 0 ? -1.0 : 1.0) * std::log10(1.0 + std::fabs(pct) / 0.1);
    };
    std::fprintf(gp,
                 "set xlabel 'effective bits per K/V element (bits of a held token x share of "
                 "positions held; log scale)'\n");
    std::fprintf(gp, "set ylabel 'perplexity change vs dense f32 (symmetric log scale)'\n");
    std::fprintf(gp, "set logscale x 2\nset xtics (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)\n");
    std::string tics;
    for (const double pct :
         {-10.0, -1.0, -0.1, 0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0}) {
      char t[64];
      // (gnuplot reads tic labels as formats: '%%' there is a literal percent sign)
      std::snprintf(t, sizeof t, "%s'%s%g%s' %.6f", tics.empty() ? "" : ", ", pct > 0 ? "+" : "",
                    pct, pct == 0 ? "" : "%%", symlog(pct));
      tics += t;
    }
    std::fprintf(gp, "set ytics (%s)\n", tics.c_str());
    std::fprintf(gp,
                 "set key top right\nset offsets graph 0.05, graph 0.2, graph 0.05, graph 0.05\n");
    std::string cmd;
    for (int evicting = 0; evicting < 2; ++evicting) {
      std::string rows;
      for (const StrategyResult &r : rep.results) {
        if ((r.kept_fraction < 1.0) != (evicting == 1)) continue;
        char line[512];
        std::snprintf(line, sizeof line, "%.6f %.9g \"%s\"\n", r.effective_bits_per_element,
                      symlog(r.ppl_delta_pct), r.strategy.c_str());
        rows += line;
      }
      if (rows.empty()) continue;  // gnuplot warns about an empty series
      std::fprintf(gp, "$d%d << EOD\n%sEOD\n", evicting, rows.c_str());
      const std::string d = "$d" + std::to_string(evicting);
      cmd += std::string(cmd.empty() ? "plot " : ", ") + d + " using 1:2 with points " +
             (evicting ? "pt 5 ps 1.3 lc rgb '#d62728' title 'eviction (tokens dropped)'"
                       : "pt 7 ps 1.3 lc rgb '#1f77b4' title 'all tokens held (codecs)'") +
             ", " + d + " using 1:2:3 with labels left offset 0.6,0 font ',7' notitle";
    }
    std::fprintf(gp, "%s\n", cmd.c_str());
  }
  const int rc = pclose(gp);
  if (rc != 0) throw RunnerError("gnuplot failed to write '" + path + "'");
}

}  // namespace kvc_cli
