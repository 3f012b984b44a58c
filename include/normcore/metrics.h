// A training run's metrics where a person can look at them: one JSON object a line
// (metrics.jsonl: the step, the phase, the values) as the run goes, and an SVG of the curves
// (each metric against the step, a line per phase) drawn by the library itself.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace train {

// What was measured at one step of one phase ("train", "eval", ...): named values (loss,
// lr, accuracy, tokens_per_s, ...).
struct MetricsRecord {
  int64_t step = 0;
  std::string phase;
  std::map<std::string, double> values;
};

// Keeps a run's records and, given a path, appends each as a JSON line (flushed, so the
// file can be watched while the run goes). A resumed run appends to the file it left.
class MetricsLog {
 public:
  // path empty: records in memory only. append false truncates an existing file. IOError
  // naming the file when it cannot be opened.
  explicit MetricsLog(const std::string& path = "", bool append = false);
  // ValueError for an empty phase or a metric name that is empty; values that are not
  // finite are written as null.
  void log(int64_t step, const std::string& phase, const std::vector<std::pair<std::string, double>>& values);
  const std::vector<MetricsRecord>& records() const { return records_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  std::vector<MetricsRecord> records_;
};

// The records of a metrics.jsonl file (MetricsLog's, or any lines {"step": N, "phase": "...",
// name: number or null, ...}); IOError naming the file and the line for anything else.
std::vector<MetricsRecord> read_metrics(const std::string& path);

// An SVG (width x panel_height pixels a panel) with one panel per name in `metrics` that some
// record has, each the metric against the step (labelled x_label: "step", "epoch") with a
// line and points per phase, axes with ticks, and a legend. Null values are gaps.
// ValueError when no record has any of the metrics.
std::string curves_svg(const std::vector<MetricsRecord>& records, const std::vector<std::string>& metrics,
                       const std::string& title = "", const std::string& x_label = "step", int width = 720,
                       int panel_height = 260);
// curves_svg written to path (atomically: a temporary file renamed over it).
void write_curves_svg(const std::string& path, const std::vector<MetricsRecord>& records,
                      const std::vector<std::string>& metrics, const std::string& title = "",
                      const std::string& x_label = "step");

}  // namespace train
}  // namespace normcore

#pragma GCC visibility pop
