// normcore/onnx.h in a library built without the ONNX importer (Debian's libonnx-dev and
// libprotobuf-dev were not there at configure time): every entry point says so. No Model
// can exist in such a build, so its accessors are never reached.
#include "normcore/onnx.h"

namespace normcore {
namespace onnx {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw Error(std::string(what) +
              ": normcore was built without the ONNX importer (install libonnx-dev and libprotobuf-dev, "
              "e.g. with scripts/install-deps.sh, and configure again)");
}
}  // namespace

struct Model::Impl {};

Model Model::load(const std::string& path) { unavailable(("onnx::Model::load(" + path + ")").c_str()); }
Model Model::parse(const std::string&, const std::string& name) {
  unavailable(("onnx::Model::parse(" + name + ")").c_str());
}
const std::vector<ValueInfo>& Model::inputs() const { unavailable("onnx::Model::inputs"); }
const std::vector<ValueInfo>& Model::outputs() const { unavailable("onnx::Model::outputs"); }
int64_t Model::opset() const { unavailable("onnx::Model::opset"); }
std::vector<Tensor> Model::run(const std::vector<Tensor>&, bool) const { unavailable("onnx::Model::run"); }
std::string Model::cuda_graph_state(const std::vector<Tensor>&) const { unavailable("onnx::Model::cuda_graph_state"); }
std::vector<Model::OpTime> Model::profile(const std::vector<Tensor>&, int) const {
  unavailable("onnx::Model::profile");
}
Tensor read_tensor_file(const std::string& path) { unavailable(("onnx::read_tensor_file(" + path + ")").c_str()); }
const std::vector<std::string>& supported_ops() { unavailable("onnx::supported_ops"); }

}  // namespace onnx
}  // namespace normcore
