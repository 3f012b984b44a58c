// ONNX's Einsum on normcore's sum, permute and batched matmul. The operands are contracted
// left to right: each pair first sums the letters no later operand and no output needs, then
// multiplies as [batch, left, contracted] @ [batch, contracted, right] (a size-1 batch dim
// broadcast), then the result is summed and permuted to the output's letters. "..." stands
// for the same dims in every operand (aligned from the right); an output left implicit is the
// "..." dims, then the letters that appear once, in alphabetical order. A letter repeated in
// one operand (a diagonal) is refused naming the node.
#include <algorithm>
#include <map>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

using Outputs = std::vector<Tensor>;

bool has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// A term with "..." replaced by capital letters for the `dims` dims it stands for, the last of
// `ellipsis` placeholders.
std::string expand(const NodeRun& n, std::string term, int64_t rank, int64_t ellipsis) {
  const size_t dots = term.find("...");
  if (dots == std::string::npos) return term;
  const int64_t dims = rank - static_cast<int64_t>(term.size() - 3);
  NC_CHECK(dims >= 0 && dims <= ellipsis, ValueError, n.where, ": '...' in '", term, "' does not fit rank ", rank);
  std::string letters;
  for (int64_t d = ellipsis - dims; d < ellipsis; ++d) letters += static_cast<char>('A' + d);
  return term.replace(dots, 3, letters);
}

// x summed over the dims whose letters keep lacks; letters follows.
Tensor sum_out(Tensor x, std::string& letters, const std::string& keep) {
  for (int64_t i = static_cast<int64_t>(letters.size()) - 1; i >= 0; --i) {
    if (has(keep, letters[static_cast<size_t>(i)])) continue;
    x = sum(x, {i});
    letters.erase(static_cast<size_t>(i), 1);
  }
  return x;
}

// x's dims in the order of want (a permutation of letters).
Tensor arrange(const Tensor& x, const std::string& letters, const std::string& want) {
  std::vector<int64_t> order;
  for (char c : want) order.push_back(static_cast<int64_t>(letters.find(c)));
  return x.permute(order);
}

Tensor einsum(const NodeRun& n) {
  const std::string* attr = n.attribute("equation") ? &n.attribute("equation")->s() : nullptr;
  NC_CHECK(attr != nullptr, ValueError, n.where, ": the equation attribute is missing");
  std::string equation;
  for (char c : *attr)
    if (c != ' ') equation += c;
  const size_t arrow = equation.find("->");
  std::string lhs = equation.substr(0, arrow), out = arrow == std::string::npos ? "" : equation.substr(arrow + 2);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const bool dots = equation.find("...") != std::string::npos;  // "..." takes the capital letters
  NC_CHECK(!dots || std::none_of(equation.begin(), equation.end(), [](char c) { return c >= 'A' && c <= 'Z'; }),
           ValueError, n.where, ": capital letters beside '...' are not supported, in '", *attr, "'");
  NC_CHECK(terms.size() == n.inputs.size(), ValueError, n.where, ": the equation '", *attr, "' has ", terms.size(),
           " operands for ", n.inputs.size(), " inputs");
  int64_t ellipsis = 0;  // the most dims "..." stands for
  for (size_t i = 0; i < terms.size(); ++i)
    if (has(terms[i], '.'))
      ellipsis = std::max<int64_t>(ellipsis, n.input(i).dim() - static_cast<int64_t>(terms[i].size() - 3));
  std::map<char, int64_t> size, count;
  for (size_t i = 0; i < terms.size(); ++i) {
    terms[i] = expand(n, terms[i], n.input(i).dim(), ellipsis);
    NC_CHECK(static_cast<int64_t>(terms[i].size()) == n.input(i).dim(), ShapeError, n.where, ": operand ", i, " '",
             terms[i], "' does not fit ", describe(n.input(i)));
    for (size_t d = 0; d < terms[i].size(); ++d) {
      const char c = terms[i][d];
      NC_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'), ValueError, n.where, ": '", c,
               "' is not a letter in '", *attr, "'");
      NC_CHECK(terms[i].find(c) == d, ValueError, n.where, ": letter '", c, "' repeats in operand ", i,
               " (a diagonal), which is not supported");
      const int64_t s = n.input(i).size(static_cast<int64_t>(d));
      NC_CHECK(!size.count(c) || size[c] == s || size[c] == 1 || s == 1, ShapeError, n.where, ": letter '", c,
               "' has sizes ", size[c], " and ", s);
      size[c] = std::max(size.count(c) ? size[c] : 1, s);
      ++count[c];
    }
  }
  if (arrow == std::string::npos) {
    for (int64_t d = 0; d < ellipsis; ++d) out += static_cast<char>('A' + d);
    for (const auto& [c, k] : count)
      if (k == 1 && !(dots && c <= 'Z')) out += c;
  } else {
    out = expand(n, out, ellipsis + static_cast<int64_t>(out.size()) - (has(out, '.') ? 3 : 0), ellipsis);
    for (char c : out) NC_CHECK(count.count(c), ValueError, n.where, ": output letter '", c, "' is in no operand");
  }

  Tensor result = n.input(0);
  std::string letters = terms[0];
  for (size_t j = 1; j < terms.size(); ++j) {
    std::string later = out;
    for (size_t i = j + 1; i < terms.size(); ++i) later += terms[i];
    std::string lb = terms[j];
    result = sum_out(result, letters, lb + later);
    Tensor b = sum_out(n.input(j), lb, letters + later);
    std::string batch, left, contracted, right;
    for (char c : letters) (has(lb, c) ? (has(later, c) ? batch : contracted) : left) += c;
    for (char c : lb)
      if (!has(letters, c)) right += c;
    const auto sizes_of = [&](const std::string& s) {
      Shape shape;
      for (char c : s) shape.push_back(size[c]);
      return shape;
    };
    const auto product = [&](const std::string& s) {
      int64_t p = 1;
      for (char c : s) p *= size[c];
      return p;
    };
    Shape a_shape = sizes_of(batch + left + contracted), b_shape = sizes_of(batch + contracted + right);
    const Tensor a = arrange(result, letters, batch + left + contracted).expand(a_shape).contiguous();
    const Tensor bb = arrange(b, lb, batch + contracted + right).expand(b_shape).contiguous();
    result = matmul(a.reshape({product(batch), product(left), product(contracted)}),
                    bb.reshape({product(batch), product(contracted), product(right)}))
                 .reshape(sizes_of(batch + left + right));
    letters = batch + left + right;
  }
  result = sum_out(result, letters, out);
  return arrange(result, letters, out).contiguous();
}

}  // namespace

void add_einsum_op(std::map<std::string, OpSpec>& t) {
  t["Einsum"] = {[](const NodeRun& n) { return Outputs{einsum(n)}; }, {"equation"}};
}

}  // namespace onnx
}  // namespace normcore
