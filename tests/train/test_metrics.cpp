// Run metrics: MetricsLog's JSON lines read back by read_metrics (nulls for values that are
// not finite, appending on resume), the errors of bad records and files, and the SVG of the
// curves (a panel per metric that has values, a polyline per phase broken at gaps, every
// point inside its panel, a legend), written atomically.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/metrics.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace train = normcore::train;
using normcore_test::throws;

namespace {

class Metrics : public normcore_test::TempDirTest {
 protected:
  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_F(Metrics, LinesReadBackAndAppendOnResume) {
  const std::string path = (dir_ / "m.jsonl").string();
  {
    train::MetricsLog log(path);
    log.log(10, "train", {{"loss", 2.5}, {"lr", 1e-3}});
    log.log(10, "eval", {{"loss", 2.75}, {"accuracy", NAN}});
    EXPECT_EQ(log.records().size(), 2u);
  }
  EXPECT_EQ(read("m.jsonl"), "{\"step\":10,\"phase\":\"train\",\"loss\":2.5,\"lr\":0.001}\n"
                             "{\"step\":10,\"phase\":\"eval\",\"loss\":2.75,\"accuracy\":null}\n");
  train::MetricsLog(path, /*append=*/true).log(20, "train", {{"loss", 2.0}});
  const std::vector<train::MetricsRecord> records = train::read_metrics(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].step, 10);
  EXPECT_EQ(records[0].phase, "train");
  EXPECT_EQ(records[0].values.at("lr"), 1e-3);
  EXPECT_TRUE(std::isnan(records[1].values.at("accuracy")));
  EXPECT_EQ(records[2].step, 20);
  EXPECT_EQ(records[2].values.at("loss"), 2.0);
  // Without append the file starts over; without a path the records stay in memory.
  train::MetricsLog(path).log(1, "train", {{"loss", 1.0}});
  EXPECT_EQ(train::read_metrics(path).size(), 1u);
  train::MetricsLog memory;
  memory.log(3, "train", {{"loss", 1.0}});
  EXPECT_EQ(memory.records().size(), 1u);
}

TEST_F(Metrics, BadRecordsAndFiles) {
  train::MetricsLog log;
  throws<nc::ValueError>([&] { log.log(1, "", {{"loss", 1.0}}); }, {"MetricsLog::log", "phase"})();
  throws<nc::ValueError>([&] { log.log(1, "train", {{"step", 1.0}}); }, {"MetricsLog::log", "'step'", "reserved"})();
  throws<nc::IOError>([&] { train::MetricsLog((dir_ / "no/such/dir/m.jsonl").string()); }, {"MetricsLog", "m.jsonl"})();
  throws<nc::IOError>([&] { train::read_metrics((dir_ / "none.jsonl").string()); }, {"read_metrics", "none.jsonl"})();
  std::ofstream(dir_ / "bad.jsonl") << "{\"step\": 1, \"phase\": \"train\"}\n\n[1, 2]\n";
  throws<nc::IOError>([&] { train::read_metrics((dir_ / "bad.jsonl").string()); }, {"bad.jsonl", "line 3"})();
  std::ofstream(dir_ / "text.jsonl") << "{\"step\": 1, \"phase\": \"train\", \"loss\": \"low\"}\n";
  throws<nc::IOError>([&] { train::read_metrics((dir_ / "text.jsonl").string()); }, {"line 1", "\"loss\""})();
}

TEST_F(Metrics, CurvesSvgDrawsEveryPhaseInsideItsPanel) {
  train::MetricsLog log;
  for (int step = 10; step <= 100; step += 10) {
    log.log(step, "train", {{"loss", 5.0 - step / 50.0}, {"lr", 1e-3}});
    if (step % 50 == 0) log.log(step, "validation", {{"loss", 5.5 - step / 50.0}});
  }
  log.log(110, "train", {{"loss", NAN}});  // a gap, then one more point
  log.log(120, "train", {{"loss", 2.5}});
  const int width = 600, panel = 200;
  const std::string svg = train::curves_svg(log.records(), {"loss", "accuracy", "lr"}, "a <run>", "step", width, panel);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;run&gt;"), std::string::npos);  // the title, escaped
  EXPECT_EQ(count(svg, "<g>"), 2);                          // loss and lr; no record has accuracy
  // loss: train in two pieces (the gap) and validation; lr: train.
  EXPECT_EQ(count(svg, "<polyline"), 4);
  EXPECT_NE(svg.find(">validation</text>"), std::string::npos);
  // Every point lies inside the plot areas: x in [70, width - 20], y inside the two panels.
  const std::regex point("<circle cx=\"([0-9.]+)\" cy=\"([0-9.]+)\"");
  int points = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), point); it != std::sregex_iterator(); ++it, ++points) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
    EXPECT_GE(x, 70 - 1e-6);
    EXPECT_LE(x, width - 20 + 1e-6);
    EXPECT_GE(y, 36);
    EXPECT_LE(y, 36 + 2 * panel);
  }
  EXPECT_EQ(points, 11 + 2 + 10);  // train loss (the null left out), validation loss, lr (steps 10 to 100)
  throws<nc::ValueError>([&] { train::curves_svg(log.records(), {"accuracy"}); }, {"curves_svg", "accuracy"})();
  const std::string path = (dir_ / "c.svg").string();
  train::write_curves_svg(path, log.records(), {"loss"});
  EXPECT_EQ(count(read("c.svg"), "<g>"), 1);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}
