// Metrics of a run (normcore/metrics.h): JSON lines as the run goes, and the curves as an SVG
// drawn here (panels of polylines, axes with "nice" ticks, a legend): no plotting dependency.
#include "normcore/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "normcore/error.h"

namespace normcore {
namespace train {

using Json = nlohmann::json;

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  out_ = std::make_unique<std::ofstream>(path, append ? std::ios::app : std::ios::trunc);
  NC_CHECK(out_->good(), IOError, "MetricsLog: cannot open ", path, " for writing");
}

void MetricsLog::log(int64_t step, const std::string& phase,
                     const std::vector<std::pair<std::string, double>>& values) {
  NC_CHECK(!phase.empty(), ValueError, "MetricsLog::log: the phase is empty (\"train\", \"eval\", ...)");
  MetricsRecord record{step, phase, {}};
  nlohmann::ordered_json line = {{"step", step}, {"phase", phase}};
  for (const auto& [name, value] : values) {
    NC_CHECK(!name.empty() && name != "step" && name != "phase", ValueError, "MetricsLog::log: metric name '", name,
             "' is empty or reserved (step, phase)");
    record.values[name] = value;
    line[name] = std::isfinite(value) ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
  }
  records_.push_back(std::move(record));
  if (out_) {
    *out_ << line.dump() << '\n';
    out_->flush();
    NC_CHECK(out_->good(), IOError, "MetricsLog: writing ", path_, " failed");
  }
}

std::vector<MetricsRecord> read_metrics(const std::string& path) {
  std::ifstream in(path);
  NC_CHECK(in.good(), IOError, "read_metrics: cannot open ", path);
  std::vector<MetricsRecord> records;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    NC_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("phase") &&
                 j["phase"].is_string(),
             IOError, "read_metrics: ", path, " line ", line,
             " is not a JSON object with an integer \"step\" and a string \"phase\"");
    MetricsRecord record{j["step"].get<int64_t>(), j["phase"].get<std::string>(), {}};
    for (const auto& [name, value] : j.items()) {
      if (name == "step" || name == "phase") continue;
      NC_CHECK(value.is_number() || value.is_null(), IOError, "read_metrics: ", path, " line ", line, ": \"", name,
               "\" is not a number or null");
      record.values[name] = value.is_null() ? NAN : value.get<double>();
    }
    records.push_back(std::move(record));
  }
  return records;
}

namespace {

// About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int count) {
  const double span = hi - lo;
  const double raw = span / count, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / magnitude < 1.5 ? magnitude : raw / magnitude < 3.5 ? 2 * magnitude : 5 * magnitude;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  return buffer;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

}  // namespace

