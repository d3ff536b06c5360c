#include "text/detokenizer.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace tokenmill {
namespace {

// Held tokens after which the detokenizer tries to release text that still ends in U+FFFD (an
// ill-formed byte that no later token can repair). Real text resolves within 4 tokens, since a
// character has at most 4 bytes and each token holds at least one.
constexpr size_t kMaxHeld = 8;
// Window size (tokens from p) past which text is released unconditionally; bounds the cost of a
// push for decoders whose output never settles.
constexpr size_t kHardWindow = 64;
// Ids before p are erased from the window once this many accumulate (amortised O(1) per token).
constexpr size_t kCompactAt = 256;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool is_cont(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

// Length of the sequence a lead byte starts (0: not a valid lead byte) and the allowed range of the
// second byte (Unicode Table 3-7: excludes overlongs, surrogates and values above U+10FFFF).
int lead_info(unsigned char c, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) {
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

// Decodes the sequence starting at s[i]. Returns its length when well-formed; otherwise returns
// -(length of the maximal ill-formed subpart), at least 1; `truncated` is set when the subpart
// reaches the end of s while still well-formed so far.
int scan(std::string_view s, size_t i, bool& truncated) {
  truncated = false;
  unsigned char lo, hi;
  const int len = lead_info(static_cast<unsigned char>(s[i]), lo, hi);
  if (len == 0) return -1;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      truncated = true;
      return -k;
    }
    const auto c = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (c >= lo && c <= hi) : is_cont(c);
    if (!ok) return -k;
  }
  return len;
}

bool ends_unfinished(std::string_view s) {
  return s.ends_with(kReplacement) || detok::incomplete_utf8_tail(s) > 0;
}

// Bytes of the longest suffix of `text` that is a proper prefix of one of `stops`.
size_t stop_prefix_suffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const auto& s : stops) {
    const size_t max_len = std::min(text.size(), s.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

}  // namespace

namespace detok {

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    bool truncated;
    const int n = scan(s, i, truncated);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

size_t incomplete_utf8_tail(std::string_view s) {
  // A truncated sequence starts at most 3 bytes from the end.
  // Its lead byte is the last non-continuation byte.
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i > from; --i) {
    if (is_cont(static_cast<unsigned char>(s[i - 1]))) continue;
    bool truncated;
    const int n = scan(s, i - 1, truncated);
    return n < 0 && truncated ? s.size() - (i - 1) : 0;
  }
  return 0;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool truncated;
    const int n = scan(s, i, truncated);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += -n;
    }
  }
  return out;
}

}  // namespace detok

IncrementalDetokenizer::IncrementalDetokenizer(DecodeFn decode, bool skip_special_tokens,
                                               std::vector<std::string> stop_strings,
                                               std::span<const int32_t> prompt_tail)
    : decode_(std::move(decode)), skip_special_(skip_special_tokens) {
  TM_CHECK(decode_ != nullptr, "IncrementalDetokenizer needs a decode function");
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) continue;  // an empty stop would match before any text
    stops_.push_back(std::move(stop_strings[i]));
    stop_orig_index_.push_back(static_cast<int>(i));
  }
  ids_.assign(prompt_tail.begin(), prompt_tail.end());
  r_ = ids_.size();
  prefix_text_ = decode_range(0, r_);
}

std::string_view IncrementalDetokenizer::stop_string() const {
  if (stop_index_ < 0) return {};
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stop_orig_index_[i] == stop_index_) return stops_[i];
  }
  return {};
}

std::string IncrementalDetokenizer::decode_range(size_t begin, size_t end) const {
  if (begin >= end) return {};
  return decode_(std::span<const int32_t>(ids_.data() + begin, end - begin), skip_special_);
}

void IncrementalDetokenizer::advance(size_t new_p, size_t new_r, std::string prefix_text) {
  p_ = new_p;
  r_ = new_r;
  prefix_text_ = std::move(prefix_text);
  if (p_ >= kCompactAt) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(p_));
    r_ -= p_;
    p_ = 0;
  }
}

