// The C API (include/normcore/normcore_c.h) over the C++ one. Every entry point that can
// fail runs its body through `guarded`, which turns a normcore::Error (or any other
// exception) into an nc_status and the thread's last-error message, so no exception crosses
// into C. The handles hold C++ values: a Tensor, a loaded safetensors File, a Classifier.
#include "normcore/normcore_c.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "normcore/onnx.h"
#include "normcore/safetensors.h"
#include "normcore/text.h"

namespace nc = normcore;

struct nc_tensor {
  nc::Tensor tensor;
};

struct nc_file {
  nc::safetensors::File file;
};

struct nc_classifier {
  nc::models::Classifier classifier;
  std::string model;
};

struct nc_generator {
  nc::models::TextGenerator generator;
};

struct nc_image_classifier {
  nc::models::ImageClassifier classifier;
};

struct nc_tokenizer {
  nc::text::BpeTokenizer tokenizer;
};

struct nc_onnx_model {
  nc::onnx::Model model;
};

namespace {

thread_local std::string last_error;

nc_status failed(nc_status status, const char* message) {
  last_error = message;
  return status;
}

// The status of the exception in flight, its message kept as the thread's last error.
nc_status current_failure() {
  try {
    throw;
  } catch (const nc::ShapeError& e) {
    return failed(NC_ERROR_SHAPE, e.what());
  } catch (const nc::DTypeError& e) {
    return failed(NC_ERROR_DTYPE, e.what());
  } catch (const nc::DeviceError& e) {
    return failed(NC_ERROR_DEVICE, e.what());
  } catch (const nc::IndexError& e) {
    return failed(NC_ERROR_INDEX, e.what());
  } catch (const nc::ValueError& e) {
    return failed(NC_ERROR_VALUE, e.what());
  } catch (const nc::IOError& e) {
    return failed(NC_ERROR_IO, e.what());
  } catch (const nc::OutOfMemoryError& e) {
    return failed(NC_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::bad_alloc&) {
    return failed(NC_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const nc::CudaError& e) {
    return failed(NC_ERROR_CUDA, e.what());
  } catch (const std::exception& e) {
    return failed(NC_ERROR_INTERNAL, e.what());
  } catch (...) {
    return failed(NC_ERROR_INTERNAL, "an unknown exception");
  }
}

template <class F>
nc_status guarded(F&& body) {
  try {
    body();
    return NC_OK;
  } catch (...) {
    return current_failure();
  }
}

// Throws ValueError naming function and argument when p is NULL.
template <class P>
void require(const P* p, const char* function, const char* argument) {
  NC_CHECK(p != nullptr, ValueError, function, ": argument '", argument, "' is NULL");
}

nc::DType to_dtype(nc_dtype dtype, const char* function) {
  NC_CHECK(dtype >= NC_F32 && dtype <= NC_BOOL, DTypeError, function, ": argument 'dtype' is ", static_cast<int>(dtype),
           ", not an nc_dtype (0 to 7)");
  return static_cast<nc::DType>(dtype);  // the same order (normcore/dtype.h)
}

nc::Device to_device(const char* device, const char* function) {
  require(device, function, "device");
  nc::Device d(device);
  NC_CHECK(!d.is_cuda() || d.index < nc::cuda_device_count(), DeviceError, function, ": device '", device,
           "' is not there (", nc::cuda_device_count(), " CUDA devices)");
  return d;
}

}  // namespace

static_assert(static_cast<int>(nc::DType::Bool) == NC_BOOL && static_cast<int>(nc::DType::BF16) == NC_BF16,
              "nc_dtype follows normcore::DType");

extern "C" {

int nc_api_version(void) { return NC_API_VERSION; }

const char* nc_version(void) { return NORMCORE_VERSION_STRING; }

const char* nc_status_name(nc_status s) {
  switch (s) {
    case NC_OK: return "NC_OK";
    case NC_ERROR_VALUE: return "NC_ERROR_VALUE";
    case NC_ERROR_SHAPE: return "NC_ERROR_SHAPE";
    case NC_ERROR_DTYPE: return "NC_ERROR_DTYPE";
    case NC_ERROR_DEVICE: return "NC_ERROR_DEVICE";
    case NC_ERROR_INDEX: return "NC_ERROR_INDEX";
    case NC_ERROR_IO: return "NC_ERROR_IO";
    case NC_ERROR_OUT_OF_MEMORY: return "NC_ERROR_OUT_OF_MEMORY";
    case NC_ERROR_CUDA: return "NC_ERROR_CUDA";
    case NC_ERROR_INTERNAL: return "NC_ERROR_INTERNAL";
    case NC_STATUS_MAX_ENUM: break;
  }
  return "an unknown nc_status";
}

const char* nc_last_error(void) { return last_error.c_str(); }

int nc_cuda_device_count(void) {
  try {
    return nc::cuda_device_count();
  } catch (...) {
    current_failure();
    return 0;
  }
}

size_t nc_dtype_size(nc_dtype dtype) {
  return dtype >= NC_F32 && dtype <= NC_BOOL ? nc::dtype_size(static_cast<nc::DType>(dtype)) : 0;
}

// ---------------------------------------------------------------- tensors
nc_status nc_tensor_create(const void* data, nc_dtype dtype, const int64_t* shape, int ndim, const char* device,
                           nc_tensor** out) {
  return guarded([&] {
    const char* fn = "nc_tensor_create";
    require(out, fn, "out");
    *out = nullptr;
    NC_CHECK(ndim >= 0 && ndim <= 16, ValueError, fn, ": argument 'ndim' is ", ndim, ", not 0 to 16");
    if (ndim > 0) require(shape, fn, "shape");
    nc::Shape dims(shape, shape + ndim);
    for (int i = 0; i < ndim; ++i) {
      NC_CHECK(dims[i] >= 0, ShapeError, fn, ": shape[", i, "] is ", dims[i], ", negative");
    }
    const nc::DType type = to_dtype(dtype, fn);
    const nc::Device where = to_device(device, fn);
    nc::Tensor t = data ? nc::empty(dims, {type, nc::Device::cpu()}) : nc::zeros(dims, {type, nc::Device::cpu()});
    if (data != nullptr && t.nbytes() > 0) std::memcpy(t.data_ptr(), data, t.nbytes());
    *out = new nc_tensor{where.is_cpu() ? std::move(t) : t.to(where)};
  });
}

void nc_tensor_free(nc_tensor* t) { delete t; }

int nc_tensor_ndim(const nc_tensor* t) { return t ? static_cast<int>(t->tensor.dim()) : 0; }

nc_status nc_tensor_shape(const nc_tensor* t, int64_t* shape, int capacity) {
  return guarded([&] {
    require(t, "nc_tensor_shape", "t");
    const int ndim = static_cast<int>(t->tensor.dim());
    NC_CHECK(capacity >= ndim, ValueError, "nc_tensor_shape: argument 'capacity' is ", capacity, ", the tensor has ",
             ndim, " dimensions");
    if (ndim > 0) require(shape, "nc_tensor_shape", "shape");
    for (int i = 0; i < ndim; ++i) shape[i] = t->tensor.size(i);
  });
}

int64_t nc_tensor_numel(const nc_tensor* t) { return t ? t->tensor.numel() : 0; }

nc_dtype nc_tensor_dtype(const nc_tensor* t) { return t ? static_cast<nc_dtype>(t->tensor.dtype()) : NC_F32; }

nc_status nc_tensor_read(const nc_tensor* t, void* dst, size_t bytes) {
  return guarded([&] {
    const char* fn = "nc_tensor_read";
    require(t, fn, "t");
    const size_t want = t->tensor.nbytes();
    NC_CHECK(bytes == want, ValueError, fn, ": argument 'bytes' is ", bytes, "; the tensor ", nc::describe(t->tensor),
             " holds ", want);
    if (want == 0) return;
    require(dst, fn, "dst");
    const nc::Tensor host = t->tensor.to(nc::Device::cpu()).contiguous();
    std::memcpy(dst, host.data_ptr(), want);
  });
}

// ---------------------------------------------------------------- safetensors
nc_status nc_safetensors_save(const char* path, const char* const* names, const nc_tensor* const* tensors, size_t count,
                              const char* const* metadata, size_t metadata_count) {
  return guarded([&] {
    const char* fn = "nc_safetensors_save";
    require(path, fn, "path");
    if (count > 0) {
      require(names, fn, "names");
      require(tensors, fn, "tensors");
    }
    nc::safetensors::TensorList list;
    for (size_t i = 0; i < count; ++i) {
      NC_CHECK(names[i] != nullptr, ValueError, fn, ": names[", i, "] is NULL");
      NC_CHECK(tensors[i] != nullptr, ValueError, fn, ": tensors[", i, "] ('", names[i], "') is NULL");
      list.emplace_back(names[i], tensors[i]->tensor);
    }
    std::map<std::string, std::string> meta;
    if (metadata_count > 0) require(metadata, fn, "metadata");
    for (size_t i = 0; i < metadata_count; ++i) {
      NC_CHECK(metadata[2 * i] != nullptr && metadata[2 * i + 1] != nullptr, ValueError, fn, ": metadata pair ", i,
               " holds NULL");
      meta[metadata[2 * i]] = metadata[2 * i + 1];
    }
    nc::safetensors::save(path, list, meta);
  });
}

nc_status nc_safetensors_load(const char* path, const char* device, nc_file** out) {
  return guarded([&] {
    const char* fn = "nc_safetensors_load";
    require(out, fn, "out");
    *out = nullptr;
    require(path, fn, "path");
    const nc::Device where = to_device(device, fn);
    *out = new nc_file{nc::safetensors::load(path, where)};
  });
}

void nc_file_free(nc_file* f) { delete f; }

size_t nc_file_count(const nc_file* f) { return f ? f->file.tensors.size() : 0; }

const char* nc_file_name(const nc_file* f, size_t i) {
  return f && i < f->file.tensors.size() ? f->file.tensors[i].first.c_str() : nullptr;
}

nc_status nc_file_tensor(const nc_file* f, size_t i, nc_tensor** out) {
  return guarded([&] {
    const char* fn = "nc_file_tensor";
    require(out, fn, "out");
    *out = nullptr;
    require(f, fn, "f");
    NC_CHECK(i < f->file.tensors.size(), IndexError, fn, ": index ", i, " is out of range for ", f->file.source, " (",
             f->file.tensors.size(), " tensors)");
    *out = new nc_tensor{f->file.tensors[i].second};
  });
}

nc_status nc_file_find(const nc_file* f, const char* name, nc_tensor** out) {
  return guarded([&] {
    const char* fn = "nc_file_find";
    require(out, fn, "out");
    *out = nullptr;
    require(f, fn, "f");
    require(name, fn, "name");
    NC_CHECK(f->file.contains(name), IndexError, fn, ": ", f->file.source, " holds no tensor '", name, "'");
    *out = new nc_tensor{f->file.at(name)};
  });
}

const char* nc_file_metadata(const nc_file* f, const char* key) {
  if (!f || !key) return nullptr;
  auto it = f->file.metadata.find(key);
  return it == f->file.metadata.end() ? nullptr : it->second.c_str();
}

// ---------------------------------------------------------------- classifiers
nc_status nc_classifier_load(const char* checkpoint, const char* device, nc_classifier** out) {
  return guarded([&] {
    const char* fn = "nc_classifier_load";
    require(out, fn, "out");
    *out = nullptr;
    require(checkpoint, fn, "checkpoint");
    const nc::Device where = to_device(device, fn);
    nc::models::Classifier classifier(checkpoint, where);
    std::string model = classifier.model_name();
    *out = new nc_classifier{std::move(classifier), std::move(model)};
  });
}

void nc_classifier_free(nc_classifier* c) { delete c; }

const char* nc_classifier_model(const nc_classifier* c) { return c ? c->model.c_str() : nullptr; }

int nc_classifier_classes(const nc_classifier* c) {
  return c ? static_cast<int>(nc::models::fashion_mnist_classes().size()) : 0;
}

const char* nc_classifier_class_name(const nc_classifier* c, int label) {
  const auto& names = nc::models::fashion_mnist_classes();
  return c && label >= 0 && label < static_cast<int>(names.size()) ? names[label].c_str() : nullptr;
}

nc_status nc_image_read(const char* path, float* pixels) {
  return guarded([&] {
    require(path, "nc_image_read", "path");
    require(pixels, "nc_image_read", "pixels");
    const nc::Tensor image = nc::models::read_image(path).contiguous();
    std::memcpy(pixels, image.data_ptr(), image.nbytes());
  });
}

nc_status nc_classifier_predict(const nc_classifier* c, const float* images, int64_t count, int64_t* labels,
                                float* probabilities) {
  return guarded([&] {
    const char* fn = "nc_classifier_predict";
    require(c, fn, "c");
    NC_CHECK(count >= 0, ValueError, fn, ": argument 'count' is ", count, ", negative");
    if (count == 0) return;
    require(images, fn, "images");
    require(labels, fn, "labels");
    constexpr int64_t kPixels = 28 * 28;
    nc::Tensor batch = nc::empty({count, kPixels}, {nc::DType::F32, nc::Device::cpu()});
    std::memcpy(batch.data_ptr(), images, batch.nbytes());
    const nc::Tensor probs = c->classifier.probabilities(batch).to(nc::Device::cpu()).contiguous();
    const nc::Tensor best = nc::argmax(probs, 1);
    std::memcpy(labels, best.data_ptr(), static_cast<size_t>(count) * sizeof(int64_t));
    if (probabilities) std::memcpy(probabilities, probs.data_ptr(), probs.nbytes());
  });
}

// ---------------------------------------------------------------- image classifiers
nc_status nc_image_classifier_load(const char* name, const char* weights, const char* labels, const char* device,
                                   nc_image_classifier** out) {
  return guarded([&] {
    const char* fn = "nc_image_classifier_load";
    require(out, fn, "out");
    *out = nullptr;
    require(name, fn, "name");
    require(weights, fn, "weights");
    const nc::Device where = to_device(device, fn);
    *out = new nc_image_classifier{nc::models::ImageClassifier(name, weights, where, labels ? labels : "")};
  });
}

void nc_image_classifier_free(nc_image_classifier* c) { delete c; }

int64_t nc_image_classifier_classes(const nc_image_classifier* c) { return c ? c->classifier.classes() : 0; }

const char* nc_image_classifier_class_name(const nc_image_classifier* c, int64_t label) {
  return c && label >= 0 && label < c->classifier.classes() ? c->classifier.class_name(label).c_str() : nullptr;
}

nc_status nc_color_image_read(const char* path, float* pixels, size_t capacity, int64_t* height, int64_t* width) {
  return guarded([&] {
    const char* fn = "nc_color_image_read";
    require(path, fn, "path");
    require(height, fn, "height");
    require(width, fn, "width");
    *height = *width = 0;
    const nc::Tensor image = nc::data::read_color_image(path);
    *height = image.size(1);
    *width = image.size(2);
    if (!pixels) return;
    const auto count = static_cast<size_t>(image.numel());
    NC_CHECK(capacity >= count, ValueError, fn, ": argument 'capacity' is ", capacity, " floats, too small for the ",
             count, " values of ", path, " (3 x ", *height, " x ", *width, ")");
    std::memcpy(pixels, image.data_ptr(), count * sizeof(float));
  });
}

nc_status nc_image_classifier_classify(const nc_image_classifier* c, const float* pixels, int64_t height, int64_t width,
                                       int64_t k, int64_t* labels, float* probabilities) {
  return guarded([&] {
    const char* fn = "nc_image_classifier_classify";
    require(c, fn, "c");
    require(pixels, fn, "pixels");
    require(labels, fn, "labels");
    NC_CHECK(height >= 1 && width >= 1 && height <= 16384 && width <= 16384, ShapeError, fn,
             ": the image must be 1 to ", "16384 pixels a side, got ", height, "x", width);
    NC_CHECK(k >= 1 && k <= c->classifier.classes(), ValueError, fn, ": argument 'k' is ", k, ", not in [1, ",
             c->classifier.classes(), "]");
    const std::vector<float> values(pixels, pixels + 3 * height * width);
    const auto top = c->classifier.predict(nc::from_vector(values, {3, height, width}), k);
    for (int64_t i = 0; i < k; ++i) {
      labels[i] = top[static_cast<size_t>(i)].label;
      if (probabilities) probabilities[i] = static_cast<float>(top[static_cast<size_t>(i)].probability);
    }
  });
}

// ---------------------------------------------------------------- text generators
nc_status nc_generator_load(const char* checkpoint, const char* device, nc_generator** out) {
  return guarded([&] {
    const char* fn = "nc_generator_load";
    require(out, fn, "out");
    *out = nullptr;
    require(checkpoint, fn, "checkpoint");
    const nc::Device where = to_device(device, fn);
    *out = new nc_generator{nc::models::TextGenerator(checkpoint, where)};
  });
}

void nc_generator_free(nc_generator* g) { delete g; }

int64_t nc_generator_context(const nc_generator* g) { return g ? g->generator.model().config.context : 0; }

namespace {

nc_status generate(const char* fn, nc_generator* g, const char* prompt, int64_t tokens, double temperature,
                   int64_t top_k, double top_p, uint64_t seed, char* text, size_t capacity, size_t* length,
                   nc_text_callback on_text, void* user) {
  return guarded([&] {
    require(g, fn, "g");
    require(prompt, fn, "prompt");
    NC_CHECK(tokens >= 0, ValueError, fn, ": argument 'tokens' is ", tokens, ", negative");
    const size_t needed = nc_generator_max_bytes(g, tokens);
    NC_CHECK(text == nullptr || capacity >= needed, ValueError, fn, ": argument 'capacity' is ", capacity,
             " bytes, too small for ", tokens, " tokens of up to ", g->generator.max_token_bytes(),
             " bytes and the terminating NUL (", needed, ")");
    nc::models::GenerateOptions options;
    options.temperature = temperature;
    options.top_k = top_k;
    options.top_p = top_p;
    options.seed = seed;
    std::function<void(const std::string&)> stream;
    if (on_text) stream = [&](const std::string& piece) { on_text(piece.data(), piece.size(), user); };
    const std::string continuation = g->generator.generate(prompt, tokens, options, stream);
    if (text) {
      std::memcpy(text, continuation.data(), continuation.size());
      text[continuation.size()] = '\0';
    }
    if (length) *length = continuation.size();
  });
}

}  // namespace

nc_status nc_generator_generate(nc_generator* g, const char* prompt, int64_t tokens, double temperature, int64_t top_k,
                                uint64_t seed, char* text, size_t capacity, size_t* length, nc_text_callback on_text,
                                void* user) {
  return generate("nc_generator_generate", g, prompt, tokens, temperature, top_k, 1.0, seed, text, capacity, length,
                  on_text, user);
}

nc_status nc_generator_generate_top_p(nc_generator* g, const char* prompt, int64_t tokens, double temperature,
                                      int64_t top_k, double top_p, uint64_t seed, char* text, size_t capacity,
                                      size_t* length, nc_text_callback on_text, void* user) {
  return generate("nc_generator_generate_top_p", g, prompt, tokens, temperature, top_k, top_p, seed, text, capacity,
                  length, on_text, user);
}

size_t nc_generator_max_bytes(const nc_generator* g, int64_t tokens) {
  if (!g || tokens < 0) return 0;
  const auto per_token = static_cast<size_t>(g->generator.max_token_bytes());
  // A count no buffer can have (SIZE_MAX) rather than a product that wraps around.
  if (static_cast<uint64_t>(tokens) > (SIZE_MAX - 1) / per_token) return SIZE_MAX;
  return static_cast<size_t>(tokens) * per_token + 1;
}

// ---------------------------------------------------------------- tokenizers
nc_status nc_tokenizer_load(const char* dir, nc_tokenizer** out) {
  return guarded([&] {
    const char* fn = "nc_tokenizer_load";
    require(out, fn, "out");
    *out = nullptr;
    require(dir, fn, "dir");
    *out = new nc_tokenizer{nc::text::BpeTokenizer::load(dir)};
  });
}

void nc_tokenizer_free(nc_tokenizer* t) { delete t; }

int64_t nc_tokenizer_vocab_size(const nc_tokenizer* t) { return t ? t->tokenizer.vocab_size() : 0; }

int32_t nc_tokenizer_end_of_text(const nc_tokenizer* t) { return t ? t->tokenizer.end_of_text() : -1; }

nc_status nc_tokenizer_encode(const nc_tokenizer* t, const char* text, size_t length, int special, int32_t* ids,
                              size_t capacity, size_t* count) {
  return guarded([&] {
    const char* fn = "nc_tokenizer_encode";
    require(t, fn, "t");
    require(count, fn, "count");
    *count = 0;
    if (length > 0) require(text, fn, "text");
    const std::vector<int32_t> out = t->tokenizer.encode(std::string_view(text ? text : "", length), special != 0);
    *count = out.size();
    if (!ids) return;
    NC_CHECK(capacity >= out.size(), ValueError, fn, ": argument 'capacity' is ", capacity, " ids, too small for the ",
             out.size(), " ids of the text's ", length, " bytes");
    std::memcpy(ids, out.data(), out.size() * sizeof(int32_t));
  });
}

nc_status nc_tokenizer_decode(const nc_tokenizer* t, const int32_t* ids, size_t count, char* text, size_t capacity,
                              size_t* length) {
  return guarded([&] {
    const char* fn = "nc_tokenizer_decode";
    require(t, fn, "t");
    require(length, fn, "length");
    *length = 0;
    if (count > 0) require(ids, fn, "ids");
    const std::vector<int32_t> list = count > 0 ? std::vector<int32_t>(ids, ids + count) : std::vector<int32_t>();
    const std::string out = t->tokenizer.decode(list);
    *length = out.size();
    if (!text) return;
    NC_CHECK(capacity > out.size(), ValueError, fn, ": argument 'capacity' is ", capacity, " bytes, too small for the ",
             out.size(), " bytes of ", count, " ids and the terminating NUL");
    std::memcpy(text, out.data(), out.size());
    text[out.size()] = '\0';
  });
}

// ---- ONNX models (an importer-less build fails in Model::load, saying so)
nc_status nc_onnx_model_load(const char* path, nc_onnx_model** out) {
  return guarded([&] {
    const char* fn = "nc_onnx_model_load";
    require(out, fn, "out");
    *out = nullptr;
    require(path, fn, "path");
    *out = new nc_onnx_model{nc::onnx::Model::load(path)};
  });
}

void nc_onnx_model_free(nc_onnx_model* m) { delete m; }

int64_t nc_onnx_model_inputs(const nc_onnx_model* m) { return m ? static_cast<int64_t>(m->model.inputs().size()) : 0; }

int64_t nc_onnx_model_outputs(const nc_onnx_model* m) {
  return m ? static_cast<int64_t>(m->model.outputs().size()) : 0;
}

const char* nc_onnx_model_input_name(const nc_onnx_model* m, int64_t i) {
  if (!m || i < 0 || i >= nc_onnx_model_inputs(m)) return nullptr;
  return m->model.inputs()[static_cast<size_t>(i)].name.c_str();
}

const char* nc_onnx_model_output_name(const nc_onnx_model* m, int64_t i) {
  if (!m || i < 0 || i >= nc_onnx_model_outputs(m)) return nullptr;
  return m->model.outputs()[static_cast<size_t>(i)].name.c_str();
}

nc_status nc_onnx_model_run(const nc_onnx_model* m, const nc_tensor* const* inputs, int64_t count, int cuda_graph,
                            nc_tensor** outputs) {
  return guarded([&] {
    const char* fn = "nc_onnx_model_run";
    require(m, fn, "m");
    require(outputs, fn, "outputs");
    const int64_t wanted = nc_onnx_model_inputs(m);
    NC_CHECK(count == wanted, ValueError, fn, ": the model takes ", wanted, " inputs, got count ", count);
    if (count > 0) require(inputs, fn, "inputs");
    std::vector<nc::Tensor> in;
    for (int64_t i = 0; i < count; ++i) {
      NC_CHECK(inputs[i] != nullptr, ValueError, fn, ": inputs[", i, "] (the model's '", nc_onnx_model_input_name(m, i),
               "') is NULL");
      in.push_back(inputs[i]->tensor);
    }
    std::vector<nc::Tensor> out = m->model.run(in, cuda_graph != 0);
    for (size_t i = 0; i < out.size(); ++i) outputs[i] = new nc_tensor{std::move(out[i])};
  });
}

nc_status nc_onnx_tensor_read(const char* path, const char* device, nc_tensor** out) {
  return guarded([&] {
    const char* fn = "nc_onnx_tensor_read";
    require(out, fn, "out");
    *out = nullptr;
    require(path, fn, "path");
    const nc::Device where = to_device(device, fn);
    *out = new nc_tensor{nc::onnx::read_tensor_file(path).to(where)};
  });
}

}  // extern "C"
