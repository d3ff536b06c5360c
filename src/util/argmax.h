// The greedy choice over a row of logits, shared by the sampler and the backends' argmax_rows.
#pragma once

#include <cstdint>

namespace tokenmill {

// Index of the largest logit, the lowest index among equals (std::max_element's choice, NaN
// included: index 0 when logits[0] is NaN, NaN skipped elsewhere; -0 equals +0), with
// independent partial maxima (several times faster over a large vocabulary).
int32_t argmax(const float* logits, int vocab);

// The largest of init and v[0..n) (NaN compares false and is skipped), with independent partial
// maxima so the compiler can vectorize it.
float max_value(const float* v, int n, float init);

}  // namespace tokenmill
