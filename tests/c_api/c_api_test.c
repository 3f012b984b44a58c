/* The C API from C: tensors in and out, safetensors written and read back, a classifier
 * checkpoint built from known weights and its predictions checked against the softmax
 * computed here, and the errors of bad arguments. Prints PASS, or each failed check, and
 * exits 0 only when every check holds.
 *   c_api_test DIR [DEVICE [IMAGE [ONNX_TEST]]]   (DIR: a writable folder; DEVICE: "cpu" by
 *   default; IMAGE: a 28x28 PGM read through nc_image_read; ONNX_TEST: an ONNX test folder
 *   of one input and one output, run through nc_onnx_*) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "normcore/normcore_c.h"

static int failures = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      printf("FAIL line %d: %s (last error: %s)\n", __LINE__, #cond, nc_last_error()); \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

/* Holds when status is expected and the thread's last error mentions every word given. */
static int fails_with(nc_status status, nc_status expected, const char* word1, const char* word2) {
  if (status != expected) {
    printf("  got %s, expected %s (%s)\n", nc_status_name(status), nc_status_name(expected), nc_last_error());
    return 0;
  }
  if ((word1 && !strstr(nc_last_error(), word1)) || (word2 && !strstr(nc_last_error(), word2))) {
    printf("  the message '%s' does not name '%s' and '%s'\n", nc_last_error(), word1 ? word1 : "", word2 ? word2 : "");
    return 0;
  }
  return 1;
}

static void library(void) {
  CHECK(nc_api_version() == NC_API_VERSION);
  CHECK(strlen(nc_version()) > 0);
  CHECK(strcmp(nc_status_name(NC_ERROR_SHAPE), "NC_ERROR_SHAPE") == 0);
  CHECK(nc_dtype_size(NC_F32) == 4 && nc_dtype_size(NC_BF16) == 2 && nc_dtype_size(NC_I64) == 8);
  CHECK(nc_dtype_size((nc_dtype)42) == 0);
  CHECK(nc_cuda_device_count() >= 0);
}

static void tensors(const char* device) {
  const float values[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e30f, -7.0f};
  const int64_t shape[2] = {2, 3};
  nc_tensor* t = NULL;
  CHECK(nc_tensor_create(values, NC_F32, shape, 2, device, &t) == NC_OK);
  if (!t) return;
  CHECK(nc_tensor_ndim(t) == 2 && nc_tensor_numel(t) == 6 && nc_tensor_dtype(t) == NC_F32);
  int64_t got_shape[4] = {0, 0, 0, 0};
  CHECK(nc_tensor_shape(t, got_shape, 4) == NC_OK && got_shape[0] == 2 && got_shape[1] == 3);
  float back[6];
  CHECK(nc_tensor_read(t, back, sizeof back) == NC_OK && memcmp(back, values, sizeof back) == 0);
  CHECK(fails_with(nc_tensor_read(t, back, 5 * sizeof(float)), NC_ERROR_VALUE, "nc_tensor_read", "bytes"));
  CHECK(fails_with(nc_tensor_shape(t, got_shape, 1), NC_ERROR_VALUE, "nc_tensor_shape", "capacity"));
  nc_tensor_free(t);

  /* Zeros when data is NULL; an integer type; a scalar. */
  const int64_t n[1] = {4};
  CHECK(nc_tensor_create(NULL, NC_I64, n, 1, device, &t) == NC_OK);
  int64_t ints[4] = {1, 1, 1, 1};
  CHECK(nc_tensor_read(t, ints, sizeof ints) == NC_OK && ints[0] == 0 && ints[3] == 0);
  nc_tensor_free(t);
  const double pi = 3.141592653589793;
  CHECK(nc_tensor_create(&pi, NC_F64, NULL, 0, device, &t) == NC_OK && nc_tensor_numel(t) == 1);
  double pi_back = 0;
  CHECK(nc_tensor_read(t, &pi_back, sizeof pi_back) == NC_OK && pi_back == pi);
  nc_tensor_free(t);

  /* Bad arguments: a typed status, a message naming the function and the argument, no handle. */
  const int64_t negative[2] = {2, -3};
  t = (nc_tensor*)&t; /* must come back NULL */
  CHECK(
      fails_with(nc_tensor_create(values, NC_F32, negative, 2, device, &t), NC_ERROR_SHAPE, "nc_tensor_create", "-3"));
  CHECK(t == NULL);
  CHECK(fails_with(nc_tensor_create(values, (nc_dtype)9, shape, 2, device, &t), NC_ERROR_DTYPE, "nc_tensor_create",
                   "dtype"));
  CHECK(fails_with(nc_tensor_create(values, NC_F32, shape, 2, "tpu", &t), NC_ERROR_DEVICE, "tpu", NULL));
  CHECK(fails_with(nc_tensor_create(values, NC_F32, shape, 2, "cuda:7", &t), NC_ERROR_DEVICE, "cuda:7", NULL));
  CHECK(
      fails_with(nc_tensor_create(values, NC_F32, shape, 2, device, NULL), NC_ERROR_VALUE, "nc_tensor_create", "out"));
  nc_tensor_free(NULL);
}

