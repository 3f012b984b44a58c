// The whole public API of normcore in one include.
#pragma once

#include "normcore/cuda.h"
#include "normcore/data.h"
#include "normcore/device.h"
#include "normcore/dtype.h"
#include "normcore/error.h"
#include "normcore/ops.h"
#include "normcore/optim.h"
#include "normcore/autograd.h"
#include "normcore/conformance.h"
#include "normcore/losses.h"
#include "normcore/nn.h"
#include "normcore/norms.h"
#include "normcore/random.h"
#include "normcore/safetensors.h"
#include "normcore/scalar.h"
#include "normcore/tensor.h"
