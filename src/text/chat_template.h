// Chat templates: a model's Jinja chat template rendered the way transformers'
// apply_chat_template renders it (see jinja.h for the engine and its fidelity).
//
// Variables a template sees: messages, tools (None when absent), documents (None when absent),
// add_generation_prompt, bos_token / eos_token (only when non-empty, as transformers passes only
// the special tokens a tokenizer has), then every key of `extra` (chat_template_kwargs such as
// enable_thinking). strftime_now() formats the current local time unless now_unix is set.
//
// Message content: render() passes messages exactly as given, like transformers does. Servers
// should first call normalize_messages(), which
//   * flattens content given as a list of parts that are all text ({"type": "text", "text": s})
//     into one string, the texts joined with "" (templates such as Qwen3's call string methods
//     on content; lists with non-text parts, e.g. images, are left as lists for the template);
//   * parses tool-call arguments given as a JSON string into an object, as vLLM does (templates
//     iterate or tojson them); arguments that are not a JSON object stay strings.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "text/jinja.h"

namespace tokenmill {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null = absent
  nlohmann::ordered_json documents;  // null = absent
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::string bos_token, eos_token;
  // Seconds since the epoch for strftime_now() (formatted as UTC); unset: the current local time.
  std::optional<int64_t> now_unix;
};

class ChatTemplate {
 public:
  // value: tokenizer_config.json's chat_template (a string, or a list of {name, template});
  // `name` picks one from a list (default "default").
  static ChatTemplate from_config_value(const nlohmann::json& value, const std::string& source_name,
                                        const std::string& name = "");
  // dir/chat_template.jinja if present, else tokenizer_config.json's chat_template. Throws naming
  // the files when there is none.
  static ChatTemplate from_dir(const std::string& dir);
  static ChatTemplate from_string(const std::string& source, const std::string& source_name);

  // Throws tokenmill::Error "<source>:<line>: <what failed>" (raise_exception messages included).
  std::string render(const ChatTemplateInputs& in) const;

  const std::string& source() const { return source_; }
  const std::string& source_name() const { return tmpl_.source_name(); }

 private:
  jinja::Template tmpl_;
  std::string source_;
};

// See the header comment: flattens text-only part lists, parses JSON-string tool arguments.
// Throws tokenmill::Error when `messages` is not an array of objects.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

}  // namespace tokenmill