std::string curves_svg(const std::vector<MetricsRecord>& records, const std::vector<std::string>& metrics,
                       const std::string& title, const std::string& x_label, int width, int panel_height) {
  NC_CHECK(width >= 200 && panel_height >= 100, ValueError, "curves_svg: the figure must be at least 200 x 100 ",
           "pixels a panel, got ", width, " x ", panel_height);
  std::vector<std::string> shown;
  for (const std::string& m : metrics)
    if (std::any_of(records.begin(), records.end(), [&](const MetricsRecord& r) {
          auto it = r.values.find(m);
          return it != r.values.end() && std::isfinite(it->second);
        }))
      shown.push_back(m);
  std::string asked;
  for (const std::string& m : metrics) asked += (asked.empty() ? "" : ", ") + m;
  NC_CHECK(!shown.empty(), ValueError, "curves_svg: no record has a value of ", asked.empty() ? "any metric" : asked);
  std::vector<std::string> phases;  // in order of appearance: the same color in every panel
  for (const MetricsRecord& r : records)
    if (std::find(phases.begin(), phases.end(), r.phase) == phases.end()) phases.push_back(r.phase);

  const int top = title.empty() ? 10 : 36, left = 70, right = 20, bottom = 40;
  const int height = top + static_cast<int>(shown.size()) * panel_height;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!title.empty())
    svg << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
        << "</text>\n";
  for (size_t p = 0; p < shown.size(); ++p) {
    const std::string& metric = shown[p];
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
    for (const MetricsRecord& r : records) {
      auto it = r.values.find(metric);
      if (it == r.values.end() || !std::isfinite(it->second)) continue;
      x_lo = std::min(x_lo, static_cast<double>(r.step));
      x_hi = std::max(x_hi, static_cast<double>(r.step));
      y_lo = std::min(y_lo, it->second);
      y_hi = std::max(y_hi, it->second);
    }
    if (x_hi == x_lo) x_hi = x_lo + 1;
    const double pad = y_hi > y_lo ? 0.05 * (y_hi - y_lo) : std::max(1e-3, std::abs(y_hi) * 0.05);
    y_lo -= pad;
    y_hi += pad;
    const int y0 = top + static_cast<int>(p) * panel_height, plot_w = width - left - right,
              plot_h = panel_height - bottom - 10;
    auto sx = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * plot_w; };
    auto sy = [&](double y) { return y0 + 10 + (y_hi - y) / (y_hi - y_lo) * plot_h; };
    svg << "<g>\n<rect x=\"" << left << "\" y=\"" << y0 + 10 << "\" width=\"" << plot_w << "\" height=\"" << plot_h
        << "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (double t : ticks(x_lo, x_hi, 6))
      svg << "<line x1=\"" << sx(t) << "\" y1=\"" << y0 + 10 + plot_h << "\" x2=\"" << sx(t) << "\" y2=\""
          << y0 + 14 + plot_h << "\" stroke=\"#888\"/><text x=\"" << sx(t) << "\" y=\"" << y0 + 27 + plot_h
          << "\" text-anchor=\"middle\">" << number(t) << "</text>\n";
    for (double t : ticks(y_lo, y_hi, 5))
      svg << "<line x1=\"" << left << "\" y1=\"" << sy(t) << "\" x2=\"" << left + plot_w << "\" y2=\"" << sy(t)
          << "\" stroke=\"#eee\"/><text x=\"" << left - 6 << "\" y=\"" << sy(t) + 4 << "\" text-anchor=\"end\">"
          << number(t) << "</text>\n";
    svg << "<text x=\"16\" y=\"" << y0 + 10 + plot_h / 2 << "\" transform=\"rotate(-90 16 " << y0 + 10 + plot_h / 2
        << ")\" text-anchor=\"middle\">" << escape(metric) << "</text>\n";
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << y0 + panel_height - 2 << "\" text-anchor=\"middle\">"
        << escape(x_label) << "</text>\n";
    int legend = 0;
    for (size_t k = 0; k < phases.size(); ++k) {
      // The phase's points in step order; a missing or null value breaks the line.
      std::vector<std::pair<double, double>> points;
      std::vector<std::string> segments(1);
      std::vector<const MetricsRecord*> ordered;
      for (const MetricsRecord& r : records)
        if (r.phase == phases[k] && r.values.count(metric)) ordered.push_back(&r);
      if (ordered.empty()) continue;
      std::stable_sort(ordered.begin(), ordered.end(),
                       [](const MetricsRecord* a, const MetricsRecord* b) { return a->step < b->step; });
      for (const MetricsRecord* r : ordered) {
        const double v = r->values.at(metric);
        if (!std::isfinite(v)) {
          if (!segments.back().empty()) segments.emplace_back();
          continue;
        }
        segments.back() += number(sx(static_cast<double>(r->step))) + "," + number(sy(v)) + " ";
        points.emplace_back(sx(static_cast<double>(r->step)), sy(v));
      }
      const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
      for (const std::string& s : segments)
        if (!s.empty())
          svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"" << s << "\"/>\n";
      if (points.size() <= 60)
        for (const auto& [x, y] : points)
          svg << "<circle cx=\"" << number(x) << "\" cy=\"" << number(y) << "\" r=\"2.5\" fill=\"" << color << "\"/>\n";
      svg << "<rect x=\"" << left + plot_w - 110 << "\" y=\"" << y0 + 18 + 16 * legend
          << "\" width=\"12\" height=\"3\" "
          << "fill=\"" << color << "\"/><text x=\"" << left + plot_w - 92 << "\" y=\"" << y0 + 23 + 16 * legend << "\">"
          << escape(phases[k]) << "</text>\n";
      ++legend;
    }
    svg << "</g>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_curves_svg(const std::string& path, const std::vector<MetricsRecord>& records,
                      const std::vector<std::string>& metrics, const std::string& title, const std::string& x_label) {
  const std::string svg = curves_svg(records, metrics, title, x_label);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    NC_CHECK(out.good(), IOError, "write_curves_svg: cannot open ", temporary, " for writing");
    out << svg;
    out.flush();
    NC_CHECK(out.good(), IOError, "write_curves_svg: writing ", temporary, " failed");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  NC_CHECK(!error, IOError, "write_curves_svg: cannot rename ", temporary, " to ", path, ": ", error.message());
}

}  // namespace train
}  // namespace normcore
