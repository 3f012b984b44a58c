/* normcore's C API: what an application in any language needs to run trained models, with
 * no C++ types across the boundary.
 *
 * - Handles are opaque; every create or load has its free (free of NULL does nothing).
 * - Every call that can fail returns an nc_status; NC_OK is 0. The message of the last
 *   failure is per thread (nc_last_error), valid until the thread's next failing call, and
 *   names the function, the argument and the shapes, dtypes or files involved.
 * - Data crosses the boundary in caller-owned buffers, copied in or out, never shared.
 * - Devices are strings: "cpu", "cuda" (the first GPU) or "cuda:N".
 * - Threads: every call may run from any thread, and handles may be shared between
 *   threads for the calls that read them (nc_tensor_read, nc_file_*, nc_classifier_predict
 *   from many threads at once on one classifier gives what one thread gets, to the bit, on
 *   the CPU and on a GPU); a generator serves one thread at a time; a handle is freed once
 *   no thread uses it.
 * - NC_API_VERSION changes when a declaration here changes; functions are only added to a
 *   version, never changed or removed within it. nc_api_version() gives the version of the
 *   library at run time.
 */
#ifndef NORMCORE_C_H
#define NORMCORE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NC_API __attribute__((visibility("default")))
#else
#define NC_API
#endif

#define NC_API_VERSION 3

typedef enum nc_status {
  NC_OK = 0,
  NC_ERROR_VALUE = 1,             /* a bad argument: NULL, out of range, malformed */
  NC_ERROR_SHAPE = 2,             /* shapes that do not fit the call */
  NC_ERROR_DTYPE = 3,             /* an element type the call does not take */
  NC_ERROR_DEVICE = 4,            /* an unknown or absent device */
  NC_ERROR_INDEX = 5,             /* an index or name that is not there */
  NC_ERROR_IO = 6,                /* a file that cannot be read or written, or is not what it should be */
  NC_ERROR_OUT_OF_MEMORY = 7,     /* host or GPU memory exhausted */
  NC_ERROR_CUDA = 8,              /* a CUDA failure */
  NC_ERROR_INTERNAL = 9,          /* anything else */
  NC_STATUS_MAX_ENUM = 0x7fffffff /* not a status: keeps the enum as wide as an int */
} nc_status;

/* The element types, with their C++ names: the values are part of the ABI. */
typedef enum nc_dtype {
  NC_F32 = 0,
  NC_F64 = 1,
  NC_F16 = 2,  /* IEEE half, as 16-bit patterns */
  NC_BF16 = 3, /* bfloat16, as 16-bit patterns */
  NC_I32 = 4,
  NC_I64 = 5,
  NC_U8 = 6,
  NC_BOOL = 7,                   /* one byte, 0 or 1 */
  NC_DTYPE_MAX_ENUM = 0x7fffffff /* not a type: keeps the enum as wide as an int in C and C++ alike */
} nc_dtype;

typedef struct nc_tensor nc_tensor;
typedef struct nc_file nc_file;
typedef struct nc_classifier nc_classifier;
typedef struct nc_generator nc_generator;

/* ---- library */
NC_API int nc_api_version(void);
NC_API const char* nc_version(void);            /* the library's version, "0.1.0" */
NC_API const char* nc_status_name(nc_status s); /* "NC_ERROR_SHAPE", ... */
NC_API const char* nc_last_error(void);         /* "" when this thread has had no failure */
NC_API int nc_cuda_device_count(void);          /* 0 without CUDA */
NC_API size_t nc_dtype_size(nc_dtype dtype);    /* bytes per element; 0 for a value not above */

/* ---- tensors: dense, on a device, owned by their handle */
/* A tensor of shape[0..ndim) (ndim 0: a scalar) on device, holding a copy of data (numel
 * elements of dtype, row-major), or zeros when data is NULL. */
NC_API nc_status nc_tensor_create(const void* data, nc_dtype dtype, const int64_t* shape, int ndim, const char* device,
                                  nc_tensor** out);
NC_API void nc_tensor_free(nc_tensor* t);
NC_API int nc_tensor_ndim(const nc_tensor* t);
/* Copies the shape into shape[0..capacity); NC_ERROR_VALUE when capacity < ndim. */
NC_API nc_status nc_tensor_shape(const nc_tensor* t, int64_t* shape, int capacity);
NC_API int64_t nc_tensor_numel(const nc_tensor* t);
NC_API nc_dtype nc_tensor_dtype(const nc_tensor* t);
/* Copies the elements, row-major, into dst on the host; bytes must be numel * dtype size. */
NC_API nc_status nc_tensor_read(const nc_tensor* t, void* dst, size_t bytes);

/* ---- safetensors files (the format PyTorch's safetensors reads and writes) */
/* Writes count named tensors and metadata_count (key, value) string pairs (metadata holds
 * 2 * metadata_count strings, key then value) to path, atomically. */
NC_API nc_status nc_safetensors_save(const char* path, const char* const* names, const nc_tensor* const* tensors,
                                     size_t count, const char* const* metadata, size_t metadata_count);
