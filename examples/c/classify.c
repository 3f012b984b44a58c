/* Embedding a trained classifier in a C application: load a checkpoint once, then label
 * images, through normcore's C API alone. Build it against the installed library:
 *   cc classify.c -o classify $(pkg-config --cflags --libs normcore)
 *   ./classify CHECKPOINT IMAGE... [--device cuda]
 */
#include <stdio.h>
#include <string.h>

#include <normcore/normcore_c.h>

int main(int argc, char** argv) {
  const char* device = "cpu";
  if (argc >= 3 && strcmp(argv[argc - 2], "--device") == 0) {
    device = argv[argc - 1];
    argc -= 2;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s CHECKPOINT IMAGE... [--device cpu|cuda|cuda:N]\n", argv[0]);
    return 2;
  }
  nc_classifier* classifier = NULL;
  if (nc_classifier_load(argv[1], device, &classifier) != NC_OK) {
    fprintf(stderr, "%s\n", nc_last_error());
    return 1;
  }
  int status = 0;
  for (int i = 2; i < argc; ++i) {
    float pixels[28 * 28];
    float probabilities[10];
    int64_t label = 0;
    if (nc_image_read(argv[i], pixels) != NC_OK ||
        nc_classifier_predict(classifier, pixels, 1, &label, probabilities) != NC_OK) {
      fprintf(stderr, "%s\n", nc_last_error());
      status = 1;
      continue;
    }
    printf("%s: %s (%.1f%%)\n", argv[i], nc_classifier_class_name(classifier, (int)label),
           100.0 * probabilities[label]);
  }
  nc_classifier_free(classifier);
  return status;
}