static void files(const char* dir, const char* device) {
  char path[1024];
  snprintf(path, sizeof path, "%s/c_api_tensors.safetensors", dir);
  const uint16_t halves[3] = {0x3c00, 0xc000, 0x7bff}; /* 1, -2, 65504 in f16 */
  const int32_t labels[2] = {7, -1};
  const int64_t three[1] = {3}, two[1] = {2};
  nc_tensor* a = NULL;
  nc_tensor* b = NULL;
  CHECK(nc_tensor_create(halves, NC_F16, three, 1, device, &a) == NC_OK);
  CHECK(nc_tensor_create(labels, NC_I32, two, 1, device, &b) == NC_OK);
  const char* names[2] = {"weights.half", "labels"};
  const nc_tensor* list[2] = {a, b};
  const char* metadata[4] = {"author", "c_api_test", "purpose", "round trip"};
  CHECK(nc_safetensors_save(path, names, list, 2, metadata, 2) == NC_OK);
  CHECK(fails_with(nc_safetensors_save(path, names, list, 2, NULL, 1), NC_ERROR_VALUE, "metadata", NULL));
  nc_tensor_free(a);
  nc_tensor_free(b);

  nc_file* f = NULL;
  CHECK(nc_safetensors_load(path, device, &f) == NC_OK);
  if (!f) return;
  CHECK(nc_file_count(f) == 2);
  CHECK(nc_file_name(f, 2) == NULL);
  CHECK(nc_file_metadata(f, "purpose") && strcmp(nc_file_metadata(f, "purpose"), "round trip") == 0);
  CHECK(nc_file_metadata(f, "missing") == NULL);
  nc_tensor* t = NULL;
  CHECK(nc_file_find(f, "weights.half", &t) == NC_OK && nc_tensor_dtype(t) == NC_F16);
  uint16_t halves_back[3];
  CHECK(nc_tensor_read(t, halves_back, sizeof halves_back) == NC_OK && memcmp(halves_back, halves, sizeof halves) == 0);
  nc_tensor_free(t);
  CHECK(fails_with(nc_file_find(f, "nope", &t), NC_ERROR_INDEX, "nope", "c_api_tensors"));
  CHECK(fails_with(nc_file_tensor(f, 5, &t), NC_ERROR_INDEX, "nc_file_tensor", "5"));
  nc_file_free(f);

  CHECK(fails_with(nc_safetensors_load("/nonexistent/x.safetensors", device, &f), NC_ERROR_IO,
                   "/nonexistent/x.safetensors", NULL));
  CHECK(f == NULL);
}

/* An "mlp" checkpoint whose weights are all zero but the last bias: every image then gets
 * the logits `bias`, so the label is its largest entry and the probabilities its softmax. */