/* Reads path, its tensors created on device. */
NC_API nc_status nc_safetensors_load(const char* path, const char* device, nc_file** out);
NC_API void nc_file_free(nc_file* f);
NC_API size_t nc_file_count(const nc_file* f);
/* The name of tensor i (in file order); NULL when i is out of range. Valid while f lives. */
NC_API const char* nc_file_name(const nc_file* f, size_t i);
/* A new handle to tensor i, or to the tensor called name; free it with nc_tensor_free. */
NC_API nc_status nc_file_tensor(const nc_file* f, size_t i, nc_tensor** out);
NC_API nc_status nc_file_find(const nc_file* f, const char* name, nc_tensor** out);
/* The metadata value of key, or NULL when the file has none. Valid while f lives. */
NC_API const char* nc_file_metadata(const nc_file* f, const char* key);

/* ---- image classifiers (checkpoints of `normcore train`) */
NC_API nc_status nc_classifier_load(const char* checkpoint, const char* device, nc_classifier** out);
NC_API void nc_classifier_free(nc_classifier* c);
NC_API const char* nc_classifier_model(const nc_classifier* c); /* "mlp", "cnn-gn", ... */
NC_API int nc_classifier_classes(const nc_classifier* c);       /* 10 */
/* The name of a class ("T-shirt/top", ...); NULL when label is out of range. */
NC_API const char* nc_classifier_class_name(const nc_classifier* c, int label);
/* Reads a 28x28 grayscale image (PGM, or PNG where the library has libpng) into pixels
 * [784], row-major, in [0, 1]. */
NC_API nc_status nc_image_read(const char* path, float* pixels);
/* Labels count 28x28 grayscale images (count * 784 floats in [0, 1], row-major): labels
 * [count] gets each image's class, probabilities [count * classes] (or NULL) the softmax. */
NC_API nc_status nc_classifier_predict(const nc_classifier* c, const float* images, int64_t count, int64_t* labels,
                                       float* probabilities);

/* ---- image classifiers (since version 2): a torchvision ResNet ("resnet18", "resnet34",
 * "resnet50" or "resnet101") from its state_dict saved as safetensors, labelling RGB images
 * through torchvision's evaluation transform (the shorter side resized to 256, the center
 * 224 x 224 cut out, ImageNet's normalization). May be shared between threads. */
typedef struct nc_image_classifier nc_image_classifier;
/* labels: a file of class names, one a line, as many as the model's classes; or NULL (the
 * names are then the class numbers). */
NC_API nc_status nc_image_classifier_load(const char* name, const char* weights, const char* labels, const char* device,
                                          nc_image_classifier** out);
NC_API void nc_image_classifier_free(nc_image_classifier* c);
NC_API int64_t nc_image_classifier_classes(const nc_image_classifier* c); /* 0 for NULL */
/* The name of a class; NULL when label is out of range. */
NC_API const char* nc_image_classifier_class_name(const nc_image_classifier* c, int64_t label);
/* Reads a color image (PPM, PGM or, where the library has libpng, PNG; 1 to 16384 pixels a
 * side) as planes [3, height, width] of floats in [0, 1]. *height and *width (required) get
 * its size; pixels (or NULL, to ask the size) gets its 3 * height * width values when
 * capacity (in floats) holds them, else NC_ERROR_VALUE naming the count needed. */
NC_API nc_status nc_color_image_read(const char* path, float* pixels, size_t capacity, int64_t* height, int64_t* width);
/* The k (>= 1, at most the classes) most likely classes of an image [3, height, width] in
 * [0, 1] (as nc_color_image_read gives it), most likely first: labels [k] and, or NULL,
 * probabilities [k]. */
NC_API nc_status nc_image_classifier_classify(const nc_image_classifier* c, const float* pixels, int64_t height,
                                              int64_t width, int64_t k, int64_t* labels, float* probabilities);

/* ---- text generators: a checkpoint of `normcore train-lm` (a byte-level GPT), or (since
 * version 2) a Hugging Face GPT-2 folder (config.json, model.safetensors) with GPT-2's
 * tokenizer files beside them (encoder.json and vocab.bpe, vocab.json and merges.txt, or
 * tokenizer.json); for a folder, prompts go through the tokenizer and `tokens` counts its
 * tokens, each of one or more bytes. */
/* Receives the bytes of each token of a continuation as it is chosen (one byte for a
 * byte-level model), with the user pointer given to nc_generator_generate. */
typedef void (*nc_text_callback)(const char* text, size_t length, void* user);
NC_API nc_status nc_generator_load(const char* checkpoint, const char* device, nc_generator** out);
NC_API void nc_generator_free(nc_generator* g);
/* The most bytes the model conditions on (its context). */
NC_API int64_t nc_generator_context(const nc_generator* g);
/* Continues prompt (NUL-terminated; "" starts a new fortune, or for a folder a new
 * document) by `tokens` tokens (>= 0; bytes for a byte-level model): temperature 0 takes
 * the most likely token each step, else tokens are sampled at that temperature among the
 * top_k most likely (0: all), from seed (the same seed gives the same text on a device).
 * Each token's bytes go to on_text (or nowhere, NULL) as it is chosen; text (or NULL) gets
 * the whole continuation and a terminating NUL, so capacity must be at least
 * nc_generator_max_bytes(g, tokens) (checked before generating: tokens + 1 for a
 * byte-level model), and *length (or NULL) its length (bytes may be 0). A generator serves
 * one thread at a time; load one per thread to generate in parallel. */
