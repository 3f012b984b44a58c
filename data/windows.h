// The sample of a next-token window, written once for the datasets that cut windows out of a
// stream of token ids (TextWindows: bytes; TokenWindows: uint16 ids).
#pragma once

#include <cstdint>

#include "normcore/data.h"

namespace normcore {
namespace data {

// Input tokens[0, context) and target tokens[1, context + 1), as i64 [context] CPU tensors.
// Token is an unsigned type, so that every id is its value, never a negative one.
template <class Token>
Example next_token_window(const Token* tokens, int64_t context) {
  Tensor input = empty({context}, TensorOptions(DType::I64));
  Tensor target = empty({context}, TensorOptions(DType::I64));
  int64_t* in = input.data<int64_t>();
  int64_t* out = target.data<int64_t>();
  for (int64_t t = 0; t < context; ++t) {
    in[t] = tokens[t];
    out[t] = tokens[t + 1];
  }
  return Example{input, target};
}

}  // namespace data
}  // namespace normcore