std::string IncrementalDetokenizer::step() {
  const size_t n = ids_.size();
  std::string full = decode_range(p_, n);
  const bool grew = full.size() > prefix_text_.size() && full.starts_with(prefix_text_);
  if (grew && !ends_unfinished(full)) {
    std::string out = full.substr(prefix_text_.size());
    advance(r_, n, decode_range(r_, n));
    return out;
  }
  if (full == prefix_text_) {
    // The new ids added no text (skipped special tokens, empty pieces): they count as read. Keep
    // p for context unless the window gets long.
    if (n - p_ > kHardWindow) {
      advance(n - 1, n, decode_range(n - 1, n));
    } else {
      r_ = n;
    }
    return {};
  }
  if (!full.starts_with(prefix_text_) && !ends_unfinished(full)) {
    // A decoder that rewrites earlier text when more follows (e.g. clean_up_tokenization_spaces).
    // Emitted text cannot be taken back: emit what lies past the old prefix's length, starting at
    // a character boundary.
    size_t start = prefix_text_.size();
    while (start < full.size() && is_cont(static_cast<unsigned char>(full[start]))) ++start;
    std::string out = start < full.size() ? full.substr(start) : std::string();
    advance(r_, n, decode_range(r_, n));
    return out;
  }
  if (n - r_ > kMaxHeld) return force_split(full);
  return {};
}

std::string IncrementalDetokenizer::force_split(const std::string& full) {
  const size_t n = ids_.size();
  // Release the text of ids[p, k) for the largest k that splits the held ids without changing the
  // decode: text(p, k) + text(k, n) == text(p, n) and text(p, k) ends on a complete character.
  // For a decoder that maps ill-formed bytes to U+FFFD by maximal subparts (byte-level BPE), such
  // a k is a character boundary that later ids cannot change. The pending bytes of an unfinished
  // character live in the last 3 tokens, so only those splits are tried.
  for (size_t k = n - 1; k > r_ && k + 4 > n; --k) {
    std::string head = decode_range(p_, k);
    if (head.size() <= prefix_text_.size() || !head.starts_with(prefix_text_)) continue;
    if (detok::incomplete_utf8_tail(head) > 0) continue;
    if (head + decode_range(k, n) != full) continue;
    std::string out = head.substr(prefix_text_.size());
    advance(r_, k, decode_range(r_, k));
    return out;
  }
  if (n - p_ > kHardWindow && full.size() > prefix_text_.size() && full.starts_with(prefix_text_)) {
    // No clean split: release everything, so the window stays bounded.
    std::string out = detok::utf8_lossy(full.substr(prefix_text_.size()));
    advance(r_, n, decode_range(r_, n));
    return out;
  }
  return {};
}

std::string IncrementalDetokenizer::apply_stops(std::string text, bool at_end) {
  pending_ += text;
  if (stops_.empty()) {
    std::string out;
    out.swap(pending_);
    return out;
  }
  // Earliest match wins; on equal positions the earlier stop in the caller's list.
  size_t best_pos = std::string::npos;
  int best = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      best = static_cast<int>(i);
    }
  }
  if (best >= 0) {
    stop_index_ = stop_orig_index_[best];
    std::string out = pending_.substr(0, best_pos);
    pending_.clear();
    ids_.clear();
    return out;
  }
  size_t keep = at_end ? 0 : stop_prefix_suffix(pending_, stops_);
  size_t cut = pending_.size() - keep;
  // Stop strings that are not valid UTF-8 could make the held suffix start mid-character.
  while (cut > 0 && cut < pending_.size() && is_cont(static_cast<unsigned char>(pending_[cut]))) {
    --cut;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (stopped() || finished_) return {};
  ids_.push_back(id);
  ++num_tokens_;
  std::string text = step();
  if (text.empty()) return text;
  if (!detok::is_valid_utf8(text)) text = detok::utf8_lossy(text);
  return apply_stops(std::move(text), false);
}

std::string IncrementalDetokenizer::push(std::span<const int32_t> ids) {
  std::string out;
  for (int32_t id : ids) out += push(id);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  if (stopped() || finished_) return {};
  finished_ = true;
  std::string text;
  if (ids_.size() > r_) {
    std::string full = decode_range(p_, ids_.size());
    if (full.size() > prefix_text_.size() && full.starts_with(prefix_text_)) {
      text = full.substr(prefix_text_.size());
    }
  }
  text = detok::utf8_lossy(text);
  std::string out = apply_stops(std::move(text), true);
  ids_.clear();
  return out;
}

}  // namespace tokenmill
