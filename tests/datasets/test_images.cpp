// Color images for the ResNet classifiers: PPM/PGM/PNG reading (binary and plain, gray
// repeated into RGB, bad and lying headers refused), bilinear resizing against values
// worked out by hand, torchvision's evaluation preprocessing, and ImageClassifier against
// the ResNet's own forward, from C++ and through the C API.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "normcore/normcore_c.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::relative_error;
using normcore_test::throws;
using normcore_test::values;

namespace {

class Images : public normcore_test::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

}  // namespace

TEST_F(Images, ReadsPpmAndPgm) {
  // 2 x 1 RGB: red, then (0, 128, 255); binary and plain give the same tensor.
  const std::string binary =
      write("a.ppm", std::string("P6\n# a comment\n2 1\n255\n") + std::string("\xff\x00\x00\x00\x80\xff", 6));
  const std::string plain = write("b.ppm", "P3 2 1 255\n255 0 0  0 128 255\n");
  const Tensor a = nc::data::read_color_image(binary), b = nc::data::read_color_image(plain);
  EXPECT_EQ(a.shape(), (nc::Shape{3, 1, 2}));
  EXPECT_EQ(values(a), (std::vector<double>{1, 0, 0, 128 / 255.0f, 0, 1}));
  EXPECT_EQ(values(a), values(b));
  // 16-bit samples, and gray repeated into the three channels.
  const Tensor wide = nc::data::read_color_image(
      write("c.ppm", std::string("P6 1 1 65535\n") + std::string("\xff\xff\x00\x00\x80\x00", 6)));
  EXPECT_EQ(values(wide), (std::vector<double>{1, 0, 32768 / 65535.0f}));
  const Tensor gray = nc::data::read_color_image(write("d.pgm", "P2 2 1 4\n0 2\n"));
  EXPECT_EQ(values(gray), (std::vector<double>{0, 0.5, 0, 0.5, 0, 0.5}));
  // The Fashion-MNIST test images (PGM, and PNG where libpng is built in) as color.
  const std::filesystem::path images = std::filesystem::path(NORMCORE_TEST_DATA_DIR) / "images";
  const Tensor boot = nc::data::read_color_image((images / "t10k-0-ankle-boot.pgm").string());
  EXPECT_EQ(boot.shape(), (nc::Shape{3, 28, 28}));
  EXPECT_EQ(values(boot.select(0, 2)),
            values(nc::models::read_image((images / "t10k-0-ankle-boot.pgm").string()).select(0, 0)));
}

TEST_F(Images, RefusesBadFiles) {
  throws<nc::IOError>([&] { nc::data::read_color_image((dir_ / "none.ppm").string()); }, {"cannot open", "none.ppm"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("x.bmp", "BM......")); }, {"x.bmp", "neither"})();
  // A header claiming far more pixels than the file holds is refused before any buffer.
  throws<nc::IOError>([&] { nc::data::read_color_image(write("big.ppm", "P6 16000 16000 255\nabc")); },
                      {"big.ppm", "768000000 bytes", "the file has 3"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("huge.ppm", "P6 99999 2 255\n")); },
                      {"huge.ppm", "out of range"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("max.ppm", "P3 1 1 0\n0 0 0\n")); },
                      {"max.ppm", "maximum value 0"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("over.ppm", "P3 1 1 10\n0 11 0\n")); },
                      {"over.ppm", "11 exceeds the maximum 10"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("short.ppm", "P3 2 1 255\n1 2 3 4\n")); },
                      {"short.ppm", "bad PNM pixel"})();
  throws<nc::IOError>([&] { nc::data::read_color_image(write("w.ppm", "P6 -2 1 255\n")); }, {"w.ppm", "width"})();
}

