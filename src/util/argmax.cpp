#include "util/argmax.h"

namespace tokenmill {

int32_t argmax(const float* logits, int vocab) {
  if (vocab <= 0) return 0;
  // std::max_element keeps index 0 when logits[0] is NaN (nothing compares above NaN) and
  // otherwise the first index of the largest non-NaN value.
  float m = logits[0];
  if (m != m) return 0;
  constexpr int kLanes = 8;
  float part[kLanes];
  for (float& p : part) p = m;
  int i = 1;
  for (; i + kLanes <= vocab; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) part[l] = logits[i + l] > part[l] ? logits[i + l] : part[l];
  }
  for (; i < vocab; ++i) m = logits[i] > m ? logits[i] : m;
  for (float p : part) m = p > m ? p : m;
  for (int k = 0; k < vocab; ++k) {
    if (logits[k] == m) return k;
  }
  return 0;
}

}  // namespace tokenmill
