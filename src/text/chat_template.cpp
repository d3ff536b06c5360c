#include "text/chat_template.h"

#include <filesystem>

#include "util/error.h"
#include "util/file_text.h"

namespace tokenmill {
namespace {

std::string read_file(const std::filesystem::path& p) {
  return read_text_file(p.string());
}

}  // namespace

ChatTemplate ChatTemplate::from_string(const std::string& source, const std::string& source_name) {
  ChatTemplate t;
  t.source_ = source;
  t.tmpl_ = jinja::Template::parse(source, source_name);
  return t;
}

ChatTemplate ChatTemplate::from_config_value(const nlohmann::json& value,
                                             const std::string& source_name,
                                             const std::string& name) {
  if (value.is_string()) {
    if (!name.empty() && name != "default") {
      fail("{}: chat_template is a single template, so there is no template named '{}'",
           source_name, name);
    }
    return from_string(value.get<std::string>(), source_name);
  }
  if (value.is_array()) {
    const std::string want = name.empty() ? "default" : name;
    std::string names;
    for (const auto& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        fail("{}: chat_template list entries must be {{\"name\": string, \"template\": string}}",
             source_name);
      }
      const std::string n = entry["name"].get<std::string>();
      if (n == want)
        return from_string(entry["template"].get<std::string>(), source_name + "#" + n);
      names += (names.empty() ? "" : ", ") + n;
    }
    fail("{}: no chat template named '{}' (available: {}); pick one of these names", source_name,
         want, names);
  }
  if (value.is_null()) {
    fail("{}: chat_template is missing or null; this model has no chat template", source_name);
  }
  fail("{}: chat_template must be a string or a list of {{name, template}}, got {}", source_name,
       value.type_name());
}

ChatTemplate ChatTemplate::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(jinja_path, ec)) return from_string(read_file(jinja_path), jinja_path.string());
  if (fs::exists(config_path, ec)) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
    if (cfg.is_object() && cfg.contains("chat_template")) {
      return from_config_value(cfg["chat_template"], config_path.string());
    }
  }
  fail("{}: no chat template: neither {} nor a \"chat_template\" key in {}; add one of them", dir,
       jinja_path.filename().string(), config_path.filename().string());
}

std::string ChatTemplate::render(const ChatTemplateInputs& in) const {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = in.documents;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  if (!in.bos_token.empty()) ctx["bos_token"] = in.bos_token;
  if (!in.eos_token.empty()) ctx["eos_token"] = in.eos_token;
  if (!in.extra.is_null()) {
    if (!in.extra.is_object()) {
      fail("{}: chat_template_kwargs must be a JSON object, got {}", source_name(),
           in.extra.type_name());
    }
    for (auto it = in.extra.begin(); it != in.extra.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        fail("{}: chat_template_kwargs may not set '{}'; pass it as its own field", source_name(),
             k);
      }
      ctx[k] = it.value();
    }
  }
  jinja::RenderOptions opts;
  opts.now_unix = in.now_unix;
  return tmpl_.render(ctx, opts);
}

nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) fail("messages must be a JSON array, got {}", messages.type_name());
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  size_t index = 0;
  for (const auto& m : messages) {
    if (!m.is_object()) fail("messages[{}] must be a JSON object, got {}", index, m.type_name());
    nlohmann::ordered_json msg = m;
    auto content = msg.find("content");
    if (content != msg.end() && content->is_array()) {
      bool text_only = true;
      std::string joined;
      for (const auto& part : *content) {
        if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
            part["text"].is_string()) {
          joined += part["text"].get<std::string>();
        } else {
          text_only = false;
          break;
        }
      }
      if (text_only) *content = joined;
    }
    auto calls = msg.find("tool_calls");
    if (calls != msg.end() && calls->is_array()) {
      for (auto& call : *calls) {
        nlohmann::ordered_json* fn =
            call.is_object() && call.contains("function") && call["function"].is_object()
                ? &call["function"]
                : (call.is_object() ? &call : nullptr);
        if (!fn || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
        auto parsed = nlohmann::ordered_json::parse((*fn)["arguments"].get<std::string>(), nullptr,
                                                    /*allow_exceptions=*/false);
        if (parsed.is_object()) (*fn)["arguments"] = std::move(parsed);
      }
    }
    out.push_back(std::move(msg));
    ++index;
  }
  return out;
}

}  // namespace tokenmill
