#include "util/argmax.h"

namespace tokenmill {

int32_t argmax(const float* logits, int vocab) {
  if (vocab <= 0) return 0;
  // std::max_element keeps index 0 when logits[0] is NaN (nothing compares above NaN) and
  // otherwise the first index of the largest non-NaN value.
  if (logits[0] != logits[0]) return 0;
  const float m = max_value(logits + 1, vocab - 1, logits[0]);
  for (int k = 0; k < vocab; ++k) {
    if (logits[k] == m) return k;
  }
  return 0;
}

float max_value(const float* v, int n, float init) {
  constexpr int kLanes = 8;
  float part[kLanes];
  for (float& p : part) p = init;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) part[l] = v[i + l] > part[l] ? v[i + l] : part[l];
  }
  float m = init;
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  for (float p : part) m = p > m ? p : m;
  return m;
}

}  // namespace tokenmill