TEST(ResizeBilinear, HalfPixelCenters) {
  // [1, 2] -> 4 wide: output x samples input (x + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25,
  // 0.75, 1.25 (its neighbours clamp to 1): 1, 1.25, 1.75, 2.
  const Tensor row = nc::from_vector<float>({1, 2}, {1, 1, 2});
  EXPECT_EQ(values(nc::data::resize_bilinear(row, 1, 4)), (std::vector<double>{1, 1.25, 1.75, 2}));
  // 4 -> 2: samples at 0.5 and 2.5, the means of the pairs.
  const Tensor four = nc::from_vector<float>({0, 2, 4, 8}, {1, 1, 4});
  EXPECT_EQ(values(nc::data::resize_bilinear(four, 1, 2)), (std::vector<double>{1, 6}));
  // 2x2 -> 3x3 in both directions at once, per channel.
  const Tensor square = nc::from_vector<float>({0, 1, 2, 3, 10, 10, 10, 10}, {2, 2, 2});
  const Tensor big = nc::data::resize_bilinear(square, 3, 3);
  EXPECT_EQ(big.shape(), (nc::Shape{2, 3, 3}));
  // Row and column positions -1/6 -> 0, 0.5, 7/6 -> 1: the center is the mean of the four.
  EXPECT_NEAR(big.select(0, 0).select(0, 1).select(0, 1).item<double>(), 1.5, 1e-6);
  EXPECT_EQ(values(big.select(0, 1)), std::vector<double>(9, 10.0));
  EXPECT_EQ(values(nc::data::resize_bilinear(square, 2, 2)), values(square));  // the same size is the identity
  throws<nc::ShapeError>(
      [&] {
        nc::data::resize_bilinear(nc::zeros({4, 4}), 2, 2);
      },
      {"resize_bilinear", "[C, H, W]"})();
  throws<nc::ValueError>([&] { nc::data::resize_bilinear(square, 0, 2); }, {"resize_bilinear", "0x2"})();
}

TEST(ImagenetPreprocess, ResizesTheShorterSideCropsAndNormalizes) {
  // A 300 x 600 (H x W) image: the shorter side to 256, the other to 512; the center 224.
  const Tensor flat = nc::full({3, 300, 600}, 0.5);
  const Tensor out = nc::data::imagenet_preprocess(flat);
  EXPECT_EQ(out.shape(), (nc::Shape{3, 224, 224}));
  const std::vector<double> mean{0.485, 0.456, 0.406}, stddev{0.229, 0.224, 0.225};
  for (int64_t c = 0; c < 3; ++c)
    EXPECT_NEAR(nc::max(nc::abs(nc::sub(out.select(0, c), (0.5 - mean[c]) / stddev[c]))).item<double>(), 0, 1e-5);
  // The crop is centered: a ramp along the width keeps its middle.
  nc::Generator gen(1);
  const Tensor image = nc::rand({3, 256, 320}, DType::F32, &gen);
  const Tensor cropped = nc::data::imagenet_preprocess(image, 256, 224);
  const Tensor expected = nc::div(nc::sub(image.narrow(1, 16, 224).narrow(2, 48, 224),
                                          nc::from_vector<float>({0.485f, 0.456f, 0.406f}, {3, 1, 1})),
                                  nc::from_vector<float>({0.229f, 0.224f, 0.225f}, {3, 1, 1}));
  EXPECT_LT(relative_error(cropped, expected), 1e-6);
  throws<nc::ShapeError>(
      [&] {
        nc::data::imagenet_preprocess(nc::zeros({1, 8, 8}));
      },
      {"imagenet_preprocess", "[3, H, W]"})();
  throws<nc::ValueError>([&] { nc::data::imagenet_preprocess(flat, 100, 224); }, {"imagenet_preprocess", "crop 224"})();
}