static void classifier(const char* dir, const char* device) {
  static float zeros[512 * 784];
  const float bias[10] = {0.1f, -1.0f, 0.5f, 2.5f, 0.0f, 1.0f, -0.5f, 0.25f, 2.0f, -2.0f};
  struct {
    const char* name;
    int64_t rows, cols; /* cols 0: a vector */
  } params[6] = {{"model.1.weight", 512, 784}, {"model.1.bias", 512, 0},    {"model.4.weight", 256, 512},
                 {"model.4.bias", 256, 0},     {"model.7.weight", 10, 256}, {"model.7.bias", 10, 0}};
  nc_tensor* tensors[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  const char* names[6];
  for (int i = 0; i < 6; ++i) {
    const int64_t shape[2] = {params[i].rows, params[i].cols};
    const float* data = i == 5 ? bias : zeros;
    names[i] = params[i].name;
    CHECK(nc_tensor_create(data, NC_F32, shape, params[i].cols ? 2 : 1, "cpu", &tensors[i]) == NC_OK);
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/c_api_classifier.safetensors", dir);
  const char* metadata[6] = {"format", "normcore-classifier", "model", "mlp", "epoch", "0"};
  CHECK(nc_safetensors_save(path, names, (const nc_tensor* const*)tensors, 6, metadata, 3) == NC_OK);
  for (int i = 0; i < 6; ++i) nc_tensor_free(tensors[i]);

  nc_classifier* c = NULL;
  CHECK(nc_classifier_load(path, device, &c) == NC_OK);
  if (!c) return;
  CHECK(strcmp(nc_classifier_model(c), "mlp") == 0);
  CHECK(nc_classifier_classes(c) == 10);
  CHECK(strcmp(nc_classifier_class_name(c, 3), "Dress") == 0);
  CHECK(nc_classifier_class_name(c, 10) == NULL);

  static float images[3 * 784];
  for (int i = 0; i < 3 * 784; ++i) images[i] = (float)(i % 97) / 97.0f;
  int64_t labels[3] = {-1, -1, -1};
  float probs[30];
  CHECK(nc_classifier_predict(c, images, 3, labels, probs) == NC_OK);
  double total = 0;
  for (int k = 0; k < 10; ++k) total += exp(bias[k]);
  for (int i = 0; i < 3; ++i) {
    CHECK(labels[i] == 3);
    for (int k = 0; k < 10; ++k) CHECK(fabs(probs[i * 10 + k] - exp(bias[k]) / total) < 1e-6);
  }
  CHECK(nc_classifier_predict(c, images, 1, labels, NULL) == NC_OK && labels[0] == 3);
  CHECK(nc_classifier_predict(c, images, 0, labels, NULL) == NC_OK);
  CHECK(fails_with(nc_classifier_predict(c, NULL, 2, labels, NULL), NC_ERROR_VALUE, "nc_classifier_predict", "images"));
  CHECK(fails_with(nc_classifier_predict(c, images, -1, labels, NULL), NC_ERROR_VALUE, "count", NULL));
  nc_classifier_free(c);

  CHECK(fails_with(nc_classifier_load(dir, device, &c), NC_ERROR_IO, dir, NULL));
  char other[1024];
  snprintf(other, sizeof other, "%s/c_api_tensors.safetensors", dir);
  CHECK(fails_with(nc_classifier_load(other, device, &c), NC_ERROR_IO, "not a normcore checkpoint", NULL));
  CHECK(c == NULL);
}

static void image(const char* path, const char* dir) {
  float pixels[784];
  CHECK(nc_image_read(path, pixels) == NC_OK);
  int lit = 0, in_range = 1;
  for (int i = 0; i < 784; ++i) {
    lit += pixels[i] > 0;
    in_range &= pixels[i] >= 0 && pixels[i] <= 1;
  }
  CHECK(in_range && lit > 50);
  char missing[1024];
  snprintf(missing, sizeof missing, "%s/no-such-image.pgm", dir);
  CHECK(fails_with(nc_image_read(missing, pixels), NC_ERROR_IO, "no-such-image.pgm", NULL));
  CHECK(fails_with(nc_image_read(path, NULL), NC_ERROR_VALUE, "nc_image_read", "pixels"));
}

/* An ONNX test folder (model.onnx, test_data_set_0/input_0.pb and output_0.pb, one input and
 * one output): the model's outputs against the expected ones, three runs with CUDA graphs
 * on (eager, captured, replayed), and the errors of bad arguments. */
static void onnx_model(const char* folder, const char* device) {
  char path[1024];
  nc_onnx_model* m = NULL;
  snprintf(path, sizeof path, "%s/model.onnx", folder);
  CHECK(nc_onnx_model_load(path, &m) == NC_OK);
  if (!m) return;
  CHECK(nc_onnx_model_inputs(m) == 1 && nc_onnx_model_outputs(m) == 1);
  CHECK(nc_onnx_model_input_name(m, 0) != NULL && nc_onnx_model_input_name(m, 1) == NULL);
  CHECK(nc_onnx_model_output_name(m, 0) != NULL && nc_onnx_model_output_name(m, -1) == NULL);
  nc_tensor *input = NULL, *expected = NULL;
  snprintf(path, sizeof path, "%s/test_data_set_0/input_0.pb", folder);
  CHECK(nc_onnx_tensor_read(path, device, &input) == NC_OK);
  snprintf(path, sizeof path, "%s/test_data_set_0/output_0.pb", folder);
  CHECK(nc_onnx_tensor_read(path, "cpu", &expected) == NC_OK);
  if (!input || !expected) return;
  static float want[4096], got[4096];
  const int64_t n = nc_tensor_numel(expected);
  CHECK(n > 0 && n <= 4096 && nc_tensor_read(expected, want, (size_t)n * sizeof(float)) == NC_OK);
  const nc_tensor* inputs[1] = {input};
  for (int run = 0; run < 3 && n > 0 && n <= 4096; ++run) {
    nc_tensor* out = NULL;
    CHECK(nc_onnx_model_run(m, inputs, 1, 1, &out) == NC_OK);
    if (!out) continue;
    CHECK(nc_tensor_numel(out) == n && nc_tensor_read(out, got, (size_t)n * sizeof(float)) == NC_OK);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = fmax(worst, fabs(got[i] - want[i]) / (1e-3 + fabs(want[i])));
    CHECK(worst < 1e-3);
    nc_tensor_free(out);
  }
  nc_tensor* out = NULL;
  CHECK(fails_with(nc_onnx_model_run(m, inputs, 0, 0, &out), NC_ERROR_VALUE, "nc_onnx_model_run", "inputs"));
  CHECK(fails_with(nc_onnx_model_run(m, inputs, 1, 0, NULL), NC_ERROR_VALUE, "nc_onnx_model_run", "outputs"));
  snprintf(path, sizeof path, "%s/no-such-model.onnx", folder);
  nc_onnx_model* missing = NULL;
  CHECK(fails_with(nc_onnx_model_load(path, &missing), NC_ERROR_IO, "no-such-model.onnx", NULL) && missing == NULL);
  nc_tensor_free(input);
  nc_tensor_free(expected);
  nc_onnx_model_free(m);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    printf("usage: c_api_test DIR [DEVICE]\n");
    return 2;
  }
  const char* device = argc > 2 ? argv[2] : "cpu";
  library();
  tensors(device);
  files(argv[1], device);
  classifier(argv[1], device);
  if (argc > 3) image(argv[3], argv[1]);
  if (argc > 4) onnx_model(argv[4], device);
  if (failures) {
    printf("%d checks failed\n", failures);
    return 1;
  }
  printf("PASS: the C API on %s\n", device);
  return 0;
}