NC_API nc_status nc_generator_generate(nc_generator* g, const char* prompt, int64_t tokens, double temperature,
                                       int64_t top_k, uint64_t seed, char* text, size_t capacity, size_t* length,
                                       nc_text_callback on_text, void* user);
/* Since version 2. The text buffer a continuation of `tokens` tokens always fits in, its
 * NUL included: tokens times the longest token's bytes, plus 1 (0 for NULL or tokens < 0;
 * SIZE_MAX where that does not fit a size_t). */
NC_API size_t nc_generator_max_bytes(const nc_generator* g, int64_t tokens);
/* Since version 2. nc_generator_generate, then among the fewest most likely tokens whose
 * probabilities add up to at least top_p, in (0, 1] (nucleus sampling; 1 keeps all). */
NC_API nc_status nc_generator_generate_top_p(nc_generator* g, const char* prompt, int64_t tokens, double temperature,
                                             int64_t top_k, double top_p, uint64_t seed, char* text, size_t capacity,
                                             size_t* length, nc_text_callback on_text, void* user);

/* ---- tokenizers (since version 2): GPT-2's byte-level BPE from a folder of its files
 * (encoder.json and vocab.bpe, vocab.json and merges.txt, or tokenizer.json). Any bytes
 * encode (invalid UTF-8 included) and decode back to the same bytes. */
typedef struct nc_tokenizer nc_tokenizer;
NC_API nc_status nc_tokenizer_load(const char* dir, nc_tokenizer** out);
NC_API void nc_tokenizer_free(nc_tokenizer* t);
NC_API int64_t nc_tokenizer_vocab_size(const nc_tokenizer* t);  /* 50257 for GPT-2; 0 for NULL */
NC_API int32_t nc_tokenizer_end_of_text(const nc_tokenizer* t); /* <|endoftext|>'s id, or -1 */
/* The ids of text [length bytes]; with special != 0, "<|endoftext|>" in the text is the
 * end-of-text token. *count (required) gets the number of ids; ids (or NULL, to ask for the
 * count) gets them when capacity (in ids) holds them all, else NC_ERROR_VALUE naming the
 * count needed, nothing written. */
NC_API nc_status nc_tokenizer_encode(const nc_tokenizer* t, const char* text, size_t length, int special, int32_t* ids,
                                     size_t capacity, size_t* count);
/* The bytes ids [count] stand for. *length (required) gets their number; text (or NULL)
 * gets them and a terminating NUL when capacity is at least *length + 1, else
 * NC_ERROR_VALUE naming the size needed, nothing written. An id outside the vocabulary is
 * NC_ERROR_INDEX naming its position. */
NC_API nc_status nc_tokenizer_decode(const nc_tokenizer* t, const int32_t* ids, size_t count, char* text,
                                     size_t capacity, size_t* length);

/* ---- ONNX models (since version 3; normcore/onnx.h and docs/ONNX.md): a .onnx file run on
 * normcore's ops. A library built without the importer fails every load with
 * NC_ERROR_INTERNAL saying so. A model may be shared between threads. */
typedef struct nc_onnx_model nc_onnx_model;
/* Reads and checks path (NC_ERROR_IO for a file that is not a model; NC_ERROR_VALUE naming the
 * node and the op or attribute normcore does not run). */
NC_API nc_status nc_onnx_model_load(const char* path, nc_onnx_model** out);
NC_API void nc_onnx_model_free(nc_onnx_model* m);
NC_API int64_t nc_onnx_model_inputs(const nc_onnx_model* m);  /* the graph's inputs; 0 for NULL */
NC_API int64_t nc_onnx_model_outputs(const nc_onnx_model* m); /* its outputs; 0 for NULL */
/* The name of input or output i; NULL when i is out of range. Valid while m lives. */
NC_API const char* nc_onnx_model_input_name(const nc_onnx_model* m, int64_t i);
NC_API const char* nc_onnx_model_output_name(const nc_onnx_model* m, int64_t i);
/* Runs m on inputs [count] (count = nc_onnx_model_inputs(m), in the graph's order; the model
 * runs on the first input's device) and creates its outputs in outputs
 * [nc_onnx_model_outputs(m)], which the caller frees with nc_tensor_free. With cuda_graph
 * nonzero on a GPU, the runs of one input signature replay a CUDA graph from the third on. */
NC_API nc_status nc_onnx_model_run(const nc_onnx_model* m, const nc_tensor* const* inputs, int64_t count,
                                   int cuda_graph, nc_tensor** outputs);
/* An ONNX TensorProto file (as ONNX's backend tests' input_N.pb and output_N.pb) as a tensor
 * on device. */
NC_API nc_status nc_onnx_tensor_read(const char* path, const char* device, nc_tensor** out);

#ifdef __cplusplus
}
#endif

#endif /* NORMCORE_C_H */