TEST_F(Images, ImageClassifierMatchesTheResNet) {
  nc::Generator gen(2);
  const auto model = nc::models::resnet("resnet18", 4, &gen);
  model->eval();
  const std::string weights = (dir_ / "resnet18.safetensors").string();
  model->save(weights);
  const std::string labels = write("labels.txt", "cat\ndog\r\nbird\nfish\n");
  const nc::models::ImageClassifier classifier("resnet18", weights, nc::Device::cpu(), labels, 72, 64);
  EXPECT_EQ(classifier.classes(), 4);
  EXPECT_EQ(classifier.class_name(1), "dog");
  const Tensor image = nc::rand({3, 80, 100}, DType::F32, &gen);
  const std::vector<nc::models::ImageClassifier::Prediction> top = classifier.predict(image, 3);
  ASSERT_EQ(top.size(), 3u);
  nc::autograd::NoGradGuard no_grad;
  const std::vector<double> p =
      values(nc::softmax((*model)(nc::data::imagenet_preprocess(image, 72, 64).unsqueeze(0)), 1).select(0, 0));
  for (size_t i = 0; i < top.size(); ++i) {
    EXPECT_NEAR(top[i].probability, p[static_cast<size_t>(top[i].label)], 1e-6);
    if (i > 0) EXPECT_GE(top[i - 1].probability, top[i].probability);
    EXPECT_EQ(top[i].name, (std::vector<std::string>{"cat", "dog", "bird", "fish"}[static_cast<size_t>(top[i].label)]));
  }
  // Without labels the names are the class numbers; a labels file of another length is refused.
  EXPECT_EQ(nc::models::ImageClassifier("resnet18", weights).class_name(3), "3");
  const std::string three = write("l3.txt", "a\nb\nc\n");
  throws<nc::IOError>([&] { nc::models::ImageClassifier("resnet18", weights, nc::Device::cpu(), three); },
                      {"ImageClassifier", "l3.txt", "3 lines", "4 classes"})();
  throws<nc::ShapeError>(
      [&] {
        classifier.probabilities(nc::zeros({1, 3, 32, 32}));
      },
      {"ImageClassifier::probabilities", "[B, 3, 64, 64]", "[1, 3, 32, 32]"})();
}

TEST_F(Images, CApiReadsAndClassifies) {
  nc::Generator gen(3);
  const auto model = nc::models::resnet("resnet18", 5, &gen);
  const std::string weights = (dir_ / "r18.safetensors").string();
  model->save(weights);
  const std::string labels = write("labels.txt", "a\nb\nc\nd\ne\n");
  std::string ppm = "P3 20 12 255\n";
  for (int i = 0; i < 20 * 12 * 3; ++i) ppm += std::to_string((i * 37) % 256) + " ";
  const std::string image = write("img.ppm", ppm);

  int64_t height = 0, width = 0;
  ASSERT_EQ(nc_color_image_read(image.c_str(), nullptr, 0, &height, &width), NC_OK) << nc_last_error();
  EXPECT_EQ(height, 12);
  EXPECT_EQ(width, 20);
  std::vector<float> pixels(static_cast<size_t>(3 * height * width));
  EXPECT_EQ(nc_color_image_read(image.c_str(), pixels.data(), pixels.size() - 1, &height, &width), NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("too small for the 720 values"), std::string::npos) << nc_last_error();
  ASSERT_EQ(nc_color_image_read(image.c_str(), pixels.data(), pixels.size(), &height, &width), NC_OK);
  EXPECT_EQ(std::vector<double>(pixels.begin(), pixels.end()), values(nc::data::read_color_image(image)));

  nc_image_classifier* c = nullptr;
  ASSERT_EQ(nc_image_classifier_load("resnet18", weights.c_str(), labels.c_str(), "cpu", &c), NC_OK) << nc_last_error();
  EXPECT_EQ(nc_image_classifier_classes(c), 5);
  EXPECT_STREQ(nc_image_classifier_class_name(c, 4), "e");
  EXPECT_EQ(nc_image_classifier_class_name(c, 5), nullptr);
  int64_t top[3];
  float p[3];
  ASSERT_EQ(nc_image_classifier_classify(c, pixels.data(), height, width, 3, top, p), NC_OK) << nc_last_error();
  const nc::models::ImageClassifier reference("resnet18", weights, nc::Device::cpu(), labels);
  const auto expected = reference.predict(nc::data::read_color_image(image), 3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(top[i], expected[i].label);
    EXPECT_NEAR(p[i], expected[i].probability, 1e-6);
  }
  EXPECT_EQ(nc_image_classifier_classify(c, pixels.data(), height, width, 6, top, nullptr), NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("'k' is 6"), std::string::npos) << nc_last_error();
  EXPECT_EQ(nc_image_classifier_classify(c, nullptr, height, width, 1, top, nullptr), NC_ERROR_VALUE);
  nc_image_classifier_free(c);
  nc_image_classifier* none = nullptr;
  EXPECT_EQ(nc_image_classifier_load("resnet18", (dir_ / "missing").c_str(), nullptr, "cpu", &none), NC_ERROR_IO);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(nc_image_classifier_load("resnet7", weights.c_str(), nullptr, "cpu", &none), NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("resnet7"), std::string::npos) << nc_last_error();
  nc_image_classifier_free(nullptr);
}
