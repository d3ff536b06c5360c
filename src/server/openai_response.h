// OpenAI response writers: whole JSON bodies for chat.completion / text_completion, and the SSE
// chunk sequence for streams ("data: {chunk}\n\n" ... "data: [DONE]\n\n").
#pragma once

#include <string>
#include <vector>

#include "server/generation.h"

namespace tokenmill::server {

// Non-streaming bodies, after gen.done().
std::string openai_chat_body(const Generation& gen);
std::string openai_completion_body(const Generation& gen);

// Streams: one writer per request.
class OpenAIStreamWriter {
 public:
  explicit OpenAIStreamWriter(const Generation& gen);
  // SSE events for the deltas of one poll ("" when nothing to send).
  std::string deltas(const std::vector<ChoiceDelta>& ds);
  // After the last delta: the usage chunk (when asked for) and [DONE].
  std::string end();
  // An SSE comment that keeps the connection alive.
  static std::string keepalive() { return ": keepalive\n\n"; }

 private:
  const Generation& gen_;
  std::vector<bool> started_;  // per choice: the role chunk was sent
  std::vector<bool> echoed_;   // completions: the echoed prompt was sent
  long created_;
};

}  // namespace tokenmill::server
