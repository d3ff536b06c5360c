// HTML/XML escaping with MarkupSafe's rules (Jinja's `escape` filter): & < > " ' become
// &amp; &lt; &gt; &#34; &#39;. Safe inside element text and quoted attribute values.
#pragma once

#include <string>
#include <string_view>

namespace tokenmill {

inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace tokenmill
