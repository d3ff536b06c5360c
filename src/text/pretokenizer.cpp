#include "text/pretokenizer.h"

#include "text/tokenizer_json.h"
#include "text/unicode_utf8.h"
#include "util/error.h"

namespace tokenmill::text {

void PreTokenized::materialize() {
  if (!byte_level) return;
  for (auto& p : pieces) {
    std::string s;
    s.reserve(p.size() * 2);
    for (char c : p) append_utf8(byte_to_unicode(static_cast<uint8_t>(c)), s);
    arena.push_back(std::move(s));
    p = arena.back();
  }
  byte_level = false;
}

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  fail(
      "{}.behavior: unknown split behavior \"{}\" (expected Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext or Contiguous)",
      where, b);
}

// Splits `text` at `matches` (sorted, non-overlapping) and appends the pieces to `out`.
// Empty matches split the text like any other (the reference's regexSplit does so too).
void split_at(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
              Behavior behavior, bool invert, std::vector<std::string_view>& out) {
  struct Seg {
    size_t b, e;
    bool delim;
  };
  std::vector<Seg> segs;
  segs.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) segs.push_back({prev, b, invert});
    if (e > b) segs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < text.size()) segs.push_back({prev, text.size(), invert});
  bool open = false;  // the last piece in `out` came from this text and may still grow
  size_t open_b = 0, open_e = 0;
  bool pending_next = false;  // MergedWithNext: a delimiter waiting for the following segment
  auto flush = [&] {
    if (open) out.push_back(text.substr(open_b, open_e - open_b));
    open = false;
  };
  bool last_delim = false;
  for (const Seg& s : segs) {
    switch (behavior) {
      case Behavior::kRemoved:
        if (!s.delim) out.push_back(text.substr(s.b, s.e - s.b));
        break;
      case Behavior::kIsolated:
        out.push_back(text.substr(s.b, s.e - s.b));
        break;
      case Behavior::kMergedWithPrevious:
        if (s.delim && open) {
          open_e = s.e;
        } else {
          flush();
          open = true;
          open_b = s.b;
          open_e = s.e;
        }
        break;
      case Behavior::kMergedWithNext:
        if (pending_next) {
          open_e = s.e;
        } else {
          flush();
          open = true;
          open_b = s.b;
          open_e = s.e;
        }
        pending_next = s.delim;
        if (!s.delim) flush();
        break;
      case Behavior::kContiguous:
        if (s.delim && last_delim && open) {
          open_e = s.e;
        } else {
          flush();
          open = true;
          open_b = s.b;
          open_e = s.e;
        }
        last_delim = s.delim;
        break;
    }
  }
  flush();
}

class Split final : public PreTokenizer {
 public:
  Split(Regex re, Behavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void apply(PreTokenized& pt) const override {
    pt.materialize();
    std::vector<std::string_view> out;
    for (std::string_view p : pt.pieces) {
      pt.matches.clear();
      re_.find_all(p, pt.regex, pt.matches);
      out.reserve(out.size() + pt.matches.size() * 2 + 1);
      split_at(p, pt.matches, behavior_, invert_, out);
    }
    pt.pieces.swap(out);
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

// Keeps only the matches of a regex (the reference's text.match(pattern) pre-tokenizers).
class MatchOnly final : public PreTokenizer {
 public:
  explicit MatchOnly(Regex re) : re_(std::move(re)) {}
  void apply(PreTokenized& pt) const override {
    pt.materialize();
    std::vector<std::string_view> out;
    for (std::string_view p : pt.pieces) {
      pt.matches.clear();
      re_.find_all(p, pt.regex, pt.matches);
      for (auto [b, e] : pt.matches) {
        if (e > b) out.push_back(p.substr(b, e - b));
      }
    }
    pt.pieces.swap(out);
  }

 private:
  Regex re_;
};

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_.emplace_back(kGpt2Pattern, false, where);
  }
  void apply(PreTokenized& pt) const override {
    pt.materialize();
    std::vector<std::string_view> out;
    out.reserve(pt.pieces.size());
    for (std::string_view p : pt.pieces) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) {
        pt.arena.push_back(" " + std::string(p));
        p = pt.arena.back();
      }
      if (re_.empty()) {
        out.push_back(p);
        continue;
      }
      pt.matches.clear();
      re_[0].find_all(p, pt.regex, pt.matches);
      for (auto [b, e] : pt.matches) {
        if (e > b) out.push_back(p.substr(b, e - b));
      }
    }
    pt.pieces.swap(out);
    pt.byte_level = true;
  }

 private:
  bool add_prefix_space_;
  std::vector<Regex> re_;  // empty, or the GPT-2 pattern
};

