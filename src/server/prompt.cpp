#include "server/prompt.h"

#include "server/api_error.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace tokenmill::server {

std::string render_chat_prompt(const ServedModel& model, const GenerationPlan& plan,
                               bool enable_thinking) {
  if (!model.chat_template) {
    throw ApiError(400,
                   fmt::format("model '{}' has no chat template (no chat_template.jinja or "
                               "tokenizer_config.json chat_template): use /v1/completions",
                               model.name),
                   "messages");
  }
  ChatTemplateInputs in;
  in.messages = normalize_messages(plan.messages);
  // tool_choice none: the model is not told about tools (OpenAI: it will not call any). A named
  // tool_choice shows the model only that tool.
  if (!plan.tools.is_null() && plan.tool_choice != "none") {
    if (plan.tool_choice == "function") {
      in.tools = nlohmann::ordered_json::array();
      for (const auto& t : plan.tools) {
        if (t["function"]["name"] == plan.tool_choice_name) in.tools.push_back(t);
      }
    } else {
      in.tools = plan.tools;
    }
  }
  in.add_generation_prompt = true;
  in.extra = plan.template_kwargs;
  in.extra["enable_thinking"] = enable_thinking;
  if (model.tokenizer) {
    in.bos_token = model.tokenizer->bos_token();
    in.eos_token = model.tokenizer->eos_token();
  }
  try {
    return model.chat_template->render(in);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template rejected the conversation: {}", e.what()),
                   "messages");
  }
}

}  // namespace tokenmill::server
