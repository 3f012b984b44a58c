// Embedding a trained classifier in an application: load a checkpoint once, then label
// images. This is all a program needs; build it against normcore like any other library
// (see CMakeLists.txt beside this file).
#include <cstdio>

#include <normcore/models.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT IMAGE...\n", argv[0]);
    return 2;
  }
  try {
    normcore::models::Classifier classifier(argv[1]);
    for (int i = 2; i < argc; ++i) {
      auto p = classifier.predict(normcore::models::read_image(argv[i]));
      std::printf("%s: %s (%.1f%%)\n", argv[i], p.name.c_str(), 100 * p.probability);
    }
  } catch (const normcore::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