// Replaces ' ' by the replacement character and prepends one to the first piece (scheme
// "first": only in the section that starts the input; "always": every piece; "never").
// split=true additionally splits before each replacement character (HF's MergedWithNext).
class Metaspace final : public PreTokenizer {
 public:
  enum class Scheme { kAlways, kFirst, kNever };
  Metaspace(std::string rep, Scheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  void apply(PreTokenized& pt) const override {
    pt.materialize();
    std::vector<std::string_view> out;
    for (size_t i = 0; i < pt.pieces.size(); ++i) {
      std::string s;
      std::string_view p = pt.pieces[i];
      const bool prepend =
          scheme_ == Scheme::kAlways || (scheme_ == Scheme::kFirst && pt.first_section && i == 0);
      if (prepend && !p.starts_with(' ') && !p.starts_with(rep_)) s = rep_;
      for (char c : p) {
        if (c == ' ') {
          s += rep_;
        } else {
          s += c;
        }
      }
      pt.arena.push_back(std::move(s));
      std::string_view v = pt.arena.back();
      if (!split_) {
        out.push_back(v);
        continue;
      }
      size_t start = 0;
      for (size_t pos = v.find(rep_, 1); pos != std::string_view::npos;
           pos = v.find(rep_, pos + 1)) {
        if (pos > start) out.push_back(v.substr(start, pos - start));
        start = pos;
      }
      if (start < v.size()) out.push_back(v.substr(start));
    }
    pt.pieces.swap(out);
  }

 private:
  std::string rep_;
  Scheme scheme_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(PreTokenized& pt) const override {
    for (const auto& p : parts_) p->apply(pt);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j,
                                                 const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "Split") {
    return std::make_unique<Split>(json_pattern(j, where),
                                   parse_behavior(json_string(j, "behavior", where), where),
                                   json_bool(j, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(json_bool(j, "add_prefix_space", true, where),
                                       json_bool(j, "use_regex", true, where), where);
  }
  if (type == "Metaspace") {
    const std::string rep = json_string(j, "replacement", where);
    if (rep.empty()) fail("{}.replacement: must not be empty", where);
    Metaspace::Scheme scheme = Metaspace::Scheme::kAlways;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string s = json_string(j, "prepend_scheme", where);
      if (s == "first") {
        scheme = Metaspace::Scheme::kFirst;
      } else if (s == "never") {
        scheme = Metaspace::Scheme::kNever;
      } else if (s != "always") {
        fail("{}.prepend_scheme: expected always, first or never, got \"{}\"", where, s);
      }
    }
    if (!json_bool(j, "add_prefix_space", true, where)) scheme = Metaspace::Scheme::kNever;
    return std::make_unique<Metaspace>(rep, scheme, json_bool(j, "split", true, where));
  }
  if (type == "Digits") {
    const bool individual = json_bool(j, "individual_digits", false, where);
    return std::make_unique<MatchOnly>(
        Regex(individual ? "[^0-9]+|[0-9]" : "[^0-9]+|[0-9]+", false, where));
  }
  if (type == "Whitespace")
    return std::make_unique<MatchOnly>(Regex("\\w+|[^\\w\\s]+", false, where));
  if (type == "WhitespaceSplit") return std::make_unique<MatchOnly>(Regex("\\S+", false, where));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = json_array(j, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail(
      "{}: unsupported pre_tokenizer type \"{}\" (supported: Split, ByteLevel, Metaspace, Digits, "
      "Whitespace, WhitespaceSplit, Sequence)",
      where, type);
}

}  // namespace tokenmill::text
